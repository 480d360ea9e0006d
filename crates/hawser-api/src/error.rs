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
    /// This controller is not the leader; `ApiError::leader_url` says which one is, when
    /// known. Nothing was done: the request can be sent to the leader as it is.
    NotLeader,
    /// No bearer token, a malformed one, or one the server does not know.
    Unauthorized,
    /// A valid token that may not call this route (an agent token on an admin route).
    Forbidden,
    Internal,
}

impl ErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::AlreadyExists | ErrorCode::Conflict | ErrorCode::StaleEpoch => 409,
            ErrorCode::InsufficientCapacity => 507,
            ErrorCode::Unavailable | ErrorCode::NotLeader => 503,
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
    /// With `not_leader`: the URL of the controller that leads, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_url: Option<String>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            leader_url: None,
        }
    }
    pub fn not_found(kind: &str, name: &str) -> Self {
        ApiError::new(ErrorCode::NotFound, format!("{kind} {name:?} not found"))
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::InvalidArgument, message)
    }
}

/// An error with all its causes, `outer: inner: ...`. HTTP clients' own messages hide the
/// useful part ("connection refused") in the source chain.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// At most `max` characters of `s` (on a character boundary), with "..." when cut, so a
/// stray HTML page in an error body does not flood the message.
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_includes_causes_and_truncate_respects_char_boundaries() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("request failed")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other("connection refused"));
        assert_eq!(e.to_string(), "request failed");
        assert_eq!(error_chain(&e), "request failed: connection refused");
        assert_eq!(truncate_chars("héllo", 2), "hé...");
        assert_eq!(truncate_chars("ok", 5), "ok");
    }
}
