//! The Kubernetes store's integration tests, in one binary: the store conformance suite
//! (`hawser_testkit::store_conformance`) against a real kube-apiserver, then what only this
//! backend has.
#![allow(clippy::unwrap_used)]

mod conformance_k8s;
