//! Who a certificate names. Every certificate the cluster's CA issues names exactly one
//! principal in URI subject alternative names:
//!
//! | principal | URIs | what it may open |
//! |---|---|---|
//! | a controller | `hawser://controller` | agents' admin API |
//! | a node's agent | `hawser://node/<name>` | the controller's agent routes, replica ports |
//! | an NBD client | `hawser://client/volume/<v>/<uid>` (one per volume), optionally `hawser://client/node/<n>` | NBD TCP: exports `<v>` of uid `<uid>` (at node `<n>` only) |
//!
//! A controller or node certificate carries one URI and nothing else of `hawser://`; a client
//! certificate carries one or more volume URIs and at most one node URI. A certificate with
//! none, a mix, or a `hawser://` URI outside these names nobody. It also carries its role's
//! DNS name (`Peer::role_dns_name`) for clients that verify hostnames, which says less.
//!
//! A client certificate names each volume by its uid as well as its name: names are reused
//! (delete a volume, create another of the same name), so a certificate that named only the
//! name would open the namesake until it expired. A volume URI without a uid (certificates
//! issued before volumes had uids) opens only an export that has none either.

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
    /// Sorted by name, one per name, 1 to [`MAX_CLIENT_VOLUMES`] valid names.
    volumes: Vec<ClientVolume>,
    node: Option<String>,
}

/// A volume a client certificate opens: its name and, for a volume that has one, its uid
/// (32 lowercase hex digits, `hawser_api::uid`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientVolume {
    pub name: String,
    pub uid: Option<String>,
}

impl ClientScope {
    /// The scope of volumes named without uids (any order, duplicates dropped), at `node`
    /// only if given: what certificates issued before volumes had uids name.
    pub fn new(volumes: &[String], node: Option<&str>) -> Result<ClientScope, PeerError> {
        let v: Vec<ClientVolume> = volumes
            .iter()
            .map(|name| ClientVolume {
                name: name.clone(),
                uid: None,
            })
            .collect();
        ClientScope::of(&v, node)
    }

