//! "Replicated volumes over NBD", acceptance a-c: real clients against a 3-node cluster.

use hawser_e2e::{
    assert_fsck_clean, assert_same_contents, have, run_ok, Cluster, FuseExport, LoopDevice, Mount,
    TempDir,
};
use rand::{Rng, RngCore, SeedableRng};
use sha2::{Digest, Sha256};

fn need(bins: &[&str]) -> bool {
    let missing: Vec<&&str> = bins.iter().filter(|b| !have(b)).collect();
    if !missing.is_empty() {
        eprintln!("SKIP: missing {missing:?} (make test installs them)");
    }
    missing.is_empty()
}

fn replica_files_identical(c: &Cluster, volume: &str) {
    let v = c.volume(volume);
    assert_eq!(v.replicas.len(), 2);
    let a = c.replica_path(&v.replicas[0].id);
    let b = c.replica_path(&v.replicas[1].id);
    assert_same_contents(&a, &b, v.size_bytes);
}

/// a. fio writes and verifies 1 GiB of mixed 4k-128k random writes at iodepth 1 and 32 on a
/// 2-replica volume; afterwards the two replica files are identical.
#[test]
fn fio_verify_1gib_qd1_and_qd32_then_replicas_identical() {
    if !need(&["fio"]) {
        return;
    }
    let c = Cluster::start("fio", 3);
    let uri = c.attached_volume("fio", "1GiB", 2, "n1");
    for iodepth in ["1", "32"] {
        let out = run_ok(
            "fio",
            &[
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randwrite",
                "--bsrange=4k-128k",
                "--size=1G",
                &format!("--iodepth={iodepth}"),
                "--verify=crc32c",
                "--verify_fatal=1",
                "--randrepeat=0",
                "--verify_state_save=0",
            ],
        );
        assert!(
            out.contains("err= 0"),
            "fio reported errors at iodepth {iodepth}:\n{out}"
        );
    }
    c.cli_ok(&["volume", "detach", "fio"]);
    replica_files_identical(&c, "fio");
}

/// b. ext4 on the volume through nbdfuse + a loop device: 1,000 files, unmount, fsck -n clean,
/// remount, every file's checksum unchanged.
#[test]
fn ext4_thousand_files_fsck_clean_and_checksums_survive_remount() {
    if !need(&[
        "nbdfuse",
        "mkfs.ext4",
        "fsck.ext4",
        "losetup",
        "fusermount3",
    ]) {
        return;
    }
    let c = Cluster::start("ext4", 3);
    let uri = c.attached_volume("fs", "512MiB", 2, "n2");
    let work = TempDir::new("ext4-mnt");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut sums = Vec::new();
    {
        let fuse = FuseExport::new(&uri, &work.path().join("fuse"));
        let lo = LoopDevice::attach(&fuse.file);
        run_ok("mkfs.ext4", &["-q", "-F", &lo.dev]);
        {
            let m = Mount::new(&lo.dev, &work.path().join("mnt"));
            for i in 0..1000 {
                let len = rng.random_range(1..64 * 1024);
                let mut data = vec![0u8; len];
                rng.fill_bytes(&mut data);
                let p = m.dir.join(format!("f{i:04}"));
                std::fs::write(&p, &data).expect("write file");
                sums.push((p.file_name().map(|n| n.to_owned()), Sha256::digest(&data)));
            }
        }
        assert_fsck_clean(&lo.dev, "the volume");
        let m = Mount::new(&lo.dev, &work.path().join("mnt"));
        for (name, sum) in &sums {
            let data = std::fs::read(m.dir.join(name.as_ref().expect("name"))).expect("read back");
            assert_eq!(
                &Sha256::digest(&data),
                sum,
                "file {name:?} changed across remount"
            );
        }
    }
    c.cli_ok(&["volume", "detach", "fs"]);
    replica_files_identical(&c, "fs");
}

