//! The JSON error body every Hawser API returns with a 4xx/5xx status.

use serde::{Deserialize, Serialize};

/// Stable, machine-readable error codes. The HTTP status is derived from the code in one place
/// ([`ErrorCode::http_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    /// The object changed under us (compare-and-swap lost) or is in the wrong state.
    Conflict,
    /// Not enough nodes or pool space to place the replicas.
    InsufficientCapacity,
    /// A node or agent did not answer.
    Unavailable,
    /// The request's epoch is older than the volume's: the caller was fenced.
    StaleEpoch,
    Internal,
}

impl ErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::NotFound => 404,
            ErrorCode::AlreadyExists | ErrorCode::Conflict | ErrorCode::StaleEpoch => 409,
            ErrorCode::InsufficientCapacity => 507,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }
    pub fn not_found(kind: &str, name: &str) -> Self {
        ApiError::new(ErrorCode::NotFound, format!("{kind} {name:?} not found"))
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::InvalidArgument, message)
    }
}