    /// The scope of `volumes` (any order, duplicates dropped; one name with two uids is
    /// refused), at `node` only if given.
    pub fn of(volumes: &[ClientVolume], node: Option<&str>) -> Result<ClientScope, PeerError> {
        let mut v = volumes.to_vec();
        v.sort();
        v.dedup();
        if let Some(w) = v.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(PeerError::TwoUids {
                name: w[0].name.clone(),
            });
        }
        if v.is_empty() || v.len() > MAX_CLIENT_VOLUMES {
            return Err(PeerError::ClientVolumes { count: v.len() });
        }
        let names = v.iter().map(|c| c.name.as_str()).chain(node);
        if let Some(bad) = names.into_iter().find(|n| !valid_name(n)) {
            return Err(PeerError::InvalidName {
                name: bad.to_string(),
            });
        }
        if let Some(bad) = v
            .iter()
            .filter_map(|c| c.uid.as_deref())
            .find(|u| !valid_uid(u))
        {
            return Err(PeerError::InvalidUid {
                uid: bad.to_string(),
            });
        }
        Ok(ClientScope {
            volumes: v,
            node: node.map(str::to_string),
        })
    }

    pub fn volumes(&self) -> &[ClientVolume] {
        &self.volumes
    }

    /// The names of its volumes, sorted.
    pub fn names(&self) -> Vec<String> {
        self.volumes.iter().map(|c| c.name.clone()).collect()
    }

    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Whether this client's certificate names a volume called `volume`, of whatever uid, and
    /// is good at node `here`: what decides between "no such export" and "not yours" when
    /// no export of that name exists here.
    pub fn mentions(&self, here: &str, volume: &str) -> bool {
        self.node.as_deref().is_none_or(|n| n == here)
            && self
                .volumes
                .binary_search_by(|v| v.name.as_str().cmp(volume))
                .is_ok()
    }

    /// Whether this client may open export `volume`, whose volume has uid `uid`, at node
    /// `here`: the certificate names that volume with that uid (or both have none).
    pub fn admits(&self, here: &str, volume: &str, uid: Option<&str>) -> bool {
        self.node.as_deref().is_none_or(|n| n == here)
            && self
                .volumes
                .binary_search_by(|v| v.name.as_str().cmp(volume))
                .is_ok_and(|i| self.volumes[i].uid.as_deref() == uid)
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
                .map(|v| match &v.uid {
                    Some(uid) => format!("{CLIENT_VOLUME_URI_PREFIX}{}/{uid}", v.name),
                    None => format!("{CLIENT_VOLUME_URI_PREFIX}{}", v.name),
                })
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
    ClientVolume(ClientVolume),
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
    if let Some(rest) = uri.strip_prefix(CLIENT_VOLUME_URI_PREFIX) {
        let (name, uid) = match rest.split_once('/') {
            Some((name, uid)) => (name, Some(uid)),
            None => (rest, None),
        };
        if !valid_name(name) || uid.is_some_and(|u| !valid_uid(u)) {
            return None;
        }
        return Some(Part::ClientVolume(ClientVolume {
            name: name.to_string(),
            uid: uid.map(str::to_string),
        }));
    }
    named(CLIENT_NODE_URI_PREFIX).map(|n| Part::ClientNode(n.to_string()))
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Controller => f.write_str("the controller"),
            Peer::Node(n) => write!(f, "node {n}"),
            Peer::Client(s) => {
                write!(f, "a client of volume {}", s.names().join(", "))?;
                match &s.node {
                    Some(n) => write!(f, " at node {n}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A volume uid as `hawser_api::uid` writes it: 32 lowercase hex digits.
fn valid_uid(uid: &str) -> bool {
    uid.len() == 32
        && uid
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
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
    #[error("invalid volume uid {uid:?}: expected 32 lowercase hex digits")]
    InvalidUid { uid: String },
    #[error("volume {name} is named with two uids")]
    TwoUids { name: String },
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
        (None, false, _) => ClientScope::of(&volumes, node.as_deref()).map(Peer::Client),
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
        assert_eq!(any.names(), [s("a"), s("b")]);
        assert!(any.admits("n1", "a", None) && any.admits("n2", "b", None));
        assert!(!any.admits("n1", "c", None) && !any.admits("n1", "", None));
        let at = ClientScope::new(&[s("a")], Some("n1")).expect("scope");
        assert!(at.admits("n1", "a", None));
        assert!(!at.admits("n2", "a", None));
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

    /// A certificate for volume `a` of one uid opens neither a namesake of another uid nor a
    /// volume without one; a certificate without a uid opens only a volume without one. The
    /// uid travels in the URI and comes back from it.
    #[test]
    fn client_scopes_admit_their_volume_by_uid_not_its_namesake() {
        let (u1, u2) = ("1".repeat(32), "2".repeat(32));
        let v = |name: &str, uid: &str| ClientVolume {
            name: s(name),
            uid: Some(s(uid)),
        };
        let scope = ClientScope::of(&[v("a", &u1), v("a", &u1)], None).expect("scope");
        assert!(scope.admits("n1", "a", Some(&u1)));
        assert!(!scope.admits("n1", "a", Some(&u2)));
        assert!(!scope.admits("n1", "a", None));
        let legacy = ClientScope::new(&[s("a")], None).expect("scope");
        assert!(!legacy.admits("n1", "a", Some(&u1)));
        assert!(scope.mentions("n1", "a") && legacy.mentions("n1", "a"));
        assert!(!scope.mentions("n1", "b"));
        let uris = Peer::Client(scope.clone()).uris();
        assert_eq!(uris, [format!("hawser://client/volume/a/{u1}")]);
        assert!(matches!(part_of(&uris[0]), Some(Part::ClientVolume(c)) if c == v("a", &u1)));
        for bad in [
            format!("hawser://client/volume/a/{}", "A".repeat(32)),
            format!("hawser://client/volume/a/{}", "1".repeat(31)),
            format!("hawser://client/volume/a/{u1}/x"),
            format!("hawser://client/volume//{u1}"),
        ] {
            assert!(part_of(&bad).is_none(), "{bad}");
        }
        assert_eq!(
            ClientScope::of(&[v("a", &u1), v("a", &u2)], None),
            Err(PeerError::TwoUids { name: s("a") })
        );
        assert_eq!(
            ClientScope::of(&[v("a", "nothex")], None),
            Err(PeerError::InvalidUid { uid: s("nothex") })
        );
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        assert_eq!(peer_of(b""), Err(PeerError::Malformed));
        assert_eq!(peer_of(&[0x30, 0x82, 0xff]), Err(PeerError::Malformed));
    }
}
