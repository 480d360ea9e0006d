//! Encryption at rest (issue 21, acceptance b): an encrypted volume's replica files, and a
//! capture of its replica traffic, hold none of a known plaintext written to it (while a plain
//! volume's capture does: the capture sees what it must); it reads back after its engine
//! moves to another node and after the key-encryption key is rotated (the old key file then
//! deleted); a clone of its snapshot reads the same; a replaced key-encryption key refuses
//! the attach with a clear error and changes nothing. (An engine given a wrong data key is
//! refused by the replicas' key checks: hawser-agent's tests engine_encrypted and
//! replica_tls, since the controller cannot be made to hand one out.)

use hawser_api::controller::VolumeKeyRotated;
use hawser_e2e::capture::Capture;
use hawser_e2e::nbd_client::{NbdConn, NbdTarget};
use hawser_e2e::{Cluster, ClusterOptions};

const MARKER: &[u8] = b"HAWSER-E2E-KNOWN-PLAINTEXT-";
/// Apart, and one of them sector- but not page-aligned.
const OFFSETS: [u64; 3] = [0, (1 << 20) + 512, 40 << 20];

fn plaintext() -> Vec<u8> {
    MARKER.iter().copied().cycle().take(64 << 10).collect()
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn connect(c: &Cluster, volume: &str) -> NbdConn {
    let uri = c.volume(volume).nbd_unix_uri.expect("attached");
    NbdConn::connect(&NbdTarget::from_unix_uri(&uri)).expect("connect")
}

fn reads_back(c: &Cluster, volume: &str) {
    let mut conn = connect(c, volume);
    let want = plaintext();
    for at in OFFSETS {
        let mut got = vec![0u8; want.len()];
        conn.read_at(at, &mut got).expect("read");
        assert!(
            got == want,
            "{volume} at {at} does not read back: {:?}",
            &got[..48]
        );
    }
    conn.disconnect();
}

#[test]
fn an_encrypted_volume_keeps_only_ciphertext_and_moves_with_its_key() {
    let c = Cluster::start("crypt", 3);
    c.cli_ok(&[
        "volume",
        "create",
        "sec",
        "--size",
        "64MiB",
        "--replicas",
        "2",
        "--encrypted",
    ]);
    assert!(c.volume("sec").encrypted);
    c.cli_ok(&["volume", "attach", "sec", "--node", "n1"]);
    let mut conn = connect(&c, "sec");
    for at in OFFSETS {
        conn.write_at(at, &plaintext()).expect("write");
    }
    conn.disconnect();
    c.cli_ok(&["volume", "detach", "sec"]);

    let v = c.volume("sec");
    for r in &v.replicas {
        let data = std::fs::read(c.replica_path(&r.id)).expect("read a replica file");
        assert!(!holds(&data, MARKER), "plaintext in replica {}", r.id);
    }

    // The engine moves: another node, another epoch, the same key.
    c.cli_ok(&["volume", "attach", "sec", "--node", "n3"]);
    reads_back(&c, "sec");
    c.cli_ok(&["snapshot", "create", "s1", "--volume", "sec"]);
    c.cli_ok(&["volume", "detach", "sec"]);

    // A clone shares the data, so it shares the key.
    c.cli_ok(&["volume", "create", "copy", "--from", "s1"]);
    assert!(c.volume("copy").encrypted);
    c.cli_ok(&["volume", "attach", "copy", "--node", "n2"]);
    reads_back(&c, "copy");
    c.cli_ok(&["volume", "detach", "copy"]);

    // A replaced key-encryption key: the attach is refused, saying why, and the volume
    // stays detached.
    let kek = c.dir.path().join("controller/volume-keys/kek-1.key");
    let original = std::fs::read(&kek).expect("the controller's key-encryption key");
    std::fs::write(&kek, [0x5a; 32]).expect("replace the key");
    c.cli_fails(
        &["volume", "attach", "sec", "--node", "n1"],
        "does not open with key-encryption key 1",
    );
    assert!(c.volume("sec").attached_node.is_none());
    std::fs::write(&kek, original).expect("put the key back");
    c.cli_ok(&["volume", "attach", "sec", "--node", "n1"]);
    reads_back(&c, "sec");

    // Rotation while it is attached: both data keys are re-wrapped under key 2, the engine
    // serves on, and key 1 is no longer needed: deleted, the volumes still open.
    let out = c.cli_ok(&["cluster", "rotate-volume-key", "-o", "json"]);
    let r: VolumeKeyRotated = serde_json::from_str(&out).expect("a rotation report");
    assert_eq!(r.kek, 2);
    let mut rewrapped = r.rewrapped.clone();
    rewrapped.sort();
    assert_eq!(rewrapped, ["copy", "sec"]);
    assert_eq!(r.wrapping, [(2, 2)].into_iter().collect());
    reads_back(&c, "sec");
    c.cli_ok(&["volume", "detach", "sec"]);
    std::fs::remove_file(&kek).expect("delete key 1");
    for (volume, node) in [("sec", "n2"), ("copy", "n3")] {
        c.cli_ok(&["volume", "attach", volume, "--node", node]);
        reads_back(&c, volume);
        c.cli_ok(&["volume", "detach", volume]);
    }
}

/// What crosses loopback while `volume`, attached on n1 with its other replica on n2, takes
/// the plaintext at every offset.
fn captured_writes(c: &Cluster, volume: &str) -> Vec<u8> {
    c.cli_ok(&["volume", "attach", volume, "--node", "n1"]);
    let mut conn = connect(c, volume);
    let capture = Capture::loopback().expect("capture on lo (root)");
    for at in OFFSETS {
        // Acknowledged only once the remote replica has it: it has crossed loopback.
        conn.write_at(at, &plaintext()).expect("write");
    }
    let frames = capture.finish().expect("the capture");
    conn.disconnect();
    c.cli_ok(&["volume", "detach", volume]);
    frames
}

/// The replica traffic is ciphertext before any TLS: in a plaintext (`--insecure`) cluster,
/// a capture on loopback holds a plain volume's writes and none of an encrypted one's.
#[test]
fn an_encrypted_volumes_replica_traffic_is_ciphertext() {
    let c = Cluster::start_with(
        "crypt-wire",
        2,
        ClusterOptions {
            insecure: true,
            ..ClusterOptions::default()
        },
    );
    for (name, encrypted) in [("plain", false), ("sec", true)] {
        let mut args = vec![
            "volume",
            "create",
            name,
            "--size",
            "64MiB",
            "--replicas",
            "2",
        ];
        if encrypted {
            args.push("--encrypted");
        }
        c.cli_ok(&args);
    }
    let plain = captured_writes(&c, "plain");
    let sec = captured_writes(&c, "sec");
    assert!(
        holds(&plain, MARKER),
        "the capture did not see a plain volume's writes ({} bytes captured)",
        plain.len()
    );
    assert!(
        sec.len() > OFFSETS.len() * plaintext().len(),
        "the capture missed the encrypted volume's writes ({} bytes captured)",
        sec.len()
    );
    assert!(!holds(&sec, MARKER), "plaintext in the replica traffic");
}
