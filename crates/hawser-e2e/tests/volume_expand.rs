//! Volume expansion through real processes. Offline: a 2-replica volume written over NBD,
//! detached, expanded, attached again. Online: the same volume grows while attached, under a
//! verifying fio run. Either way the NBD export has the new size, the old data reads back,
//! the new range takes writes, and both replica files are byte-identical over the new size.

use hawser_e2e::{assert_same_contents, run_ok, Cluster};

fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut args = vec!["-f", "raw", uri];
    for c in cmds {
        args.extend(["-c", c]);
    }
    let out = run_ok("qemu-io", &args);
    assert!(
        !out.contains("failed") && !out.contains("Pattern verification"),
        "qemu-io:\n{out}"
    );
    out
}

#[test]
fn an_expanded_volume_keeps_its_data_and_serves_the_new_range_on_every_replica() {
    let c = Cluster::start("expand", 2);
    let uri = c.attached_volume("grow", "64MiB", 2, "n1");
    qemu_io(
        &uri,
        &["write -P 0xa5 0 1M", "write -P 0x5a 63M 1M", "flush"],
    );
    c.cli_ok(&["volume", "detach", "grow"]);
    c.cli_ok(&["volume", "expand", "grow", "--size", "128MiB"]);
    let out = c.cli(&["volume", "expand", "grow", "--size", "64MiB"]);
    assert!(!out.status.success(), "a shrink was accepted");
    assert_eq!(c.volume("grow").size_bytes, 128 << 20);
    c.cli_ok(&["volume", "attach", "grow", "--node", "n2"]);
    let uri = c.volume("grow").nbd_unix_uri.expect("attached");
    let size = run_ok("nbdinfo", &["--size", &uri]);
    assert_eq!(size.trim(), (128u64 << 20).to_string(), "the export's size");
    qemu_io(
        &uri,
        &[
            "read -P 0xa5 0 1M",
            "read -P 0x5a 63M 1M",
            "read -P 0 64M 1M",
            "write -P 0x33 127M 1M",
            "read -P 0x33 127M 1M",
            "flush",
        ],
    );
    c.cli_ok(&["volume", "detach", "grow"]);
    let v = c.volume("grow");
    let paths: Vec<_> = v.replicas.iter().map(|r| c.replica_path(&r.id)).collect();
    for p in &paths {
        assert_eq!(
            std::fs::metadata(p).expect("stat").len(),
            128 << 20,
            "{}",
            p.display()
        );
    }
    assert_same_contents(&paths[0], &paths[1], 128 << 20);
}

/// The volume grows while fio writes and verifies through an NBD connection opened before
/// the grow: every replica grows in place under the engine's open sessions, then the engine,
/// then the export. fio sees no error and no block that reads back wrong; a new connection
/// sees the new size and writes the new range; the replicas agree byte for byte.
#[test]
fn an_attached_volume_grows_online_under_a_verifying_writer() {
    let c = Cluster::start("expand-online", 2);
    let uri = c.attached_volume("live", "64MiB", 2, "n1");
    qemu_io(&uri, &["write -P 0xa5 0 1M", "flush"]);
    let fio = hawser_e2e::fio::verify("before-grow", &uri, "8M", "56M", 30);
    c.cli_ok(&["volume", "expand", "live", "--size", "128MiB"]);
    assert_eq!(c.volume("live").size_bytes, 128 << 20);
    let size = run_ok("nbdinfo", &["--size", &uri]);
    assert_eq!(
        size.trim(),
        (128u64 << 20).to_string(),
        "a new connection's size"
    );
    qemu_io(
        &uri,
        &[
            "read -P 0xa5 0 1M",
            "read -P 0 64M 1M",
            "write -P 0x33 100M 4M",
            "read -P 0x33 100M 4M",
            "flush",
        ],
    );
    // A second writer in the new range, beside the first in the old one.
    let fio_new = hawser_e2e::fio::verify("after-grow", &uri, "64M", "64M", 5);
    hawser_e2e::fio::passed(fio_new);
    // The first was running all along; it stops now and must have seen nothing wrong.
    hawser_e2e::fio::interrupted_passed(fio);
    c.cli_ok(&["volume", "detach", "live"]);
    let v = c.volume("live");
    let paths: Vec<_> = v.replicas.iter().map(|r| c.replica_path(&r.id)).collect();
    assert_same_contents(&paths[0], &paths[1], 128 << 20);
}
