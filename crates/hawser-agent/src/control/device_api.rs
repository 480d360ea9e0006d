//! The node-local device API (see `hawser_api::agent::AttachDevice`) on a unix socket,
//! `<data-dir>/device.sock`, mode 0600 in a 0700 directory: only root (or the agent's user)
//! on this node reaches it. It is the only way to make a kernel block device of a volume,
//! because a device is local by nature: the CSI node service and `hawser device` call it.
//! Over it, a caller whose uid is not the agent's is refused even if the file mode was
//! loosened by hand.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use hawser_api::agent::{AttachDevice, Device};
use hawser_api::{ApiError, ErrorCode};
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::frontends::devices::{DeviceError, Devices, Tuning};
use crate::frontends::kernel::LinkError;
use crate::frontends::ublk::UblkError;

pub fn router(devices: Arc<Devices>) -> Router {
    Router::new()
        .route("/v1/devices", get(list).post(attach))
        .route("/v1/devices/{volume}", delete(detach))
        .with_state(devices)
}

fn error(e: DeviceError) -> Response {
    let code = match &e {
        DeviceError::NotAttachedHere(_) => ErrorCode::Conflict,
        DeviceError::NoDevice(_) => ErrorCode::NotFound,
        DeviceError::NotLive(_) => ErrorCode::Unavailable,
        DeviceError::UnknownFrontend(_) => ErrorCode::InvalidArgument,
        // The caller (the CSI node service) falls back to the next frontend.
        DeviceError::NoFrontend(_) => ErrorCode::Unavailable,
        // The ublk device limit: another frontend may still have room.
        DeviceError::Link {
            source: LinkError::Ublk(UblkError::Limit(_)),
            ..
        } => ErrorCode::Unavailable,
        DeviceError::Link { .. } | DeviceError::Record { .. } => ErrorCode::Internal,
    };
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(ApiError::new(code, e.to_string()))).into_response()
}

async fn attach(State(d): State<Arc<Devices>>, Json(req): Json<AttachDevice>) -> Response {
    if let Err(e) = hawser_api::validate_name("volume", &req.volume) {
        return (StatusCode::BAD_REQUEST, Json(e)).into_response();
    }
    let tuning = Tuning {
        ublk_queues: req.ublk_queues,
        ublk_queue_depth: req.ublk_queue_depth,
    };
    match d.attach_tuned(&req.volume, &req.frontend, tuning).await {
        Ok(dev) => Json::<Device>(dev).into_response(),
        Err(e) => error(e),
    }
}

async fn detach(State(d): State<Arc<Devices>>, UrlPath(volume): UrlPath<String>) -> Response {
    if let Err(e) = hawser_api::validate_name("volume", &volume) {
        return (StatusCode::BAD_REQUEST, Json(e)).into_response();
    }
    match d.detach(&volume).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error(e),
    }
}

async fn list(State(d): State<Arc<Devices>>) -> Json<Vec<Device>> {
    Json(d.list().await)
}

/// Refuses a caller whose uid is not ours (peer credentials of the unix connection).
async fn same_user(req: Request, next: Next) -> Response {
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    let allowed = req
        .extensions()
        .get::<axum::extract::connect_info::ConnectInfo<UdsPeer>>()
        .is_some_and(|p| p.0.uid == Some(me));
    if !allowed {
        let e = ApiError::new(
            ErrorCode::Forbidden,
            "the device API serves only the agent's own user".to_owned(),
        );
        return (StatusCode::FORBIDDEN, Json(e)).into_response();
    }
    next.run(req).await
}

/// The peer of a unix connection.
#[derive(Clone, Debug)]
pub struct UdsPeer {
    uid: Option<u32>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, UnixListener>>
    for UdsPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, UnixListener>) -> UdsPeer {
        UdsPeer {
            uid: stream.io().peer_cred().ok().map(|c| c.uid()),
        }
    }
}

/// Bind `path` (replacing a stale socket), mode 0600.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use anyhow::Context as _;
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)
        .with_context(|| format!("bind the device API socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("make the device API socket {} mode 0600", path.display()))?;
    Ok(l)
}

/// Serve the device API on `listener` until `stop`.
pub async fn serve(listener: UnixListener, devices: Arc<Devices>, mut stop: watch::Receiver<bool>) {
    let app = router(devices).layer(axum::middleware::from_fn(same_user));
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<UdsPeer>(),
    )
    .with_graceful_shutdown(async move {
        let _ = stop.wait_for(|&s| s).await;
    })
    .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "device API failed");
    }
}
