//! The store conformance suite against the embedded single-file backend.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hawser_store::{EmbeddedStore, Store};
use hawser_testkit::conformance_tests;

async fn embedded() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path().join("store.json")).unwrap();
    (dir, Arc::new(store))
}

conformance_tests!(embedded);
