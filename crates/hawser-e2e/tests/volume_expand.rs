//! Volume expansion through real processes: a 2-replica volume written over NBD, detached,
//! expanded, attached again; the NBD export has the new size, the old data reads back, the
//! new range takes writes, and both replica files are byte-identical over the new size.

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
    // Attached: refused, with the way out in the message.
    let out = c.cli(&["volume", "expand", "grow", "--size", "128MiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("detach"), "{err}");
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
