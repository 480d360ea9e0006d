//! The NBD frontend's listeners: accept loops for TCP and unix sockets and the life of one
//! connection (handshake, then transmission), each in a tracing span with peer and export.
//!
//! Shutdown is a `watch` channel: once it reads `true` (or its sender is dropped) the
//! listeners stop accepting, connections still haggling are closed, and connections in
//! transmission stop reading requests, answer the ones in flight, and close. `serve_tcp` and
//! `serve_unix` return when every connection has finished.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, error, field, info, info_span, warn, Instrument, Span};

use crate::frontends::block::ExportRegistry;
use crate::nbd::handshake::{
    greet, haggle, negotiate, Access, Haggled, HandshakeError, Negotiated, Security,
};
use crate::nbd::transmission::{self, shutdown_requested, TransmissionError};
use crate::observe::refusals::RefusalMetrics;

/// Connections one listener serves at once. At the bound it stops accepting, and new clients
/// wait in the kernel's backlog; each time it gets there, that is counted and logged
/// (`observe/refusals.rs`), so a client left waiting is not left unexplained.
pub const MAX_CONNECTIONS_PER_LISTENER: usize = 1024;
/// Time a client has from connecting to choosing an export. Bounds the connections an idle
/// or hostile peer can pin in the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after a failed accept (EMFILE, ENFILE, ...) so the loop does not spin while the
/// process is out of descriptors.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Why one connection ended abnormally. Logged at debug where the connection task ends: a
/// misbehaving client must not be able to flood the logs.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("handshake failed: {0}")]
    Handshake(#[from] HandshakeError),
    #[error("no export chosen within {HANDSHAKE_TIMEOUT:?}")]
    HandshakeTimeout,
    #[error("transmission failed: {0}")]
    Transmission(#[from] TransmissionError),
}

/// A listener's TLS: the configuration (`NodeTls::nbd_server`: a client certificate of the
/// cluster is required) and the node it serves, which a client certificate limited to one
/// node must name.
#[derive(Clone)]
pub struct NbdTls {
    acceptor: tokio_rustls::TlsAcceptor,
    node: String,
}

impl NbdTls {
    pub fn new(config: Arc<hawser_tls::rustls::ServerConfig>, node: &str) -> NbdTls {
        NbdTls {
            acceptor: tokio_rustls::TlsAcceptor::from(config),
            node: node.to_owned(),
        }
    }
}

/// Serve NBD on a bound TCP listener until `shutdown`. With `tls`, the listener requires it:
/// a client must STARTTLS and present a certificate `tls` accepts before anything else, and
/// then opens only the exports its certificate names.
pub async fn serve_tcp(
    listener: TcpListener,
    registry: Arc<dyn ExportRegistry>,
    tls: Option<NbdTls>,
    refusals: RefusalMetrics,
    shutdown: watch::Receiver<bool>,
) {
    let listener = &listener;
    let accept = move || async move {
        let (stream, peer) = listener.accept().await?;
        // Replies are small and latency-bound; Nagle would hold them back.
        stream.set_nodelay(true)?;
        Ok((stream, peer.to_string()))
    };
    let limit = Limit::new("tcp", MAX_CONNECTIONS_PER_LISTENER, refusals);
    accept_loop(accept, registry, tls, limit, shutdown).await;
}

/// Serve NBD on a bound unix-domain listener until `shutdown`.
pub async fn serve_unix(
    listener: UnixListener,
    registry: Arc<dyn ExportRegistry>,
    refusals: RefusalMetrics,
    shutdown: watch::Receiver<bool>,
) {
    let limit = Limit::new("unix", MAX_CONNECTIONS_PER_LISTENER, refusals);
    serve_unix_within(listener, registry, limit, shutdown).await;
}

/// A listener's bound on its connections, and where reaching it is reported.
struct Limit {
    /// `tcp` or `unix`, the metric's label.
    listener: &'static str,
    max: usize,
    refusals: RefusalMetrics,
}

impl Limit {
    fn new(listener: &'static str, max: usize, refusals: RefusalMetrics) -> Limit {
        Limit {
            listener,
            max,
            refusals,
        }
    }
}

async fn serve_unix_within(
    listener: UnixListener,
    registry: Arc<dyn ExportRegistry>,
    limit: Limit,
    shutdown: watch::Receiver<bool>,
) {
    let listener = &listener;
    let accept = move || async move {
        let (stream, _) = listener.accept().await?;
        // Unix clients are almost always unnamed; the credentials say who they are.
        let peer = match stream.peer_cred() {
            Ok(cred) => format!("unix:pid={}", cred.pid().unwrap_or(0)),
            Err(_) => "unix".to_owned(),
        };
        Ok((stream, peer))
    };
    accept_loop(accept, registry, None, limit, shutdown).await;
}

async fn accept_loop<S, F, Fut>(
    mut accept: F,
    registry: Arc<dyn ExportRegistry>,
    tls: Option<NbdTls>,
    limit: Limit,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = io::Result<(S, String)>>,
{
    let permits = Arc::new(Semaphore::new(limit.max));
    let mut connections = JoinSet::new();
    loop {
        while let Some(done) = connections.try_join_next() {
            report_task_end(done);
        }
        if permits.available_permits() == 0 {
            limit.refusals.listener_full(limit.listener, limit.max);
        }
        let permit = tokio::select! {
            biased;
            () = shutdown_requested(&mut shutdown) => break,
            p = Arc::clone(&permits).acquire_owned() => p,
        };
        // The semaphore is never closed.
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            biased;
            () = shutdown_requested(&mut shutdown) => break,
            r = accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                warn!(error = %e, "NBD accept failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        let span = info_span!("nbd", peer = %peer, export = field::Empty);
        let (registry, shutdown, tls) = (Arc::clone(&registry), shutdown.clone(), tls.clone());
        connections.spawn(
            async move {
                debug!("NBD client connected");
                match serve_connection(stream, registry, tls, shutdown).await {
                    Ok(()) => debug!("NBD client disconnected"),
                    Err(e) => debug!(error = %e, "NBD connection closed"),
                }
                drop(permit);
            }
            .instrument(span),
        );
    }
    info!(
        open = connections.len(),
        "NBD listener stopped accepting; draining connections"
    );
    while let Some(done) = connections.join_next().await {
        report_task_end(done);
    }
}

fn report_task_end(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        if e.is_panic() {
            error!(error = %e, "NBD connection task panicked");
        }
    }
}

/// A connection once an export is chosen: on the stream it was accepted on, or inside TLS.
enum Chosen<S> {
    Plain(S, Negotiated),
    Tls(Box<tokio_rustls::server::TlsStream<S>>, Negotiated),
}

/// Serve one NBD client on an already connected stream: handshake (with STARTTLS when `tls`
/// is given, which the client must then use), then transmission. Exposed so that other
/// transports (a socketpair, a test duplex) can reuse it.
pub async fn serve_connection<S>(
    stream: S,
    registry: Arc<dyn ExportRegistry>,
    tls: Option<NbdTls>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(stream, &*registry, tls));
    let chosen = tokio::select! {
        biased;
        () = shutdown_requested(&mut shutdown) => return Ok(()),
        r = handshake => r.map_err(|_| ConnectionError::HandshakeTimeout)??,
    };
    let Some(chosen) = chosen else {
        debug!("client aborted the handshake");
        return Ok(());
    };
    match chosen {
        Chosen::Plain(stream, n) => transmit(stream, n, shutdown).await,
        Chosen::Tls(stream, n) => transmit(*stream, n, shutdown).await,
    }
}

async fn handshake<S>(
    mut stream: S,
    registry: &dyn ExportRegistry,
    tls: Option<NbdTls>,
) -> Result<Option<Chosen<S>>, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(tls) = tls else {
        return Ok(negotiate(&mut stream, registry)
            .await?
            .map(|n| Chosen::Plain(stream, n)));
    };
    let no_zeroes = greet(&mut stream).await?;
    // Before STARTTLS nothing is admitted: every option but STARTTLS and ABORT is refused.
    let none = Access::Certificate {
        here: tls.node.clone(),
        peer: None,
    };
    match haggle(
        &mut stream,
        registry,
        &none,
        Security::TlsRequired,
        no_zeroes,
    )
    .await?
    {
        Haggled::StartTls => {}
        Haggled::Aborted | Haggled::Export(_) => return Ok(None),
    }
    let mut stream = tls
        .acceptor
        .accept(stream)
        .await
        .map_err(HandshakeError::Tls)?;
    let peer = hawser_tls::client_peer(stream.get_ref().1.peer_certificates());
    debug!(peer = ?peer, "NBD client authenticated");
    let access = Access::Certificate {
        here: tls.node,
        peer,
    };
    Ok(
        match haggle(&mut stream, registry, &access, Security::Tls, no_zeroes).await? {
            Haggled::Export(n) => Some(Chosen::Tls(Box::new(stream), n)),
            Haggled::Aborted | Haggled::StartTls => None,
        },
    )
}

async fn transmit<S>(
    stream: S,
    negotiated: Negotiated,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    Span::current().record("export", negotiated.name.as_str());
    debug!(size = negotiated.device.size(), "NBD transmission started");
    transmission::serve(stream, negotiated.device, shutdown).await?;
    Ok(())
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
