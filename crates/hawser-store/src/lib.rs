//! Hawser's cluster store: a versioned key/value trait with compare-and-swap, leases, fences
//! and watches ([`Store`]), typed JSON helpers, and its backends: the embedded
//! single-file store ([`EmbeddedStore`], one controller), etcd v3 ([`EtcdStore`], several
//! controllers with leader election) and Kubernetes custom resources ([`KubeStore`], the
//! same, with no database besides the API server).

pub mod apiserver_process;
mod embedded;
mod etcd;
pub mod etcd_pki;
pub mod etcd_process;
pub mod k8s;
mod store;
pub mod test_ports;

pub use embedded::EmbeddedStore;
pub use etcd::{EtcdConfig, EtcdIdentity, EtcdStore, EtcdTls, EtcdUser};
pub use k8s::{KubeConfig, KubeStore, KubeStoreUrl};
pub use store::{
    get_json, list_json, put_json, Expect, Fence, LeaseId, Result, Store, StoreError, Versioned,
    Watch, WatchEvent, WriteOptions,
};
