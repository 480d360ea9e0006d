//! The store's integration tests, in one test binary: the conformance suite
//! (`hawser_testkit::store_conformance`) on the embedded file and a real etcd, and each
//! backend's own tests (hawser-kube runs the suite on a real kube-apiserver). One binary rather than one per file, because each binary compiled and linked the store's
//! clients again; the files are modules here and keep their paths.
#![allow(clippy::unwrap_used)]

mod conformance_embedded;
mod conformance_etcd;
mod embedded;
mod etcd_secure;
