//! Hawser's Kubernetes client and the cluster store on custom resources.
//!
//! - The client ([`api`], [`config`]): where the API server is and how to authenticate
//!   (the pod's service account, or a kubeconfig file), JSON calls with a deadline whose
//!   failures are classified by what a caller must know (missing, conflict, gone, other), and
//!   watch streams. The controller's failover uses it for pods, nodes, taints, Events and
//!   VolumeAttachments, and its CA home for a Secret. ARCHITECTURE.md says why it is
//!   hand-written rather than kube-rs.
//! - [`KubeStore`] ([`store`]): `hawser_store::Store` on one custom resource per record.

pub mod api;
pub mod config;
pub mod store;
mod time;

use std::time::Duration;

pub use config::{Auth, ConfigError, ContextProblem, KubeConfig};
pub use store::{
    install_crds, InstallError, KubeStore, KubeStoreUrl, KubeUrlError, CRDS_YAML, GROUP, KINDS,
    VERSION,
};
pub use time::micro_time;

/// Default deadline of one API call.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
