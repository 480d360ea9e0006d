//! Hawser's cluster store: a versioned key/value trait with compare-and-swap ([`Store`]),
//! typed JSON helpers, and the embedded single-file backend ([`EmbeddedStore`]). An etcd v3
//! backend can implement the same trait later.

mod embedded;
mod store;

pub use embedded::EmbeddedStore;
pub use store::{get_json, list_json, put_json, Expect, Result, Store, StoreError, Versioned};
