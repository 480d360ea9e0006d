//! Clones on a real 3-node cluster: an ext4 filesystem is written on a volume, snapshotted
//! while mounted, written more; a 3-replica clone of the snapshot (two replicas seeded where
//! the snapshot's copies are, one blank and synced) mounts with exactly the files of before
//! the snapshot and is `fsck -n` clean after the mount; it stays whole after its snapshot and
//! its source volume are deleted; a clone of a volume has the volume's latest data.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use hawser_e2e::run::wait_until;
use hawser_e2e::{assert_fsck_clean, run_ok, Cluster, FuseExport, LoopDevice, Mount, TempDir};
use sha2::{Digest, Sha256};

type Sums = BTreeMap<String, Vec<u8>>;

fn write_files(dir: &Path, prefix: &str, n: usize) -> Sums {
    (0..n)
        .map(|i| {
            let name = format!("{prefix}{i:03}");
            let data: Vec<u8> = (0..(i + 1) * 997)
                .map(|j| u8::try_from((j * 31 + i) % 251).unwrap_or(0))
                .collect();
            std::fs::write(dir.join(&name), &data).expect("write file");
            (name, Sha256::digest(&data).to_vec())
        })
        .collect()
}

fn read_sums(dir: &Path) -> Sums {
    std::fs::read_dir(dir)
        .expect("list")
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            let data = std::fs::read(e.path()).expect("read file");
            (
                e.file_name().to_string_lossy().into_owned(),
                Sha256::digest(&data).to_vec(),
            )
        })
        .collect()
}

/// Mounts the volume behind `uri` (replaying ext4's journal), returns its files' checksums,
/// unmounts, and checks `fsck -n -f` is clean.
fn mount_read_fsck(uri: &str, work: &Path, tag: &str) -> Sums {
    let fuse = FuseExport::new(uri, &work.join(format!("fuse-{tag}")));
    let lo = LoopDevice::attach(&fuse.file);
    let sums = {
        let m = Mount::new(&lo.dev, &work.join(format!("mnt-{tag}")));
        read_sums(&m.dir)
    };
    assert_fsck_clean(&lo.dev, tag);
    sums
}

fn in_sync(c: &Cluster, volume: &str) -> usize {
    c.volume(volume)
        .replicas
        .iter()
        .filter(|r| r.state == hawser_api::controller::ReplicaState::InSync)
        .count()
}

#[test]
fn a_clone_of_a_snapshot_mounts_with_the_files_of_its_moment_and_outlives_its_source() {
    let c = Cluster::start("clones", 3);
    let uri = c.attached_volume("src", "128MiB", 2, "n1");
    let work = TempDir::new("clones-mnt");
    let (before, after) = {
        let fuse = FuseExport::new(&uri, &work.path().join("fuse"));
        let lo = LoopDevice::attach(&fuse.file);
        run_ok("mkfs.ext4", &["-q", "-F", &lo.dev]);
        let m = Mount::new(&lo.dev, &work.path().join("mnt"));
        let before = write_files(&m.dir, "before-", 40);
        run_ok("sync", &[]);
        // Taken while mounted: crash-consistent, as a power cut would leave it.
        c.cli_ok(&["snapshot", "create", "snap", "--volume", "src"]);
        let after = write_files(&m.dir, "after-", 10);
        run_ok("sync", &[]);
        (before, after)
    };

    let out = c.cli_ok(&[
        "volume",
        "create",
        "dev",
        "--from",
        "snap",
        "--replicas",
        "3",
    ]);
    assert!(out.contains("created"), "{out}");
    let dev = c.volume("dev");
    assert_eq!(dev.size_bytes, 128 << 20, "the source's size by default");
    let show = c.cli_ok(&["volume", "show", "dev"]);
    assert!(show.contains("a clone of snapshot snap"), "{show}");
    assert_eq!(
        dev.replicas.iter().filter(|r| r.blank).count(),
        1,
        "{dev:?}"
    );
    c.cli_ok(&["volume", "attach", "dev", "--node", "n3"]);
    let dev_uri = c.volume("dev").nbd_unix_uri.expect("unix URI");
    let got = mount_read_fsck(&dev_uri, work.path(), "dev");
    assert_eq!(
        got, before,
        "the clone has exactly the files of before the snapshot"
    );
    assert!(after.keys().all(|k| !got.contains_key(k)));
    wait_until(
        "the clone's blank replica to sync",
        Duration::from_secs(60),
        || in_sync(&c, "dev") == 3,
    );

    // A clone of a volume has its latest data (a snapshot of it is taken, then dropped).
    c.cli_ok(&["volume", "detach", "src"]);
    c.cli_ok(&[
        "volume",
        "create",
        "copy",
        "--from",
        "volume:src",
        "--replicas",
        "2",
    ]);
    c.cli_ok(&["volume", "attach", "copy", "--node", "n2"]);
    let copy_uri = c.volume("copy").nbd_unix_uri.expect("unix URI");
    let mut all = before.clone();
    all.extend(after);
    assert_eq!(mount_read_fsck(&copy_uri, work.path(), "copy"), all);
    let left = c.cli_ok(&["snapshot", "list"]);
    assert!(!left.contains("clone-"), "{left}");

    // The source goes, snapshot and all: the clone stays whole.
    c.cli_ok(&["snapshot", "delete", "snap"]);
    c.cli_ok(&["volume", "delete", "src"]);
    c.cli_ok(&["volume", "detach", "dev"]);
    c.cli_ok(&["volume", "attach", "dev", "--node", "n2"]);
    let dev_uri = c.volume("dev").nbd_unix_uri.expect("unix URI");
    assert_eq!(mount_read_fsck(&dev_uri, work.path(), "dev-again"), before);
}
