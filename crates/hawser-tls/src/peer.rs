//! Who a certificate names. Every certificate the cluster's CA issues carries exactly one
//! URI subject alternative name, `hawser://controller` or `hawser://node/<name>`; a
//! certificate with none, several, or another URI names nobody. It also carries its role's
//! DNS name (`Peer::role_dns_name`) for clients that verify hostnames, which says less.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

const CONTROLLER_URI: &str = "hawser://controller";
const NODE_URI_PREFIX: &str = "hawser://node/";

/// See [`Peer::role_dns_name`].
pub const CONTROLLER_DNS_NAME: &str = "controller.hawser.internal";
/// See [`Peer::role_dns_name`].
pub const NODE_DNS_NAME: &str = "node.hawser.internal";

/// A principal of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// Any controller of the cluster (they share the CA and act alike).
    Controller,
    /// The agent of one node.
    Node(String),
}

impl Peer {
    /// The URI the certificate carries.
    pub fn uri(&self) -> String {
        match self {
            Peer::Controller => CONTROLLER_URI.to_string(),
            Peer::Node(n) => format!("{NODE_URI_PREFIX}{n}"),
        }
    }

    /// The DNS name the certificate also carries, one per role (not per node): what a
    /// client with ordinary hostname verification (Prometheus: `tls_config.server_name`)
    /// checks to know it reaches a controller, or some agent, of the cluster. Hawser's own
    /// connections check the URI, which names the node.
    pub fn role_dns_name(&self) -> &'static str {
        match self {
            Peer::Controller => CONTROLLER_DNS_NAME,
            Peer::Node(_) => NODE_DNS_NAME,
        }
    }

    fn from_uri(uri: &str) -> Option<Peer> {
        if uri == CONTROLLER_URI {
            return Some(Peer::Controller);
        }
        let name = uri.strip_prefix(NODE_URI_PREFIX)?;
        valid_node_name(name).then(|| Peer::Node(name.to_string()))
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Controller => f.write_str("the controller"),
            Peer::Node(n) => write!(f, "node {n}"),
        }
    }
}

/// Node names as the API accepts them: 1-63 of a-z, 0-9 and '-', not starting with '-'.
pub(crate) fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeerError {
    #[error("the certificate is not valid DER")]
    Malformed,
    #[error("the certificate names no Hawser principal (no hawser:// URI)")]
    Unnamed,
    #[error("the certificate names more than one Hawser principal")]
    Ambiguous,
}

/// The principal a certificate names. Says nothing about who signed it: call it only on a
/// certificate whose chain was verified (every configuration of this crate does that first).
pub fn peer_of(cert_der: &[u8]) -> Result<Peer, PeerError> {
    let (_, cert) = X509Certificate::from_der(cert_der).map_err(|_| PeerError::Malformed)?;
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Err(PeerError::Unnamed);
    };
    let mut found = None;
    for name in &san.value.general_names {
        let GeneralName::URI(uri) = name else {
            continue;
        };
        if !uri.starts_with("hawser://") {
            continue;
        }
        let peer = Peer::from_uri(uri).ok_or(PeerError::Unnamed)?;
        if found.replace(peer).is_some() {
            return Err(PeerError::Ambiguous);
        }
    }
    found.ok_or(PeerError::Unnamed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_follow_the_api_rules() {
        assert!(valid_node_name("n1"));
        assert!(valid_node_name("worker-a-"));
        assert!(!valid_node_name(""));
        assert!(!valid_node_name("-a"));
        assert!(!valid_node_name("a.b"));
        assert!(!valid_node_name("A"));
        assert!(!valid_node_name(&"a".repeat(64)));
    }

    #[test]
    fn uris_round_trip_and_others_name_nobody() {
        for p in [Peer::Controller, Peer::Node("n-1".into())] {
            assert_eq!(Peer::from_uri(&p.uri()), Some(p));
        }
        assert_eq!(Peer::from_uri("hawser://node/"), None);
        assert_eq!(Peer::from_uri("hawser://node/a/b"), None);
        assert_eq!(Peer::from_uri("hawser://controller/x"), None);
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        assert_eq!(peer_of(b""), Err(PeerError::Malformed));
        assert_eq!(peer_of(&[0x30, 0x82, 0xff]), Err(PeerError::Malformed));
    }
}
