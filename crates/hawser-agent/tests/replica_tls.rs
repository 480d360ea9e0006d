//! The replica port of a TLS node that has not registered yet (it holds a certificate but not
//! the cluster's grant key) opens no session, whatever the Hello: before, it took Hellos
//! without a grant. Once a registration answer gave it the key, the same granted Hello opens
//! the session.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::node_support::{node, TempDir};
use base64::Engine as _;
use hawser_agent::replica;
use hawser_api::controller::ClusterJoin;
use hawser_tls::{Ca, CertSlot, ClientAuth, Credentials, Peer};
use hawser_wire::frame::{FrameHeader, Op, Status, HEADER_LEN};
use hawser_wire::grant::{Grant, HelloRequest};
use ring::signature::KeyPair as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn slot(ca: &Ca, node: &str) -> std::sync::Arc<CertSlot> {
    let (issued, key_pem) = ca
        .issue_with_key(&Peer::Node(node.into()), Duration::from_secs(3600))
        .unwrap();
    CertSlot::new(&Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    })
    .unwrap()
}

/// Node a says Hello over TLS with `payload` at `epoch`; the status of the answer.
async fn hello(
    addr: &str,
    client: std::sync::Arc<hawser_tls::rustls::ClientConfig>,
    epoch: u64,
    payload: &[u8],
) -> Status {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = hawser_tls::rustls::pki_types::ServerName::try_from("b").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(client)
        .connect(name, tcp)
        .await
        .unwrap();
    let h = FrameHeader::request(Op::Hello, 1, epoch, 0, 0).with_payload(payload);
    s.write_all(&h.encode()).await.unwrap();
    s.write_all(payload).await.unwrap();
    s.flush().await.unwrap();
    let mut reply = [0u8; HEADER_LEN];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut reply))
        .await
        .unwrap()
        .unwrap();
    FrameHeader::decode(&reply).unwrap().status
}

/// Node `b`'s replica server over mutual TLS (a CA of cluster c1): its address, node a's
/// client configuration for it, and what stops it when dropped.
async fn serve_b(
    b: &std::sync::Arc<hawser_agent::storage::pools::NodeStorage>,
) -> (
    String,
    std::sync::Arc<hawser_tls::rustls::ClientConfig>,
    tokio::sync::watch::Sender<bool>,
) {
    let ca = Ca::generate("c1").unwrap();
    let server =
        hawser_tls::server_config(ca.cert_pem(), slot(&ca, "b"), ClientAuth::Required).unwrap();
    let client =
        hawser_tls::client_config(ca.cert_pem(), Peer::Node("b".into()), Some(slot(&ca, "a")))
            .unwrap();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let rl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = rl.local_addr().unwrap().to_string();
    tokio::spawn(replica::server::serve(
        rl,
        b.clone(),
        Some(server),
        Default::default(),
        stop_rx,
    ));
    (addr, client, stop)
}

#[tokio::test]
async fn a_tls_node_without_the_grant_key_opens_no_session() {
    let dir = TempDir::new("replica-tls");
    let b = node(&dir.0, "b", 1 << 20);
    let (addr, client, _stop) = serve_b(&b).await;

    let key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[7u8; 32]).unwrap();
    let grant = Grant {
        cluster: "c1".into(),
        volume: "vol".into(),
        node: "a".into(),
        epoch: 5,
        key_check: None,
    };
    let mut signed = grant.body().unwrap();
    signed.extend_from_slice(key.sign(&signed).as_ref());
    let granted = HelloRequest {
        replica: "vol-b".into(),
        grant: Some(signed),
    }
    .encode();
    let bare = HelloRequest {
        replica: "vol-b".into(),
        grant: None,
    }
    .encode();

    for (what, payload) in [("no grant", &bare), ("a grant", &granted)] {
        let status = hello(&addr, client.clone(), 5, payload).await;
        assert_eq!(status, Status::Denied, "{what} before the key is known");
    }
    let epoch = || {
        b.replica_statuses()
            .into_iter()
            .find(|r| r.replica_id == "vol-b")
            .unwrap()
            .epoch
    };
    assert_eq!(epoch(), 0, "no Hello raised the epoch");

    b.learn_cluster(&ClusterJoin {
        metrics_sha256: Vec::new(),
        ca: None,
        id: "c1".into(),
        grant_key: base64::engine::general_purpose::STANDARD.encode(key.public_key().as_ref()),
    });
    assert_eq!(hello(&addr, client.clone(), 5, &bare).await, Status::Denied);
    assert_eq!(hello(&addr, client, 5, &granted).await, Status::Ok);
    assert_eq!(epoch(), 5);
}

