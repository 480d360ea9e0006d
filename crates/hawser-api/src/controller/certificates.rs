//! Join tokens, a node's join, and certificates: a node's renewal and NBD clients'
//! (`/v1/join-tokens`, `/v1/join`, and the certificate routes of `api/certificates.rs`).

use serde::{Deserialize, Serialize};

/// `POST /v1/join-tokens` (admin): a token that lets new nodes join (TLS clusters).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateJoinToken {
    /// How long the token is valid, in seconds (default 3600, at most 7 days).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// How many nodes may join with it (default 1, at most 1000).
    #[serde(default)]
    pub uses: Option<u32>,
    /// Only a node of this name may join with it; and it may take the name over from a node
    /// that is still online (a reinstalled machine), which a token for any name may not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinTokenCreated {
    /// `hjt1.<id>.<secret>.<CA fingerprint>`: give it to the agent (`--join-token-file`).
    pub token: String,
    pub expires_ms: u64,
    pub uses: u32,
}

/// `POST /v1/join` (the join token authenticates): a node's first certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinNode {
    pub node: String,
    pub token: String,
    /// The node's public key: DER SubjectPublicKeyInfo, base64. The key never leaves it.
    pub public_key: String,
    /// DNS names and IP addresses clients dial the node by (its listen addresses and
    /// `--tls-san`), also put in its certificate for clients that check names (libnbd,
    /// Prometheus); at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// `POST /v1/nodes/{node}/certificate` (the node's current certificate authenticates): a
/// renewed certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewCertificate {
    /// As in [`JoinNode`].
    pub public_key: String,
    /// As in [`JoinNode`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeCertificate {
    /// The node's certificate then the CA's, PEM.
    pub chain_pem: String,
    /// The cluster's CA certificate, PEM.
    pub ca_pem: String,
    pub not_after_unix: u64,
}

/// `POST /v1/client-certificates` (admin): a certificate for an NBD client of some volumes
/// (`hawser volume client-cert`). The client makes its key and sends only the public half.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateClientCertificate {
    /// The volumes whose NBD exports it opens (1 to 64 existing volumes).
    pub volumes: Vec<String>,
    /// Only at this node's NBD port (an existing node); at any node's without it.
    #[serde(default)]
    pub node: Option<String>,
    /// How long it is valid, in seconds (default 86400, at most 30 days).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// As in [`JoinNode`].
    pub public_key: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCertificate {
    /// The client's certificate then the CA's, PEM.
    pub chain_pem: String,
    /// The cluster's CA certificate, PEM.
    pub ca_pem: String,
    pub not_after_unix: u64,
    /// The volumes it opens, sorted.
    pub volumes: Vec<String>,
    pub node: Option<String>,
}
