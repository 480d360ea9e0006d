//! Who a certificate names. Every certificate the cluster's CA issues names exactly one
//! principal in URI subject alternative names:
//!
//! | principal | URIs | what it may open |
//! |---|---|---|
//! | a controller | `hawser://controller` | agents' admin API |
//! | a node's agent | `hawser://node/<name>` | the controller's agent routes, replica ports |
//! | an NBD client | `hawser://client/volume/<v>` (one per volume), optionally `hawser://client/node/<n>` | NBD TCP: exports `<v>` (at node `<n>` only) |
//!
//! A controller or node certificate carries one URI and nothing else of `hawser://`; a client
//! certificate carries one or more volume URIs and at most one node URI. A certificate with
//! none, a mix, or a `hawser://` URI outside these names nobody. It also carries its role's
//! DNS name (`Peer::role_dns_name`) for clients that verify hostnames, which says less.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

const CONTROLLER_URI: &str = "hawser://controller";
const NODE_URI_PREFIX: &str = "hawser://node/";
const CLIENT_VOLUME_URI_PREFIX: &str = "hawser://client/volume/";
const CLIENT_NODE_URI_PREFIX: &str = "hawser://client/node/";

/// See [`Peer::role_dns_name`].
pub const CONTROLLER_DNS_NAME: &str = "controller.hawser.internal";
/// See [`Peer::role_dns_name`].
pub const NODE_DNS_NAME: &str = "node.hawser.internal";
/// See [`Peer::role_dns_name`].
pub const CLIENT_DNS_NAME: &str = "client.hawser.internal";

/// The most volumes one client certificate may name: it is read at every NBD handshake, and
/// a client that needs more can hold several certificates.
pub const MAX_CLIENT_VOLUMES: usize = 64;

/// A principal of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// Any controller of the cluster (they share the CA and act alike).
    Controller,
    /// The agent of one node.
    Node(String),
    /// An NBD client of some volumes (`hawser volume client-cert`): it opens those exports
    /// and nothing else, on any node or only at `node`.
    Client(ClientScope),
}

/// What an NBD client certificate opens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientScope {
    /// Sorted, without duplicates, 1 to [`MAX_CLIENT_VOLUMES`] valid names.
    volumes: Vec<String>,
    node: Option<String>,
}

impl ClientScope {
    /// The scope of `volumes` (any order, duplicates dropped), at `node` only if given.
    pub fn new(volumes: &[String], node: Option<&str>) -> Result<ClientScope, PeerError> {
        let mut v = volumes.to_vec();
        v.sort();
        v.dedup();
        if v.is_empty() || v.len() > MAX_CLIENT_VOLUMES {
            return Err(PeerError::ClientVolumes { count: v.len() });
        }
        let names = v.iter().map(String::as_str).chain(node);
        if let Some(bad) = names.into_iter().find(|n| !valid_name(n)) {
            return Err(PeerError::InvalidName {
                name: bad.to_string(),
            });
        }
        Ok(ClientScope {
            volumes: v,
            node: node.map(str::to_string),
        })
    }

    pub fn volumes(&self) -> &[String] {
        &self.volumes
    }

    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Whether this client may open export `volume` at node `here`.
    pub fn admits(&self, here: &str, volume: &str) -> bool {
        self.node.as_deref().is_none_or(|n| n == here)
            && self
                .volumes
                .binary_search_by(|v| v.as_str().cmp(volume))
                .is_ok()
    }
}

impl Peer {
    /// The URIs the certificate carries (one, except for a client of several volumes).
    pub fn uris(&self) -> Vec<String> {
        match self {
            Peer::Controller => vec![CONTROLLER_URI.to_string()],
            Peer::Node(n) => vec![format!("{NODE_URI_PREFIX}{n}")],
            Peer::Client(s) => s
                .volumes
                .iter()
                .map(|v| format!("{CLIENT_VOLUME_URI_PREFIX}{v}"))
                .chain(
                    s.node
                        .iter()
                        .map(|n| format!("{CLIENT_NODE_URI_PREFIX}{n}")),
                )
                .collect(),
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
            Peer::Client(_) => CLIENT_DNS_NAME,
        }
    }
}

/// One `hawser://` URI, as [`peer_of`] reads it.
enum Part {
    Whole(Peer),
    ClientVolume(String),
    ClientNode(String),
}

