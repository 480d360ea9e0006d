//! `POST /v1/peers/probe`: whether this node reaches other nodes' replica ports.
//!
//! The controller asks before it lifts a node's quorum-lost taint (`ha/` in the controller):
//! the node heartbeats, so the controller sees it fine, but only the node itself can tell
//! whether its paths to the replicas' nodes work again. A probe is what an engine's replica
//! connection starts with: TCP, then (with TLS) the mutual handshake in which the peer must
//! present its own node certificate. It opens no session, so the peer's replica server only
//! sees a connection that closed before Hello.

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
            let outcome = tokio::time::timeout(PEER_PROBE_TIMEOUT, reach(tls.as_deref(), &p)).await;
            let error = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(format!(
                    "no answer within {} ms",
                    PEER_PROBE_TIMEOUT.as_millis()
                )),
            };
            PeerReach {
                node: p.node,
                reached: error.is_none(),
                error,
            }
        }
    });
    Ok(futures_util::future::join_all(probes).await)
}

/// TCP to the peer's replica port, then with TLS the handshake that accepts only that node.
async fn reach(tls: Option<&NodeTls>, p: &PeerAddr) -> Result<(), String> {
    let tcp = TcpStream::connect(&p.replica_addr)
        .await
        .map_err(|e| format!("connect to {}: {e}", p.replica_addr))?;
    let Some(node) = tls else {
        return Ok(()); // a cluster without TLS: the port answering is all there is to see
    };
    let cfg = node
        .replica_client(&p.node)
        .map_err(|e| format!("no TLS configuration for node {}: {e:#}", p.node))?;
    conn::connect(tcp, cfg).await.map(drop).map_err(|e| {
        format!(
            "TLS handshake with node {} at {}: {e}",
            p.node, p.replica_addr
        )
    })
}
