//! Encryption at rest (issue 21, acceptance b, in part): an encrypted volume's replica files
//! hold none of a known plaintext written to it; it reads back after its engine moves to
//! another node; a clone of its snapshot reads the same; a replaced key-encryption key
//! refuses the attach with a clear error and changes nothing.

use hawser_e2e::nbd_client::{NbdConn, NbdTarget};
use hawser_e2e::Cluster;

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
    c.cli_ok(&["volume", "detach", "sec"]);
}
