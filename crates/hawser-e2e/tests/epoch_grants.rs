//! "Secure by default", acceptance b (and the replica-port half of a): a replica refuses a
//! Hello whose epoch grant the controller did not sign, including `epoch = u64::MAX`, an
//! unsigned one, a forged one and one for another volume; unknown replica ids cannot be
//! probed; the agent token alone cannot start an engine; nothing changes on the replica and
//! the volume stays usable.

use std::io::{Read, Write};
use std::time::Duration;

use hawser_api::controller::ReplicaState;
use hawser_e2e::peer_conn::ReplicaPort;
use hawser_e2e::{have, qemu_io, Cluster};
use hawser_wire::frame::{FrameHeader, Op, Status, HEADER_LEN};
use hawser_wire::grant::{Grant, HelloRequest, SIGNATURE_BYTES};

/// Says Hello at `epoch` with `payload` and returns the status of the answer: inside an
/// authenticated session (TLS with node n1's certificate), so the grant is what is checked.
fn hello(port: &ReplicaPort, epoch: u64, payload: &[u8]) -> Status {
    let mut s = port.connect().expect("connect to the replica port");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let h = FrameHeader::request(Op::Hello, 1, epoch, 0, 0).with_payload(payload);
    s.write_all(&h.encode()).expect("send header");
    s.write_all(payload).expect("send payload");
    let mut reply = [0u8; HEADER_LEN];
    s.read_exact(&mut reply).expect("an answer");
    FrameHeader::decode(&reply).expect("a frame header").status
}

fn forged(cluster: &str, volume: &str, epoch: u64) -> Vec<u8> {
    let g = Grant {
        cluster: cluster.into(),
        volume: volume.into(),
        node: "n1".into(),
        epoch,
        key_check: None,
    };
    let mut b = g.body().expect("grant body");
    b.extend_from_slice(&[0x5a; SIGNATURE_BYTES]);
    b
}

#[test]
fn hellos_without_the_controllers_grant_are_refused_and_change_nothing() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing (make test installs it)");
        return;
    }
    let c = Cluster::start("grants", 2);
    let uri = c.attached_volume("g", "64MiB", 2, "n1");
    qemu_io(&uri, &["write -P 0x42 0 4M", "flush"]);
    let v = c.volume("g");
    let r2 = c.replica_on("g", "n2");
    let epoch_of = || {
        c.agent_status("n2")
            .replicas
            .iter()
            .find(|r| r.replica_id == r2.id)
            .map(|r| r.epoch)
            .expect("n2 reports its replica")
    };
    let before = epoch_of();
    assert_eq!(before, v.epoch);
    let cluster = c
        .agent_status("n2")
        .cluster_id
        .expect("n2 joined the cluster");
    let port = c.replica_port("n2", "n1");
    let addr = port.addr.clone();
    let with = |grant: Vec<u8>| {
        HelloRequest {
            replica: r2.id.clone(),
            grant: Some(grant),
        }
        .encode()
    };
    let cases: Vec<(&str, u64, Vec<u8>)> = vec![
        ("unsigned, u64::MAX", u64::MAX, r2.id.as_bytes().to_vec()),
        (
            "unsigned, current epoch",
            v.epoch,
            r2.id.as_bytes().to_vec(),
        ),
        (
            "forged, u64::MAX",
            u64::MAX,
            with(forged(&cluster, "g", u64::MAX)),
        ),
        (
            "forged, next epoch",
            v.epoch + 1,
            with(forged(&cluster, "g", v.epoch + 1)),
        ),
        ("garbage grant", u64::MAX, with(vec![7; 40])),
        ("unknown replica", v.epoch, b"g-r9-ffffff".to_vec()),
    ];
    for (what, epoch, payload) in cases {
        assert_eq!(hello(&port, epoch, &payload), Status::Denied, "{what}");
    }
    assert_eq!(epoch_of(), before, "no refused Hello raised the epoch");

    // Access to the admin API (here the controller's own certificate) without a grant
    // cannot start an engine (raise an epoch) either.
    let start = serde_json::json!({
        "volume": "g", "size_bytes": 64 << 20, "epoch": u64::MAX - 1,
        "replicas": [{"replica_id": r2.id, "node": "n2", "replica_addr": addr}],
        "controller_url": c.url.split(',').next().expect("url"),
    });
    let resp = c
        .agent_request(reqwest::Method::POST, "n2", "/v1/engines")
        .json(&start)
        .send()
        .expect("start engine call");
    assert_eq!(resp.status(), 403);
    assert!(resp.text().unwrap_or_default().contains("no epoch grant"));
    assert_eq!(epoch_of(), before);

    // The volume is as usable as before, with both replicas in sync.
    qemu_io(&uri, &["read -P 0x42 0 4M", "write -P 0x43 4M 1M", "flush"]);
    let v = c.volume("g");
    assert!(
        v.replicas.iter().all(|r| r.state == ReplicaState::InSync),
        "{v:?}"
    );
    c.cli_ok(&["volume", "detach", "g"]);
    c.cli_ok(&["volume", "attach", "g", "--node", "n2"]);
    qemu_io(
        &c.volume("g").nbd_unix_uri.expect("uri"),
        &["read -P 0x43 4M 1M"],
    );
}
