//! Types of Hawser's REST APIs: the controller's (used by the CLI, agents and tests) and the
//! agent's admin API (used by the controller). JSON over HTTP; unknown fields are refused so
//! a typo in a request is an error, not a silently ignored setting.

pub mod agent;
pub mod auth;
pub mod backup;
#[cfg(feature = "client")]
pub mod client;
pub mod controller;
#[cfg(feature = "client")]
pub mod device_client;
pub mod error;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod pool;
pub mod qos;
pub mod quorum_loss;
pub mod replica_state;
pub mod secret;
pub mod size;
pub mod time;
pub mod uid;

pub use error::{ApiError, ErrorCode};
pub use qos::{Qos, QosField, QosPatch};
pub use secret::{KeyCheck, Secret, WrappedKey};
pub use size::{format_size, parse_bytes, parse_size, SizeError};

/// How long HTTP clients of Hawser's APIs keep an idle connection for reuse: less than the
/// servers' header-read timeout (`hawser_listen::HttpLimits`, 20 s), which also closes
/// kept-alive connections that sit idle, so a client never reuses a connection just as the
/// server closes it.
pub const CLIENT_POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Default controller address (loopback only; TLS, as a controller serves by default).
pub const DEFAULT_CONTROLLER_URL: &str = "https://127.0.0.1:9400";

/// Checks a user-chosen name (volume, node, pool): 1-63 characters of `[a-z0-9-]`, starting
/// with a letter or digit, like a Kubernetes DNS label, so it is safe in paths and URIs.
pub fn validate_name(kind: &str, name: &str) -> Result<(), ApiError> {
    validate_name_up_to(kind, name, 63)
}

/// [`validate_name`] for names that may be longer (a backup's: its volume's and a time).
pub fn validate_name_up_to(kind: &str, name: &str, max: usize) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::InvalidArgument,
            format!(
                "invalid {kind} name {name:?}: use 1-{max} characters a-z, 0-9 and '-', \
                 not starting with '-'"
            ),
        ))
    }
}
