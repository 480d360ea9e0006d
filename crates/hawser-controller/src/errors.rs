//! The controller's error type and the one place that maps it to an HTTP status and a JSON
//! `ApiError` body.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hawser_api::controller::VolumeState;
use hawser_api::{ApiError, ErrorCode};
use hawser_store::StoreError;

use crate::healing::placement::PlacementError;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("{message}")]
    InvalidArgument { message: String },
    /// The request body could not be read or parsed; `status` is 400, or 413 when too large.
    #[error("{message}")]
    BadBody { status: u16, message: String },
    #[error(
        "unauthorized: {reason}; send `Authorization: Bearer TOKEN` with a token \
             created at cluster init"
    )]
    Unauthorized { reason: String },
    #[error("agent credentials may only call the agent routes (register, outdate, in-sync)")]
    Forbidden,
    #[error("forbidden: {reason}")]
    ForbiddenFor { reason: String },
    #[error("no route for {method} {path}")]
    NoRoute { method: String, path: String },
    #[error("volume {volume:?} not found")]
    VolumeNotFound { volume: String },
    #[error("node {node:?} not found")]
    NodeNotFound { node: String },
    #[error("volume {volume:?} has no replica {replica:?}")]
    ReplicaNotFound { volume: String, replica: String },
    #[error("no volume has a replica {replica:?} (`hawser replica list` shows them)")]
    UnknownReplica { replica: String },
    #[error("volume {volume:?} already exists")]
    VolumeExists { volume: String },
    #[error("snapshot {snapshot:?} not found")]
    SnapshotNotFound { snapshot: String },
    #[error("snapshot {snapshot:?} already exists (of volume {volume:?})")]
    SnapshotExists { snapshot: String, volume: String },
    #[error(
        "volume {volume:?} has {count} snapshot(s) ({names}); delete them first, or delete \
         the volume with its snapshots (`--with-snapshots`)"
    )]
    HasSnapshots {
        volume: String,
        count: usize,
        names: String,
    },
    #[error("snapshot {snapshot:?} could not be taken: {reason}")]
    SnapshotFailed { snapshot: String, reason: String },
    #[error("volume {volume:?} is attached to node {node:?}{hint}")]
    Attached {
        volume: String,
        node: String,
        hint: &'static str,
    },
    #[error("volume {volume:?} is {state:?}; try again when it is detached")]
    Busy { volume: String, state: VolumeState },
    #[error(
        "volume {volume:?} is syncing new replicas (an engine on node {node:?}); try again \
         when the sync ends (`hawser status` shows its progress)"
    )]
    Syncing { volume: String, node: String },
    #[error(
        "volume {volume:?} is being restored to snapshot {snapshot:?}, or a restore stopped \
         half-way: run `hawser volume restore {volume} --snapshot {snapshot}` to finish it"
    )]
    Restoring { volume: String, snapshot: String },
    #[error(
        "volume {volume:?} is being filled from {from}, or that restore failed (`hawser \
         events` says why): it cannot be used until the restore ends, and a failed one can \
         only be deleted"
    )]
    FromBackup { volume: String, from: String },
    #[error(
        "volume {volume:?} is a {of}: it follows that volume's backups and cannot be used \
         until `hawser volume activate {volume}` makes it a normal volume"
    )]
    Standby { volume: String, of: String },
    #[error("node {node:?} is offline (no heartbeat for {age_secs}s)")]
    NodeOffline { node: String, age_secs: u64 },
    /// The answer does not say the current epoch: a caller that is not the volume's engine
    /// must not learn which epoch to claim.
    #[error("epoch {epoch} of volume {volume:?} is not its current epoch")]
    StaleEpoch {
        volume: String,
        epoch: u64,
        current: u64,
    },
    #[error(
        "replica {replica:?} is the last in-sync replica of volume {volume:?}; \
         it is never outdated"
    )]
    LastInSyncReplica { volume: String, replica: String },
    #[error(
        "replica {replica:?} of volume {volume:?} is failed; it is not made in-sync again \
         automatically"
    )]
    ReplicaFailed { volume: String, replica: String },
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("node {node:?}: {op}: {source}")]
    Agent {
        node: String,
        op: String,
        #[source]
        source: AgentError,
    },
    #[error("volume {volume:?} was changed by another controller meanwhile; look and retry")]
    Changed { volume: String },
    #[error("gave up on {key:?} after {retries} compare-and-swap conflicts")]
    Contention { key: String, retries: u32 },
    #[error("{}", not_leader_message(.leader_url))]
    NotLeader { leader_url: Option<String> },
    #[error("cluster store: {0}")]
    Store(#[from] StoreError),
    #[error(
        "node {node:?} holds replicas of cluster {theirs}, but this controller's store is of \
         cluster {ours}: the node is refused and nothing of it is touched. If the store was \
         wiped or restored from a backup, run `hawser cluster recover` to adopt the nodes' \
         replicas"
    )]
    OtherCluster {
        node: String,
        theirs: String,
        ours: String,
    },
    #[error("{message}")]
    Refused { message: String },
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} {name:?} exists already")]
    Exists { kind: &'static str, name: String },
    /// A backup target that cannot be used: its check failed, or it has no credentials here.
    #[error("backup target {target:?}: {reason}")]
    BackupTarget { target: String, reason: String },
}

fn not_leader_message(leader_url: &Option<String>) -> String {
    match leader_url {
        Some(url) => format!("this controller is not the leader; the leader is {url}"),
        None => "this controller is not the leader and no leader is known yet; retry".into(),
    }
}

