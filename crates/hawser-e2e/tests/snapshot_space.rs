//! What snapshots cost on disk. On an XFS pool with reflinks, 100 snapshots of a 1 GiB
//! volume, each after 1 MiB more of new writes, must take less than twice the volume's data
//! (each snapshot shares the replica's extents; only blocks written after it are copied). On
//! ext4 the fallback copies: correct (checked byte for byte) and its cost (space and the time
//! writes were held) is printed.

use std::path::Path;

use hawser_e2e::cluster::{Cluster, ClusterOptions};
use hawser_e2e::mounts::SmallFs;
use hawser_e2e::run::{qemu_io, TempDir};

const MIB: u64 = 1 << 20;

/// Where the write before snapshot `i` goes, in MiB.
fn offset_mib(i: u64) -> u64 {
    (i * 7) % 1000
}

/// Two agents, each with its pool in a directory of `fs`.
fn cluster_on(fs: &SmallFs, name: &str) -> Cluster {
    let pools = ["a", "b"]
        .iter()
        .map(|n| vec![format!("default={}", fs.mount.dir.join(n).display())])
        .collect();
    let opts = ClusterOptions {
        pools,
        ..ClusterOptions::default()
    };
    Cluster::start_with(name, 2, opts)
}

/// Takes `n` snapshots of `v`, writing 1 MiB of new data at a new offset before each; returns
/// the pauses (µs) and how they were copied.
fn take(c: &Cluster, uri: &str, n: u64) -> (Vec<u64>, Vec<String>) {
    let mut pauses = Vec::new();
    let mut hows = Vec::new();
    for i in 0..n {
        let at = format!("{}M", offset_mib(i));
        qemu_io(uri, &[&format!("write -P 0x{:02x} {at} 1M", (i % 250) + 1)]);
        let name = format!("s{i}");
        c.cli_ok(&["snapshot", "create", &name, "--volume", "v"]);
        let s = c.snapshot(&name);
        pauses.push(s.pause_micros.expect("attached: paused"));
        hows.push(s.how.expect("how"));
    }
    (pauses, hows)
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[test]
fn a_hundred_snapshots_on_xfs_share_their_extents() {
    let work = TempDir::new("snap-xfs");
    let fs = SmallFs::xfs(work.path(), 6 * 1024);
    let c = cluster_on(&fs, "snap-xfs");
    let uri = c.attached_volume("v", "1GiB", 2, "n1");
    qemu_io(&uri, &["write -P 0x5a 0 1G", "flush"]);
    let before = fs.used_bytes();
    let (mut pauses, hows) = take(&c, &uri, 100);
    qemu_io(&uri, &["flush"]);
    let used = fs.used_bytes() - before;
    // Both replicas' data is 2 GiB plus the 100 MiB written meanwhile (twice).
    let data = 2 * (1024 + 100) * MIB;
    println!(
        "snapshot space on xfs (reflink): 100 snapshots of a 1 GiB volume on 2 replicas used \
         {} MiB beyond the volume's {} MiB ({:.2}x of the data); writes held median {} µs, \
         max {} µs",
        used / MIB,
        2048,
        (used + 2048 * MIB) as f64 / data as f64,
        median(&mut pauses),
        pauses.iter().max().copied().unwrap_or(0)
    );
    assert!(hows.iter().all(|h| h == "reflink"), "{hows:?}");
    assert!(
        used + 2048 * MIB < 2 * data,
        "100 snapshots took {} MiB beyond the volume's data",
        used / MIB
    );
    // The first and the last snapshot still hold what they should.
    let check = |name: &str, at: &str, pattern: u64| {
        let s = c.snapshot(name);
        for r in &s.replicas {
            let copy = c
                .replica_path(r)
                .with_extension("snaps")
                .join(format!("{}.snap", s.id));
            let out = qemu_io(
                &copy.display().to_string(),
                &[&format!("read -P 0x{pattern:02x} {at} 1M")],
            );
            assert!(!out.contains("verification failed"), "{name} on {r}: {out}");
        }
    };
    check("s0", "0M", 1);
    check("s99", &format!("{}M", offset_mib(99)), 100);
    check("s0", "7M", 0x5a);
}

#[test]
fn on_ext4_snapshots_are_full_copies_and_cost_is_printed() {
    let work = TempDir::new("snap-space");
    let fs = SmallFs::new(work.path(), 2 * 1024);
    let c = cluster_on(&fs, "snap-ext4");
    let uri = c.attached_volume("v", "256MiB", 2, "n1");
    qemu_io(&uri, &["write -P 0x5a 0 128M", "flush"]);
    let before = fs.used_bytes();
    let (mut pauses, hows) = take(&c, &uri, 5);
    let used = fs.used_bytes() - before;
    println!(
        "snapshot space on ext4 (copy): 5 snapshots of 128 MiB of data on 2 replicas used \
         {} MiB; writes held median {} µs, max {} µs",
        used / MIB,
        median(&mut pauses),
        pauses.iter().max().copied().unwrap_or(0)
    );
    assert!(hows.iter().all(|h| h == "copy"), "{hows:?}");
    // Each snapshot is a full copy of the data on each replica.
    assert!(used >= 2 * 5 * 128 * MIB, "{} MiB", used / MIB);
    // The pools report them (with the agents' next heartbeat): 10 copies, their space.
    let mut pools = Vec::new();
    hawser_e2e::wait_until(
        "the pools to report the snapshots",
        std::time::Duration::from_secs(30),
        || {
            pools = serde_json::from_str::<Vec<hawser_api::controller::PoolInfo>>(
                &c.cli_ok(&["pool", "list", "-o", "json"]),
            )
            .expect("JSON");
            pools.iter().map(|p| p.snapshots).sum::<u32>() == 10
        },
    );
    let reported: u64 = pools.iter().map(|p| p.snapshot_bytes).sum();
    assert!(reported >= 2 * 5 * 128 * MIB, "{} MiB", reported / MIB);
    println!(
        "pools report {} snapshot copies, {} MiB",
        10,
        reported / MIB
    );
    let s = c.snapshot("s4");
    let copies: Vec<Vec<u8>> = s
        .replicas
        .iter()
        .map(|r| {
            let p = c
                .replica_path(r)
                .with_extension("snaps")
                .join(format!("{}.snap", s.id));
            std::fs::read(Path::new(&p)).expect("read copy")
        })
        .collect();
    assert!(copies[0] == copies[1]);
    let mib = 1usize << 20;
    let at = 28 * mib; // offset_mib(4)
    assert_eq!(offset_mib(4), 28);
    assert!(copies[0][at..at + mib].iter().all(|&b| b == 5));
}