/// c. nbdcopy a 512 MiB random image in and back out (equal sha256); qemu-io patterns.
#[test]
fn nbdcopy_roundtrip_and_qemu_io_patterns() {
    if !need(&["nbdcopy", "qemu-io"]) {
        return;
    }
    let c = Cluster::start("copy", 3);
    let uri = c.attached_volume("copy", "512MiB", 2, "n1");
    let work = TempDir::new("copy-files");
    let src = work.path().join("src.img");
    let dst = work.path().join("dst.img");
    let mut data = vec![0u8; 512 << 20];
    rand::rngs::StdRng::seed_from_u64(11).fill_bytes(&mut data);
    std::fs::write(&src, &data).expect("write image");
    let want = Sha256::digest(&data);
    drop(data);
    run_ok("nbdcopy", &[&src.display().to_string(), &uri]);
    run_ok("nbdcopy", &[&uri, &dst.display().to_string()]);
    let got = Sha256::digest(std::fs::read(&dst).expect("read copy"));
    assert_eq!(got, want, "nbdcopy round trip changed the data");

    let out = run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0xa5 0 1M",
            "-c",
            "write -P 0x5a 1M 64k",
            "-c",
            "aio_write -P 0x11 4M 128k",
            "-c",
            "aio_flush",
            "-c",
            "read -P 0xa5 0 1M",
            "-c",
            "read -P 0x5a 1M 64k",
            "-c",
            "read -P 0x11 4M 128k",
            "-c",
            "write -z 8M 1M",
            "-c",
            "read -P 0 8M 1M",
            "-c",
            "discard 16M 1M",
            "-c",
            "read -P 0 16M 1M",
            "-c",
            "flush",
        ],
    );
    assert!(
        !out.contains("failed") && !out.contains("Pattern verification"),
        "qemu-io:\n{out}"
    );
    assert_eq!(
        out.matches("read ").count(),
        5,
        "not every read ran:\n{out}"
    );
    c.cli_ok(&["volume", "detach", "copy"]);
    replica_files_identical(&c, "copy");
}

/// A node reboot: the engine's agent restarts, `volume attach` on the same node brings the
/// engine back (same epoch), and data written and flushed before is there.
#[test]
fn engine_node_restart_then_reattach_serves_the_same_data() {
    if !need(&["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start("restart", 2);
    let uri = c.attached_volume("r", "64MiB", 2, "n1");
    run_ok(
        "qemu-io",
        &["-f", "raw", &uri, "-c", "write -P 0x3c 0 2M", "-c", "flush"],
    );
    let epoch = c.volume("r").epoch;
    c.restart_agent("n1");
    c.cli_ok(&["volume", "attach", "r", "--node", "n1"]);
    let v = c.volume("r");
    assert_eq!(
        v.epoch, epoch,
        "re-attaching where attached must not change the epoch"
    );
    run_ok("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x3c 0 2M"]);
    run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x4d 2M 1M",
            "-c",
            "read -P 0x4d 2M 1M",
        ],
    );
    c.cli_ok(&["volume", "detach", "r"]);
    replica_files_identical(&c, "r");
}

/// Diskless attach: the volume is served from a node that holds none of its replicas; every
/// read and write goes over the replica protocol, and both replicas end identical.
#[test]
fn diskless_attach_serves_from_remote_replicas() {
    if !need(&["qemu-io", "fio"]) {
        return;
    }
    let c = Cluster::start("diskless", 3);
    c.cli_ok(&[
        "volume",
        "create",
        "dl",
        "--size",
        "256MiB",
        "--replicas",
        "2",
    ]);
    let v = c.volume("dl");
    let diskless = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| v.replicas.iter().all(|r| r.node != *n))
        .expect("a node without a replica");
    c.cli_ok(&["volume", "attach", "dl", "--node", diskless]);
    let uri = c.volume("dl").nbd_unix_uri.expect("unix uri");
    let out = run_ok(
        "fio",
        &[
            "--name=diskless",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--size=128M",
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ],
    );
    assert!(out.contains("err= 0"), "fio on a diskless attach:\n{out}");
    let status = c.agent_status(diskless);
    assert!(
        status.replicas.is_empty(),
        "the diskless node has a replica: {status:?}"
    );
    c.cli_ok(&["volume", "detach", "dl"]);
    replica_files_identical(&c, "dl");
}
