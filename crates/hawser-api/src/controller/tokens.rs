//! The cluster's API tokens: a rotation of the admin, agent or metrics token
//! (`POST /v1/cluster/{admin,agent,metrics}-token`).

use serde::{Deserialize, Serialize};

/// `POST /v1/cluster/admin-token` and `/v1/cluster/agent-token`: replace a cluster token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateToken {
    /// How long the previous token still works, in seconds (default 3600, at most 7 days;
    /// 0: not at all).
    #[serde(default)]
    pub grace_secs: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRotated {
    /// The new token (shown once; the store keeps its digest).
    pub token: String,
    /// When the previous token stops working, Unix milliseconds.
    pub previous_valid_until_ms: u64,
}
