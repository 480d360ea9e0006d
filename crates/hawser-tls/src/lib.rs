//! Mutual TLS between Hawser processes.
//!
//! The controller is the cluster's certificate authority ([`Ca`]): it makes the CA when the
//! cluster is created and keeps it in the cluster's store, next to the grant key. Every
//! certificate it issues names exactly one principal ([`Peer`]) in a URI subject alternative
//! name: `hawser://controller`, `hawser://node/<name>`, or for an NBD client the volumes it
//! may open (`peer.rs` has the table). Agents get theirs by joining with a
//! one-time [`JoinToken`], which also carries the CA's fingerprint so that a new agent can
//! tell the real controller from anyone else before it sends the token.
//!
//! Both sides of every connection present a certificate, and both check the other's: the
//! chain must end at the cluster's CA, and the name must be the one expected (a client knows
//! whom it dials; a server learns whom it serves and the caller decides what that peer may
//! do). Host names and addresses in certificates play no part: nodes move between addresses,
//! and an address says nothing about who holds the key.
//!
//! Certificates expire ([`NODE_CERT_LIFETIME`]) and are replaced while connections stay up:
//! configurations built here read the current certificate from a [`CertSlot`] at every
//! handshake. A certificate and its key are kept on disk as [`PairLayout`] says, replaced
//! in one rename, so that no crash leaves a key beside a certificate it does not belong to.

mod ca;
mod config;
mod credentials;
mod join;
mod pair_files;
mod peer;
mod pem;
mod slot;
mod trust;

pub use ca::{der_to_pem, derive_from_root, new_key};
pub use ca::{Ca, Issued, CA_LIFETIME, MAX_EXTRA_NAMES, NODE_CERT_LIFETIME};
pub use config::{
    cert_names, client_config, client_config_trusting, client_peer, issuer_fingerprint,
    not_after_unix, pinned_client_config, server_config, server_config_trusting, server_names,
};
pub use credentials::Credentials;
pub use join::{ca_fingerprint, JoinToken};
pub use pair_files::{Found, KeyOf, PairError, PairLayout, Seen, NODE_IDENTITY};
pub use peer::{
    peer_of, ClientScope, ClientVolume, Peer, PeerError, CLIENT_DNS_NAME, CONTROLLER_DNS_NAME,
    MAX_CLIENT_VOLUMES, NODE_DNS_NAME,
};
pub use pem::certs_from_pem;
pub use slot::CertSlot;
pub use trust::{ClientAuth, TrustSlot, MAX_TRUSTED_CAS};

pub use rustls;
pub use rustls_pki_types::CertificateDer;

/// The crypto provider every configuration here uses.
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}
