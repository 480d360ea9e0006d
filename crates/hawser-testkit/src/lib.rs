//! Test harness that Hawser's tests share, kept out of the production crates: real etcd and
//! kube-apiserver processes on free loopback ports ([`etcd_process`], [`apiserver_process`]),
//! etcd's certificates ([`etcd_pki`]), port claims that several test processes respect
//! ([`test_ports`]), and the conformance suite every cluster-store backend passes
//! ([`store_conformance`]). Only dev-dependencies and the e2e crate depend on it:
//! `cargo tree -e normal -p hawser` does not list it (the layout test checks that).

pub mod apiserver_process;
pub mod etcd_pki;
pub mod etcd_process;
pub mod store_conformance;
pub mod test_ports;