/// A replica of an encrypted volume records its data key's check, and its server opens a
/// session only for a grant carrying the same check: not for another key's, nor for a plain
/// grant; and a plain replica does not open for a keyed grant. Nor can it be cloned into a
/// replica that records another check.
#[tokio::test]
async fn replicas_open_only_for_grants_with_their_key_check() {
    use hawser_api::KeyCheck;
    use hawser_storage::NewReplica;
    let dir = TempDir::new("replica-key-check");
    let b = node(&dir.0, "b", 1 << 20);
    let right = KeyCheck::of(&[1u8; 64]);
    let keyed = NewReplica {
        id: "sec-b".into(),
        volume: "sec".into(),
        size: 1 << 20,
        thin: true,
        cluster: Some("c1".into()),
        key_check: Some(right.0),
        checksums: false,
        wrapped_key: None,
        volume_uid: None,
    };
    b.create("default", &keyed).unwrap();
    let (addr, client, _stop) = serve_b(&b).await;
    let key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[7u8; 32]).unwrap();
    b.learn_cluster(&ClusterJoin {
        metrics_sha256: Vec::new(),
        ca: None,
        id: "c1".into(),
        grant_key: base64::engine::general_purpose::STANDARD.encode(key.public_key().as_ref()),
    });
    let hello_with = |replica: &str, volume: &str, epoch: u64, check: Option<KeyCheck>| {
        let grant = Grant {
            cluster: "c1".into(),
            volume: volume.into(),
            node: "a".into(),
            epoch,
            key_check: check.map(|k| k.0),
        };
        let mut signed = grant.body().unwrap();
        signed.extend_from_slice(key.sign(&signed).as_ref());
        HelloRequest {
            replica: replica.into(),
            grant: Some(signed),
        }
        .encode()
    };
    let epoch_of = |id: &str| {
        b.replica_statuses()
            .into_iter()
            .find(|r| r.replica_id == id)
            .unwrap()
            .epoch
    };
    let wrong = KeyCheck::of(&[2u8; 64]);
    for (what, check) in [("another key's check", Some(wrong)), ("no key check", None)] {
        let status = hello(
            &addr,
            client.clone(),
            3,
            &hello_with("sec-b", "sec", 3, check),
        )
        .await;
        assert_eq!(status, Status::Denied, "{what}");
    }
    assert_eq!(epoch_of("sec-b"), 0, "no refused Hello raised the epoch");
    let status = hello(
        &addr,
        client.clone(),
        3,
        &hello_with("vol-b", "vol", 3, Some(right)),
    )
    .await;
    assert_eq!(status, Status::Denied, "a keyed grant for a plain replica");
    assert_eq!(epoch_of("vol-b"), 0);
    let status = hello(
        &addr,
        client.clone(),
        3,
        &hello_with("sec-b", "sec", 3, Some(right)),
    )
    .await;
    assert_eq!(status, Status::Ok, "the replica's own key check");
    assert_eq!(epoch_of("sec-b"), 3);
    let status = hello(&addr, client, 4, &hello_with("vol-b", "vol", 4, None)).await;
    assert_eq!(status, Status::Ok, "a plain grant for a plain replica");

    // A clone must record its source's key check.
    b.take_snapshot("sec-b", 3, "s1").unwrap();
    let from = hawser_api::agent::SnapshotRef {
        replica_id: "sec-b".into(),
        snapshot: "s1".into(),
    };
    for check in [None, Some(wrong.0)] {
        let copy = NewReplica {
            id: "copy-b".into(),
            volume: "copy".into(),
            key_check: check,
            checksums: false,
            ..keyed.clone()
        };
        let e = b.create_from("default", &copy, Some(&from)).unwrap_err();
        assert!(
            matches!(e, hawser_storage::StorageError::KeyMismatch { .. }),
            "{e}"
        );
    }
    let copy = NewReplica {
        id: "copy-b".into(),
        volume: "copy".into(),
        ..keyed.clone()
    };
    let made = b.create_from("default", &copy, Some(&from)).unwrap();
    assert_eq!(made.key_check(), Some(right.0));
}
