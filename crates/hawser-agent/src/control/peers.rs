//! `POST /v1/peers/probe`: whether this node reaches other nodes' replica ports.
//!
//! The controller asks before it lifts a node's quorum-lost taint (`ha/` in the controller):
//! the node heartbeats, so the controller sees it fine, but only the node itself can tell
//! whether its paths to the replicas' nodes work again. A probe is what an engine's replica
//! connection starts with: TCP, then (with TLS) the mutual handshake in which the peer must
//! present its own node certificate. It opens no session, so the peer's replica server only
//! sees a connection that closed before Hello.
//!
//! The controller also asks the peers of a node that stopped heartbeating, to fail it over
//! before its timeout only if its host is silent to them too (`ha/confirm.rs` there). So an
//! answer that did not reach its peer says whether the peer's host answered at all: a
//! refused connection is an agent down on a live host (restarting, perhaps: a pause, not a
//! reason to move pods), no answer is a dead host or a cut link.

use std::sync::Arc;

use hawser_api::agent::{PeerAddr, PeerReach, ProbePeers};
use hawser_api::ApiError;
use tokio::net::TcpStream;

use crate::constants::{PEER_PROBE_MAX_PEERS, PEER_PROBE_TIMEOUT};
use crate::tls::conn;
use crate::tls::node::NodeTls;

/// Probes every peer at once; `tls` is this node's certificate (`None`: a cluster without
/// TLS).
pub async fn probe(tls: Option<Arc<NodeTls>>, req: ProbePeers) -> Result<Vec<PeerReach>, ApiError> {
    if req.peers.len() > PEER_PROBE_MAX_PEERS {
        return Err(ApiError::invalid(format!(
            "{} peers to probe: at most {PEER_PROBE_MAX_PEERS} in one call",
            req.peers.len()
        )));
    }
    let probes = req.peers.into_iter().map(|p| {
        let tls = tls.clone();
        async move {
            // Whether the TCP connection was made, for a timeout in the TLS handshake.
            let connected = std::sync::atomic::AtomicBool::new(false);
            let outcome =
                tokio::time::timeout(PEER_PROBE_TIMEOUT, reach(tls.as_deref(), &p, &connected))
                    .await;
            let (error, host_answered) = match outcome {
                Ok(Ok(())) => (None, None),
                Ok(Err(e)) => (Some(e.message), e.host_answered),
                Err(_) => (
                    Some(format!(
                        "no answer within {} ms",
                        PEER_PROBE_TIMEOUT.as_millis()
                    )),
                    Some(connected.load(std::sync::atomic::Ordering::Relaxed)),
                ),
            };
            PeerReach {
                node: p.node,
                reached: error.is_none(),
                error,
                host_answered,
            }
        }
    });
    Ok(futures_util::future::join_all(probes).await)
}

/// Why a peer was not reached, and whether its host answered ([`PeerReach::host_answered`]).
struct Missed {
    message: String,
    host_answered: Option<bool>,
}

/// TCP to the peer's replica port, then with TLS the handshake that accepts only that node;
/// sets `connected` once the TCP connection is made.
async fn reach(
    tls: Option<&NodeTls>,
    p: &PeerAddr,
    connected: &std::sync::atomic::AtomicBool,
) -> Result<(), Missed> {
    let tcp = TcpStream::connect(&p.replica_addr)
        .await
        .map_err(|e| Missed {
            host_answered: host_answered(&e),
            message: format!("connect to {}: {e}", p.replica_addr),
        })?;
    connected.store(true, std::sync::atomic::Ordering::Relaxed);
    let Some(node) = tls else {
        return Ok(()); // a cluster without TLS: the port answering is all there is to see
    };
    let answered = |message: String| Missed {
        message,
        host_answered: Some(true),
    };
    let cfg = node
        .replica_client(&p.node)
        .map_err(|e| answered(format!("no TLS configuration for node {}: {e:#}", p.node)))?;
    conn::connect(tcp, cfg).await.map(drop).map_err(|e| {
        answered(format!(
            "TLS handshake with node {} at {}: {e}",
            p.node, p.replica_addr
        ))
    })
}

/// What a failed connect says of the peer's host: a refusal or reset comes from its kernel
/// (up); "unreachable" from the network (a dead host, or no route); anything else is not
/// known.
fn host_answered(e: &std::io::Error) -> Option<bool> {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused | ConnectionReset => Some(true),
        HostUnreachable | NetworkUnreachable | TimedOut => Some(false),
        _ => None,
    }
}
