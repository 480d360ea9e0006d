//! The controller's REST API from async code: the shared blocking client run on tokio's
//! blocking pool, and its errors turned into gRPC statuses that say what to do.

use std::sync::Arc;

use hawser_api::client::{Client, ClientError};
use hawser_api::ErrorCode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Code, Status};

/// One client for the controller API, shared by every request.
#[derive(Clone)]
pub struct Api {
    client: Arc<Client>,
}

impl Api {
    pub fn new(client: Arc<Client>) -> Api {
        Api { client }
    }

    pub async fn get<T: DeserializeOwned + Send + 'static>(&self, path: String) -> ApiResult<T> {
        let c = self.client.clone();
        blocking(move || c.get(&path)).await
    }

    pub async fn post<B, T>(&self, path: String, body: B) -> ApiResult<T>
    where
        B: Serialize + Send + 'static,
        T: DeserializeOwned + Send + 'static,
    {
        let c = self.client.clone();
        blocking(move || c.post(&path, &body)).await
    }

    pub async fn delete(&self, path: String) -> ApiResult<()> {
        let c = self.client.clone();
        blocking(move || c.delete(&path)).await
    }
}

pub type ApiResult<T> = Result<T, ClientError>;

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ClientError::Client(format!("request task failed: {e}"))))
}

/// Whether the controller answered "not found".
pub fn is_not_found(e: &ClientError) -> bool {
    matches!(e, ClientError::Api(a) if a.code == ErrorCode::NotFound)
}

/// The gRPC status for a controller API error; `what` says what was being done
/// ("create volume pvc-1"). One place maps Hawser's error codes to CSI's.
pub fn status(what: &str, e: ClientError) -> Status {
    let code = match &e {
        ClientError::Api(a) => match a.code {
            ErrorCode::InvalidArgument => Code::InvalidArgument,
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::AlreadyExists => Code::AlreadyExists,
            // Wrong state (attached, being created) or a lost compare-and-swap: the CO retries.
            ErrorCode::Conflict => Code::FailedPrecondition,
            ErrorCode::StaleEpoch => Code::Aborted,
            ErrorCode::InsufficientCapacity => Code::ResourceExhausted,
            ErrorCode::Unavailable | ErrorCode::NotLeader => Code::Unavailable,
            ErrorCode::Unauthorized => Code::Unauthenticated,
            ErrorCode::Forbidden => Code::PermissionDenied,
            ErrorCode::Internal => Code::Internal,
        },
        ClientError::Unreachable { .. } => Code::Unavailable,
        ClientError::BadResponse { .. } | ClientError::Client(_) => Code::Internal,
        ClientError::Token(_) => Code::Unauthenticated,
    };
    let hint = match code {
        Code::Unavailable => {
            "; the Hawser controller (or the agent it asked) is down or unreachable, the \
             request is retried"
        }
        Code::Unauthenticated => "; check the API token given to `hawser csi` (--token-file)",
        _ => "",
    };
    Status::new(code, format!("{what}: {e}{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_api::ApiError;

    #[test]
    fn codes_map_to_csi_codes_and_name_the_operation() {
        let api = |code| ClientError::Api(ApiError::new(code, "m"));
        for (code, want) in [
            (ErrorCode::InvalidArgument, Code::InvalidArgument),
            (ErrorCode::NotFound, Code::NotFound),
            (ErrorCode::AlreadyExists, Code::AlreadyExists),
            (ErrorCode::Conflict, Code::FailedPrecondition),
            (ErrorCode::InsufficientCapacity, Code::ResourceExhausted),
            (ErrorCode::Unavailable, Code::Unavailable),
            (ErrorCode::NotLeader, Code::Unavailable),
            (ErrorCode::Internal, Code::Internal),
        ] {
            let s = status("create volume v", api(code));
            assert_eq!(s.code(), want, "{code:?}");
            assert!(
                s.message().starts_with("create volume v: "),
                "{}",
                s.message()
            );
        }
        let down = ClientError::Unreachable {
            url: "http://127.0.0.1:1".into(),
            reason: "connection refused".into(),
        };
        let s = status("delete volume v", down);
        assert_eq!(s.code(), Code::Unavailable);
        assert!(
            s.message().contains("connection refused"),
            "{}",
            s.message()
        );
    }
}
