//! Checksums at rest (issue 21, acceptance a): blocks changed behind Hawser's back in one
//! replica's data file while the volume is attached read back right every time, are repaired
//! from the other replica, and are counted; a scrub finds and repairs blocks changed on both
//! replicas at different offsets, which no read met; the same block changed on every replica
//! is reported unrecoverable (an I/O error, and by the scrub), never returned as good data.
//!
//! `HAWSER_BIN=$PWD/target/release/hawser cargo test --release -p hawser-e2e --test checksums`

use std::os::unix::fs::FileExt;
use std::time::Duration;

use hawser_api::agent::EngineReplicaStatus;
use hawser_e2e::nbd_client::{NbdConn, NbdTarget};
use hawser_e2e::{wait_until, Cluster};
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;
const BLOCK_USIZE: usize = 4096;
/// The written area: 16 MiB, 4096 blocks.
const AREA: u64 = 16 << 20;
const ROTTED: usize = 100;

fn connect(c: &Cluster, volume: &str) -> NbdConn {
    let uri = c.volume(volume).nbd_unix_uri.expect("attached");
    NbdConn::connect(&NbdTarget::from_unix_uri(&uri)).expect("connect")
}

fn pattern(seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; usize::try_from(AREA).expect("fits")];
    rng.fill(&mut v[..]);
    v
}

/// Change one byte of each block at `blocks` in a data file, as a failing disk would.
fn rot(path: &std::path::Path, blocks: &[u64]) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open a replica's data file");
    for &b in blocks {
        let at = b * BLOCK + 1234;
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, at).expect("read");
        f.write_all_at(&[byte[0] ^ 0x5a], at).expect("rot");
    }
    f.sync_all().expect("sync");
}

/// The engine's counts for replica `id`.
fn counts(c: &Cluster, volume: &str, id: &str) -> EngineReplicaStatus {
    c.volume(volume)
        .replicas
        .into_iter()
        .find(|r| r.id == id)
        .and_then(|r| r.engine)
        .unwrap_or_else(|| panic!("no engine view of replica {id}"))
}

fn read_all(conn: &mut NbdConn, want: &[u8]) {
    let mut got = vec![0u8; 1 << 20];
    for (i, chunk) in want.chunks(1 << 20).enumerate() {
        let at = i as u64 * (1 << 20);
        conn.read_at(at, &mut got).expect("read");
        if got != chunk {
            let bad = got.iter().zip(chunk).position(|(a, b)| a != b).unwrap_or(0);
            panic!("wrong data read at byte {}", at + bad as u64);
        }
    }
}

