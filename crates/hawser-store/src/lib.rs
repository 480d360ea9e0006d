//! Hawser's cluster store: a versioned key/value trait with compare-and-swap, leases, fences
//! and watches ([`Store`]), typed JSON helpers, and two of its backends: the embedded
//! single-file store ([`EmbeddedStore`], one controller) and etcd v3 ([`EtcdStore`], several
//! controllers with leader election). The third, on Kubernetes custom resources (several
//! controllers, no database besides the API server), is `hawser_kube::KubeStore`: it comes
//! with a Kubernetes client, which this crate does not need.

mod embedded;
mod etcd;
mod store;

pub use embedded::EmbeddedStore;
pub use etcd::{EtcdConfig, EtcdIdentity, EtcdStore, EtcdTls, EtcdUrlError, EtcdUser};
pub use store::{
    get_json, list_json, put_json, Expect, Fence, LeaseId, Result, Store, StoreError, Versioned,
    Watch, WatchEvent, WriteOptions,
};
