//! The store's integration tests, in one test binary: the conformance suite on every backend
//! (the embedded file, a real etcd, a real kube-apiserver) and each backend's own tests. One
//! binary rather than one per file, because each binary compiled and linked the store's
//! clients again; the files are modules here and keep their paths.
#![allow(clippy::unwrap_used)]

#[macro_use]
mod conformance;

mod conformance_embedded;
mod conformance_etcd;
mod conformance_k8s;
mod embedded;
mod etcd_secure;