#[test]
fn rotted_blocks_read_right_are_repaired_and_counted_and_rot_everywhere_is_an_error() {
    let c = Cluster::start("sums", 2);
    c.cli_ok(&[
        "volume",
        "create",
        "rot",
        "--size",
        "64MiB",
        "--replicas",
        "2",
        "--checksums",
        "on",
    ]);
    let v = c.volume("rot");
    assert!(v.checksums);
    // Attached beside one replica, which serves its reads: that one rots.
    let local = v.replicas[0].clone();
    let other = v.replicas[1].clone();
    c.cli_ok(&["volume", "attach", "rot", "--node", &local.node]);
    let want = pattern(21);
    let mut conn = connect(&c, "rot");
    for (i, chunk) in want.chunks(1 << 20).enumerate() {
        conn.write_at(i as u64 * (1 << 20), chunk).expect("write");
    }

    // 100 random blocks of the local replica, while attached.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut blocks: Vec<u64> = Vec::new();
    while blocks.len() < ROTTED {
        let b = rng.random_range(0..AREA / BLOCK);
        if !blocks.contains(&b) {
            blocks.push(b);
        }
    }
    let local_path = c.replica_path(&local.id);
    rot(&local_path, &blocks);

    read_all(&mut conn, &want);
    wait_until("100 repairs", Duration::from_secs(30), || {
        counts(&c, "rot", &local.id).corrupt_repaired_blocks >= ROTTED as u64
    });
    let seen = counts(&c, "rot", &local.id);
    assert_eq!(
        (
            seen.corrupt_found_blocks,
            seen.corrupt_repaired_blocks,
            seen.corrupt_unrecoverable_blocks
        ),
        (ROTTED as u64, ROTTED as u64, 0),
        "{seen:?}"
    );
    assert_eq!(seen.state, "in_sync", "a repaired replica stays in sync");
    // Repaired on disk, and read right again with nothing more found.
    let on_disk = std::fs::read(&local_path).expect("read the data file");
    assert!(
        on_disk[..want.len()] == want[..],
        "the rotted blocks were rewritten"
    );
    read_all(&mut conn, &want);
    assert_eq!(
        counts(&c, "rot", &local.id).corrupt_found_blocks,
        ROTTED as u64
    );

    // A scrub: blocks rot on both replicas at different offsets, in the written area and in
    // the holes past it, and no read meets them. One pass finds and repairs every one.
    let other_path = c.replica_path(&other.id);
    let local_rot: Vec<u64> = (0..20).map(|i| 7 + i * 191).collect();
    let other_rot: Vec<u64> = (0..20).map(|i| 11 + i * 613).collect();
    rot(&local_path, &local_rot);
    rot(&other_path, &other_rot);
    let out = c.cli_ok(&["volume", "scrub", "rot"]);
    assert!(out.contains("being scrubbed"), "{out}");
    let finished = || {
        c.volume("rot")
            .engine
            .and_then(|e| e.scrub)
            .filter(|s| !s.running)
    };
    wait_until("the scrub pass", Duration::from_secs(60), || {
        finished().is_some()
    });
    let pass = finished().expect("a finished pass");
    assert_eq!(
        (
            pass.found_blocks,
            pass.repaired_blocks,
            pass.unrecoverable_blocks
        ),
        (40, 40, 0),
        "{pass:?}"
    );
    assert_eq!(pass.scrubbed_bytes, pass.size_bytes);
    let mut whole = want.clone();
    whole.resize(64 << 20, 0);
    for path in [&local_path, &other_path] {
        let on_disk = std::fs::read(path).expect("read a data file");
        assert!(
            on_disk == whole,
            "{} holds every block right again",
            path.display()
        );
    }
    let status = c.cli_ok(&["status"]);
    assert!(
        status.contains("40 bad blocks found, 40 repaired"),
        "{status}"
    );

    // The same block rots on both replicas: its read fails, never returns other data; the
    // blocks around it read right; a scrub reports it unrecoverable; a write over it heals
    // it.
    rot(&local_path, &[10]);
    rot(&other_path, &[10]);
    let mut buf = vec![0u8; BLOCK_USIZE];
    let err = conn
        .read_at(10 * BLOCK, &mut buf)
        .expect_err("a block bad everywhere is an error");
    assert!(err.to_string().contains("NBD error"), "{err}");
    conn.read_at(11 * BLOCK, &mut buf).expect("the next block");
    assert!(buf[..] == want[11 * 4096..12 * 4096]);
    wait_until("the unrecoverable count", Duration::from_secs(30), || {
        counts(&c, "rot", &local.id).corrupt_unrecoverable_blocks >= 1
    });
    c.cli_ok(&["volume", "scrub", "rot"]);
    wait_until("the second scrub pass", Duration::from_secs(60), || {
        finished().is_some_and(|s| s.unrecoverable_blocks > 0)
    });
    let pass = finished().expect("a finished pass");
    assert_eq!(
        (pass.found_blocks, pass.repaired_blocks),
        (pass.unrecoverable_blocks, 0),
        "{pass:?}"
    );
    let status = c.cli_ok(&["status"]);
    assert!(status.contains("UNRECOVERABLE"), "{status}");
    let fresh = vec![0x77u8; BLOCK_USIZE];
    conn.write_at(10 * BLOCK, &fresh)
        .expect("rewrite the block");
    conn.read_at(10 * BLOCK, &mut buf)
        .expect("read the rewritten block");
    assert_eq!(buf, fresh);
    assert_eq!(counts(&c, "rot", &local.id).state, "in_sync");
    conn.disconnect();
    c.cli_ok(&["volume", "detach", "rot"]);
}
