//! Hawser's cluster store: a versioned key/value trait with compare-and-swap, leases, fences
//! and watches ([`Store`]), typed JSON helpers, and its two backends: the embedded
//! single-file store ([`EmbeddedStore`], one controller) and etcd v3 ([`EtcdStore`], several
//! controllers with leader election).

mod embedded;
mod etcd;
pub mod etcd_process;
mod store;

pub use embedded::EmbeddedStore;
pub use etcd::{EtcdConfig, EtcdStore};
pub use store::{
    get_json, list_json, put_json, Expect, Fence, LeaseId, Result, Store, StoreError, Versioned,
    Watch, WatchEvent, WriteOptions,
};
