//! The HTTP server of the controller's REST API and the agents' admin API (HTTP/1.1), with
//! limits a slow or hostile client cannot get around:
//!
//! - connections: at most [`HttpLimits::max_connections`], [`HttpLimits::max_per_peer`] from
//!   one IP address; more are closed at once;
//! - headers: a request's headers must arrive within [`HttpLimits::header_read_timeout`]
//!   (also the longest a kept-alive connection may sit idle between requests);
//! - bodies: read in full before any handler runs, at most [`HttpLimits::max_body_bytes`],
//!   within [`HttpLimits::body_read_timeout`], and only [`HttpLimits::bodies_in_flight`] at
//!   once (the memory budget: bodies in memory never exceed their product); 413, 408 or 503
//!   otherwise.
//!
//! Refusals are the APIs' JSON error bodies (`hawser_api::error::ApiError`).
//!
//! With a TLS configuration the handshake must also finish within the header-read timeout,
//! and every request carries the [`Transport`] it came over (the peer its certificate names)
//! in its extensions, for the API to decide what that peer may do.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use hawser_api::error::{ApiError, ErrorCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::conns::ConnLimits;

/// How a request reached the server; in every request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Plain TCP (`--insecure`).
    Plain,
    /// TLS; the principal the client's verified certificate names, if it sent one.
    Tls { peer: Option<hawser_tls::Peer> },
}

#[derive(Clone, Debug)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub max_per_peer: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_body_bytes: usize,
    pub bodies_in_flight: usize,
}

impl Default for HttpLimits {
    /// Room for a cluster's agents and CLIs (agents keep one or two connections each);
    /// slow clients are cut off after 20 s; bodies are small JSON documents.
    fn default() -> Self {
        HttpLimits {
            max_connections: 512,
            max_per_peer: 64,
            header_read_timeout: Duration::from_secs(20),
            body_read_timeout: Duration::from_secs(20),
            max_body_bytes: 1 << 20,
            bodies_in_flight: 32,
        }
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown` completes; then stops
/// accepting and gives the open connections up to 10 s to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<Arc<hawser_tls::rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let conns = ConnLimits::new(limits.max_connections, limits.max_per_peer);
    let bodies = Arc::new(Semaphore::new(limits.bodies_in_flight.max(1)));
    let limits = Arc::new(limits);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let permit = match conns.admit(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                tracing::debug!(%peer, "HTTP connection refused: {why}");
                continue;
            }
        };
        let (app, limits, bodies) = (app.clone(), limits.clone(), bodies.clone());
        let Some(tls) = tls.clone() else {
            let conn = connection(app, limits, bodies, peer, Transport::Plain, stream);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "HTTP connection ended");
                }
                drop(permit);
            });
            continue;
        };
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
            let stream = match tokio::time::timeout(limits.header_read_timeout, handshake).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let transport = Transport::Tls {
                peer: hawser_tls::client_peer(stream.get_ref().1.peer_certificates()),
            };
            let conn = connection(app, limits, bodies, peer, transport, stream);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "HTTP connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => {
            tracing::warn!("HTTP connections still open after 10 s of shutdown; dropping them");
        }
    }
    Ok(())
}

/// One HTTP/1.1 connection over `stream`.
fn connection<S>(
    app: Router,
    limits: Arc<HttpLimits>,
    bodies: Arc<Semaphore>,
    peer: SocketAddr,
    transport: Transport,
    stream: S,
) -> impl hyper_util::server::graceful::GracefulConnection<Error = hyper::Error> + Send
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header_read_timeout = limits.header_read_timeout;
    let svc = hyper::service::service_fn(move |req| {
        handle(
            app.clone(),
            limits.clone(),
            bodies.clone(),
            peer,
            transport.clone(),
            req,
        )
    });
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .serve_connection(TokioIo::new(stream), svc)
}

async fn handle(
    app: Router,
    limits: Arc<HttpLimits>,
    bodies: Arc<Semaphore>,
    peer: SocketAddr,
    transport: Transport,
    req: hyper::Request<Incoming>,
) -> Result<Response, Infallible> {
    let (parts, body) = req.into_parts();
    let bytes = if body.is_end_stream() {
        Bytes::new()
    } else {
        match read_body(body, &limits, &bodies).await {
            Ok(b) => b,
            Err((status, e)) => {
                // Debug, not warn: a misbehaving client must not be able to flood the logs.
                tracing::debug!(%peer, method = %parts.method, path = %parts.uri.path(), "{}", e.message);
                return Ok(error_response(status, e));
            }
        }
    };
    let mut req = axum::extract::Request::from_parts(parts, Body::from(bytes));
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    req.extensions_mut().insert(transport);
    Ok(app.oneshot(req).await.unwrap_or_else(|e| match e {}))
}

/// The body, or the status and error to answer instead: 413 past the size limit, 408 when
/// it is not all there in time, 503 when the budget of bodies in flight stays full, else 400.
async fn read_body(
    body: Incoming,
    limits: &HttpLimits,
    bodies: &Arc<Semaphore>,
) -> Result<Bytes, (StatusCode, ApiError)> {
    let timeout = limits.body_read_timeout;
    let busy = |m: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            ApiError::new(ErrorCode::Unavailable, m),
        )
    };
    let _slot = tokio::time::timeout(timeout, bodies.clone().acquire_owned())
        .await
        .map_err(|_| busy("too many request bodies in flight; try again"))?
        .map_err(|_| busy("shutting down"))?;
    let max = limits.max_body_bytes;
    let invalid = |status, m: String| (status, ApiError::new(ErrorCode::InvalidArgument, m));
    match tokio::time::timeout(timeout, Limited::new(body, max).collect()).await {
        Err(_) => Err(invalid(
            StatusCode::REQUEST_TIMEOUT,
            format!("request body not received within {} s", timeout.as_secs()),
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(invalid(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {max} bytes"),
        )),
        Ok(Err(e)) => Err(invalid(
            StatusCode::BAD_REQUEST,
            format!("bad request body: {e}"),
        )),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

fn error_response(status: StatusCode, e: ApiError) -> Response {
    let mut r = (status, axum::Json(e)).into_response();
    // The body may not have been read to its end: the connection cannot be reused.
    r.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    r
}
