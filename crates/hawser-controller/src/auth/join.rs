//! How a node gets its certificate (issue 16.a): join tokens (`POST /v1/join-tokens`,
//! admin), the join itself (`POST /v1/join`, one use of a token or the agent token buys a
//! certificate for the named node) and renewal with the current certificate
//! (`POST /v1/nodes/{node}/certificate`); the routes are `api/certificates.rs`. The CA that
//! signs is `auth::tls`; join tokens live in the store (`auth/join/<id>`), which keeps only
//! their secret's digest.

use hawser_api::auth;
use hawser_api::controller::{
    CreateJoinToken, JoinNode, JoinTokenCreated, NodeCertificate, RenewCertificate,
};
use hawser_listen::Transport;
use hawser_store::{get_json, put_json, Expect, StoreError};
use hawser_tls::JoinToken;
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::now_ms;

const JOIN_PREFIX: &str = "auth/join/";
const DEFAULT_JOIN_TTL_SECS: u64 = 3600;
const MAX_JOIN_TTL_SECS: u64 = 7 * 24 * 3600;
const MAX_JOIN_USES: u32 = 1000;

/// A join token as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinRecord {
    secret_sha256: String,
    expires_ms: u64,
    uses_left: u32,
    /// The only node name it joins (`hawser cluster join-token --node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<String>,
}

/// `POST /v1/join-tokens`.
pub async fn create_join_token(
    st: &AppState,
    req: CreateJoinToken,
) -> Result<JoinTokenCreated, ControllerError> {
    let tls = st.required_tls()?;
    let ttl = req.ttl_secs.unwrap_or(DEFAULT_JOIN_TTL_SECS);
    let uses = req.uses.unwrap_or(1);
    if ttl == 0 || ttl > MAX_JOIN_TTL_SECS {
        return Err(ControllerError::invalid(format!(
            "ttl_secs {ttl}: use 1 to {MAX_JOIN_TTL_SECS}"
        )));
    }
    if uses == 0 || uses > MAX_JOIN_USES {
        return Err(ControllerError::invalid(format!(
            "uses {uses}: use 1 to {MAX_JOIN_USES}"
        )));
    }
    if let Some(n) = &req.node {
        hawser_api::validate_name("node", n)?;
    }
    let token = JoinToken::generate(tls.ca().cert_der());
    let record = JoinRecord {
        secret_sha256: auth::digest_hex(&auth::digest(&token.secret)),
        expires_ms: now_ms().saturating_add(ttl.saturating_mul(1000)),
        uses_left: uses,
        node: req.node.clone(),
    };
    let store = st.records.store();
    put_json(
        &*store,
        &format!("{JOIN_PREFIX}{}", token.id),
        &record,
        Expect::Absent,
    )
    .await?;
    tracing::info!(id = %token.id, ttl, uses, node = ?req.node, "join token created");
    Ok(JoinTokenCreated {
        token: token.to_string(),
        expires_ms: record.expires_ms,
        uses,
    })
}

/// `POST /v1/join`: one use of a join token buys a certificate for the named node. The
/// cluster's agent token is also taken, and not used up: it is the standing bootstrap
/// secret of installations that hand every node the same credentials (the Helm chart's
/// Secret, as k3s's node token), where the node learns the CA from a file, not the token.
pub async fn join(
    st: &AppState,
    transport: Option<&Transport>,
    req: JoinNode,
) -> Result<NodeCertificate, ControllerError> {
    let tls = st.required_tls()?;
    if !matches!(transport, Some(Transport::Tls { .. })) {
        return Err(ControllerError::invalid("join over TLS only"));
    }
    hawser_api::validate_name("node", &req.node)?;
    // Every failure of the token itself says the same: nothing to probe.
    let refused = || ControllerError::Unauthorized {
        reason: "the join token is not valid (unknown, used up or expired)".into(),
    };
    let Some(token) = JoinToken::parse(&req.token) else {
        if st.tokens.is_agent_token(&req.token) {
            name_is_free(st, &req.node, None).await?;
            let cert = tls.issue_node(&req.node, &req.public_key, &req.names)?;
            tracing::info!(node = %req.node, "node joined the cluster with the agent token");
            return Ok(cert);
        }
        return Err(refused());
    };
    let store = st.records.store();
    let key = format!("{JOIN_PREFIX}{}", token.id);
    for _ in 0..5 {
        let Some((mut rec, version)) = get_json::<JoinRecord>(&*store, &key).await? else {
            return Err(refused());
        };
        let stored = auth::parse_digest_hex(&rec.secret_sha256).ok_or_else(refused)?;
        let matches = auth::digests_equal(&auth::digest(&token.secret), &stored);
        if !matches || rec.expires_ms < now_ms() || rec.uses_left == 0 {
            return Err(refused());
        }
        name_is_free(st, &req.node, rec.node.as_deref()).await?;
        // Issue first (it can fail on a bad key), then spend the use.
        let cert = tls.issue_node(&req.node, &req.public_key, &req.names)?;
        rec.uses_left -= 1;
        let spent = if rec.uses_left == 0 {
            store
                .delete(&key, Expect::Version(version))
                .await
                .map(|_| ())
        } else {
            put_json(&*store, &key, &rec, Expect::Version(version))
                .await
                .map(|_| ())
        };
        match spent {
            Ok(()) => {
                tracing::info!(node = %req.node, token = %token.id, "node joined the cluster");
                return Ok(cert);
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ControllerError::Contention { key, retries: 5 })
}

/// Whether a node may join as `node` with a token bound to `bound_to` (if any). A token bound
/// to another name is refused. A name whose node is online is held by another machine: a
/// second registration would take its identity while it runs, so only a token bound to that
/// name (an operator's explicit choice, as for a reinstalled machine) may take it over.
async fn name_is_free(
    st: &AppState,
    node: &str,
    bound_to: Option<&str>,
) -> Result<(), ControllerError> {
    if let Some(b) = bound_to {
        if b != node {
            return Err(ControllerError::ForbiddenFor {
                reason: format!("this join token is for node {b}, not {node}"),
            });
        }
        return Ok(());
    }
    let online = st
        .records
        .node(node)
        .await?
        .is_some_and(|n| n.is_online(now_ms(), st.node_timeout_ms));
    if online {
        return Err(ControllerError::Refused {
            message: format!(
                "node {node} is registered and online: another machine holds the name. Stop \
                 it (the name is free once it is offline), or join with a token made for this \
                 name: `hawser cluster join-token --node {node}`"
            ),
        });
    }
    Ok(())
}

/// `POST /v1/nodes/{node}/certificate`: a node renews its certificate with its current one.
pub fn renew(
    st: &AppState,
    principal: &Principal,
    node: &str,
    req: RenewCertificate,
) -> Result<NodeCertificate, ControllerError> {
    let tls = st.required_tls()?;
    if !matches!(principal, Principal::Node(n) if n == node) {
        return Err(ControllerError::ForbiddenFor {
            reason: format!("only node {node}, with its current certificate, renews it"),
        });
    }
    let cert = tls.issue_node(node, &req.public_key, &req.names)?;
    tracing::info!(%node, "renewed the node's certificate");
    Ok(cert)
}