fn part_of(uri: &str) -> Option<Part> {
    if uri == CONTROLLER_URI {
        return Some(Part::Whole(Peer::Controller));
    }
    let named = |prefix: &str| uri.strip_prefix(prefix).filter(|n| valid_name(n));
    if let Some(n) = named(NODE_URI_PREFIX) {
        return Some(Part::Whole(Peer::Node(n.to_string())));
    }
    if let Some(v) = named(CLIENT_VOLUME_URI_PREFIX) {
        return Some(Part::ClientVolume(v.to_string()));
    }
    named(CLIENT_NODE_URI_PREFIX).map(|n| Part::ClientNode(n.to_string()))
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Controller => f.write_str("the controller"),
            Peer::Node(n) => write!(f, "node {n}"),
            Peer::Client(s) => {
                write!(f, "a client of volume {}", s.volumes.join(", "))?;
                match &s.node {
                    Some(n) => write!(f, " at node {n}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Node and volume names as the API accepts them: 1-63 of a-z, 0-9 and '-', not starting
/// with '-'.
pub(crate) fn valid_name(name: &str) -> bool {
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
    #[error("a client certificate names 1 to {MAX_CLIENT_VOLUMES} volumes, not {count}")]
    ClientVolumes { count: usize },
    #[error("invalid name {name:?}: use 1-63 characters a-z, 0-9 and '-', not starting with '-'")]
    InvalidName { name: String },
}

/// The principal a certificate names. Says nothing about who signed it: call it only on a
/// certificate whose chain was verified (every configuration of this crate does that first).
pub fn peer_of(cert_der: &[u8]) -> Result<Peer, PeerError> {
    let (_, cert) = X509Certificate::from_der(cert_der).map_err(|_| PeerError::Malformed)?;
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Err(PeerError::Unnamed);
    };
    let (mut whole, mut volumes, mut node) = (None, Vec::new(), None);
    for name in &san.value.general_names {
        let GeneralName::URI(uri) = name else {
            continue;
        };
        if !uri.starts_with("hawser://") {
            continue;
        }
        match part_of(uri).ok_or(PeerError::Unnamed)? {
            Part::Whole(p) if whole.is_none() => whole = Some(p),
            Part::Whole(_) => return Err(PeerError::Ambiguous),
            Part::ClientVolume(v) if volumes.len() < MAX_CLIENT_VOLUMES => volumes.push(v),
            Part::ClientVolume(_) => {
                return Err(PeerError::ClientVolumes {
                    count: volumes.len() + 1,
                })
            }
            Part::ClientNode(n) if node.is_none() => node = Some(n),
            Part::ClientNode(_) => return Err(PeerError::Ambiguous),
        }
    }
    match (whole, volumes.is_empty(), &node) {
        (Some(p), true, None) => Ok(p),
        (Some(_), _, _) => Err(PeerError::Ambiguous),
        (None, true, _) => Err(PeerError::Unnamed),
        (None, false, _) => ClientScope::new(&volumes, node.as_deref()).map(Peer::Client),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        v.to_string()
    }

    #[test]
    fn names_follow_the_api_rules() {
        assert!(valid_name("n1"));
        assert!(valid_name("worker-a-"));
        assert!(!valid_name(""));
        assert!(!valid_name("-a"));
        assert!(!valid_name("a.b"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("A"));
        assert!(!valid_name(&"a".repeat(64)));
    }

    #[test]
    fn uris_round_trip_and_others_name_nobody() {
        for p in [Peer::Controller, Peer::Node("n-1".into())] {
            let uris = p.uris();
            assert_eq!(uris.len(), 1);
            assert!(matches!(part_of(&uris[0]), Some(Part::Whole(q)) if q == p));
        }
        for bad in [
            "hawser://node/",
            "hawser://node/a/b",
            "hawser://controller/x",
            "hawser://client/volume/",
            "hawser://client/volume/A",
            "hawser://client/node/a/b",
            "hawser://client/x",
        ] {
            assert!(part_of(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn client_scopes_admit_their_volumes_at_their_node_only() {
        let any = ClientScope::new(&[s("b"), s("a"), s("b")], None).expect("scope");
        assert_eq!(any.volumes(), [s("a"), s("b")]);
        assert!(any.admits("n1", "a") && any.admits("n2", "b"));
        assert!(!any.admits("n1", "c") && !any.admits("n1", ""));
        let at = ClientScope::new(&[s("a")], Some("n1")).expect("scope");
        assert!(at.admits("n1", "a"));
        assert!(!at.admits("n2", "a"));
        assert_eq!(
            ClientScope::new(&[], None),
            Err(PeerError::ClientVolumes { count: 0 })
        );
        let many: Vec<String> = (0..=MAX_CLIENT_VOLUMES).map(|i| format!("v{i}")).collect();
        assert!(matches!(
            ClientScope::new(&many, None),
            Err(PeerError::ClientVolumes { .. })
        ));
        assert_eq!(
            ClientScope::new(&[s("a/../b")], None),
            Err(PeerError::InvalidName { name: s("a/../b") })
        );
        assert!(ClientScope::new(&[s("a")], Some("N")).is_err());
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        assert_eq!(peer_of(b""), Err(PeerError::Malformed));
        assert_eq!(peer_of(&[0x30, 0x82, 0xff]), Err(PeerError::Malformed));
    }
}
