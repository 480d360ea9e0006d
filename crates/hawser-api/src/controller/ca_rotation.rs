//! The cluster CA's rotation (`/v1/cluster/ca-rotation`): its steps and what each left.

use serde::{Deserialize, Serialize};

/// The cluster's CAs as a rotation has left them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterCa {
    /// The CA certificates to trust, PEM (one, or two during a rotation).
    pub trust_pem: String,
    /// SHA-256 (hex) of the CA that issues certificates now.
    pub issuer_sha256: String,
}

/// A step of `hawser cluster rotate-ca` (`POST /v1/cluster/ca-rotation`, admin).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaRotationStep {
    /// Make a new CA and trust it beside the current one (nothing is reissued yet).
    Trust,
    /// Issue every certificate from the new CA: the controllers' at once, each node's at
    /// its next heartbeat. Refused until every online node trusts the new CA.
    Issue,
    /// Stop trusting the old CA and forget its key. Refused until every online node's
    /// certificate is of the new CA.
    Retire,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartCaRotationStep {
    pub step: CaRotationStep,
}

/// Where a CA rotation stands (`GET`/`POST /v1/cluster/ca-rotation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaRotation {
    /// The last step taken (`None`: the CA never rotated).
    pub step: Option<CaRotationStep>,
    /// SHA-256 (hex) of the CA being replaced, and of its replacement.
    pub old_sha256: Option<String>,
    pub new_sha256: Option<String>,
    /// What clients should trust now (the CLI writes it to its CA file).
    pub trust_pem: String,
    /// Online nodes not yet ready for the next step: after `trust`, those that do not trust
    /// the new CA yet; after `issue`, those whose certificate is not of the new CA yet.
    pub waiting_for: Vec<String>,
    /// Nodes that are offline: they rejoin with a join token once the old CA is retired.
    pub offline: Vec<String>,
}