impl ControllerError {
    /// Why a volume whose record says `restoring` cannot be used: a standby, a restore from
    /// a backup, or one to a snapshot (`restoring` holds its label).
    pub fn restoring(v: &crate::store::model::VolumeRecord, label: &str) -> Self {
        let volume = v.name.clone();
        match (&v.standby, label.strip_prefix("backup ")) {
            (Some(s), _) => ControllerError::Standby {
                volume,
                of: s.label(),
            },
            (None, Some(_)) => ControllerError::FromBackup {
                volume,
                from: label.to_owned(),
            },
            (None, None) => ControllerError::Restoring {
                volume,
                snapshot: label.to_owned(),
            },
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ControllerError::InvalidArgument {
            message: message.into(),
        }
    }

    pub fn code(&self) -> ErrorCode {
        use ControllerError as E;
        match self {
            E::InvalidArgument { .. } | E::BadBody { .. } => ErrorCode::InvalidArgument,
            E::NoRoute { .. }
            | E::VolumeNotFound { .. }
            | E::NodeNotFound { .. }
            | E::ReplicaNotFound { .. }
            | E::UnknownReplica { .. }
            | E::SnapshotNotFound { .. }
            | E::NotFound { .. } => ErrorCode::NotFound,
            E::VolumeExists { .. } | E::SnapshotExists { .. } | E::Exists { .. } => {
                ErrorCode::AlreadyExists
            }
            E::BackupTarget { .. } => ErrorCode::Unavailable,
            E::HasSnapshots { .. } => ErrorCode::Conflict,
            E::SnapshotFailed { .. } => ErrorCode::Unavailable,
            E::Attached { .. }
            | E::Busy { .. }
            | E::Syncing { .. }
            | E::Restoring { .. }
            | E::FromBackup { .. }
            | E::Standby { .. }
            | E::LastInSyncReplica { .. }
            | E::ReplicaFailed { .. }
            | E::Changed { .. }
            | E::OtherCluster { .. }
            | E::Refused { .. }
            | E::Contention { .. } => ErrorCode::Conflict,
            E::StaleEpoch { .. } => ErrorCode::StaleEpoch,
            E::Unauthorized { .. } => ErrorCode::Unauthorized,
            E::Forbidden | E::ForbiddenFor { .. } => ErrorCode::Forbidden,
            E::Placement(_) => ErrorCode::InsufficientCapacity,
            E::NodeOffline { .. } => ErrorCode::Unavailable,
            E::Agent { source, .. } => match source.api_code() {
                // The agent's own capacity check is authoritative; say so rather than
                // "unavailable".
                Some(ErrorCode::InsufficientCapacity) => ErrorCode::InsufficientCapacity,
                _ => ErrorCode::Unavailable,
            },
            E::NotLeader { .. } | E::Store(StoreError::Fenced { .. }) => ErrorCode::NotLeader,
            E::Store(StoreError::Unavailable { .. }) => ErrorCode::Unavailable,
            E::Store(_) => ErrorCode::Internal,
        }
    }

    /// The HTTP status: the code's, except for the few transport-level cases (413, 405) that
    /// have no `ErrorCode` of their own.
    pub fn http_status(&self) -> u16 {
        match self {
            ControllerError::BadBody { status, .. } => *status,
            _ => self.code().http_status(),
        }
    }

    pub fn to_api(&self) -> ApiError {
        let mut e = ApiError::new(self.code(), self.to_string());
        if let ControllerError::NotLeader { leader_url } = self {
            e.leader_url = leader_url.clone();
        }
        e
    }
}

impl From<ApiError> for ControllerError {
    /// `hawser_api` validators return `ApiError`s; they are all invalid arguments.
    fn from(e: ApiError) -> Self {
        ControllerError::InvalidArgument { message: e.message }
    }
}

impl IntoResponse for ControllerError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        match self.code() {
            ErrorCode::Internal => tracing::error!(error = %self, "request failed"),
            ErrorCode::Unavailable => tracing::warn!(error = %self, "request failed"),
            _ => tracing::debug!(error = %self, "request refused"),
        }
        let mut resp = (status, Json(self.to_api())).into_response();
        if self.code() == ErrorCode::Unauthorized {
            // RFC 6750: a 401 names the scheme the client should use.
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

/// A call to an agent that failed (`cluster::agent_client`). Here, beside the controller's
/// own error that carries it, so that this file imports no caller of its own.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No answer: connection refused, timeout, reset. Unless `connect` (the connection was
    /// never made), the request may or may not have run.
    #[error("agent at {addr} unreachable: {reason}")]
    Unreachable {
        addr: String,
        connect: bool,
        reason: String,
    },
    #[error("agent at {addr} answered {status}: {message}")]
    Refused {
        addr: String,
        status: u16,
        code: Option<ErrorCode>,
        message: String,
    },
    #[error("agent at {addr} sent an unreadable response: {source}")]
    BadResponse {
        addr: String,
        #[source]
        source: reqwest::Error,
    },
}

impl AgentError {
    /// The agent's error code, when it answered with an `ApiError`.
    pub fn api_code(&self) -> Option<ErrorCode> {
        match self {
            AgentError::Refused { code, .. } => *code,
            _ => None,
        }
    }

    pub fn is_unreachable(&self) -> bool {
        matches!(self, AgentError::Unreachable { .. })
    }

    /// Whether the request certainly did not reach the agent.
    pub fn never_sent(&self) -> bool {
        matches!(self, AgentError::Unreachable { connect: true, .. })
    }
}
