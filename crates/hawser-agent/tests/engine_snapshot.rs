//! Snapshots of an attached volume without the control plane: the engine is paused (requests
//! in flight finish, new ones wait, every replica flushed), each in-sync replica takes its
//! snapshot, the engine resumes. The snapshots of both replicas are identical and hold every
//! write acknowledged before the pause and none issued during it; a pause whose lease runs
//! out lets requests through and its late resume is refused.

use std::sync::Arc;
use std::time::Duration;

use crate::node_support::two_nodes;
use bytes::Bytes;
use hawser_agent::engine::registry::pause::PauseError;
use hawser_agent::frontends::block::{BlockDevice, ExportRegistry};
use hawser_agent::storage::pools::NodeStorage;

const SIZE: u64 = 16 << 20;

fn snapshot_bytes(n: &NodeStorage, replica: &str, snap: &str) -> Vec<u8> {
    let r = n.replica(replica).expect("replica");
    std::fs::read(r.snapshot_file(snap).expect("snapshot file")).expect("read snapshot")
}

fn data_bytes(n: &NodeStorage, replica: &str) -> Vec<u8> {
    std::fs::read(n.replica(replica).expect("replica").data_path()).expect("read data")
}

/// Polls `cond` every 5 ms for up to 10 s (a real condition, not a guessed delay).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_volume_snapshots_the_same_point_on_every_replica() {
    let t = two_nodes("engine-snapshot", SIZE).await;
    let dev: Arc<dyn BlockDevice> = t.engines.lookup("vol").expect("export");
    // Acknowledged before the pause: in the snapshot.
    dev.write(0, Bytes::from(vec![1u8; 65536]), false)
        .await
        .expect("write");
    dev.write(4 << 20, Bytes::from(vec![2u8; 4096]), false)
        .await
        .expect("write");
    let paused = t
        .engines
        .pause("vol", Duration::from_secs(30))
        .await
        .expect("pause");
    assert_eq!(paused.epoch, 1);
    assert_eq!(paused.in_sync.len(), 2, "{paused:?}");
    assert!(matches!(
        t.engines.pause("vol", Duration::from_secs(1)).await,
        Err(PauseError::Paused(_))
    ));
    // Issued during the pause: it waits at the gate (counted in flight) and reaches no
    // replica until the resume.
    let late = tokio::spawn({
        let dev = dev.clone();
        async move { dev.write(0, Bytes::from(vec![9u8; 4096]), false).await }
    });
    until("the write during the pause to be in flight", || {
        t.engines.io_counters("a")[0].in_flight == 1
    })
    .await;
    assert!(!late.is_finished());
    for (n, id) in [(&t.a, "vol-a"), (&t.b, "vol-b")] {
        let taken = n.take_snapshot(id, paused.epoch, "s1").expect("snapshot");
        assert!(taken.kind.is_some());
        assert_eq!(data_bytes(n, id)[0], 1, "{id}: the paused write reached it");
    }
    let resumed = t
        .engines
        .resume("vol", paused.pause_id)
        .await
        .expect("resume");
    assert!(resumed.held_micros > 0);
    late.await
        .expect("join")
        .expect("the held write succeeds after the resume");
    assert!(matches!(
        t.engines.resume("vol", paused.pause_id).await,
        Err(PauseError::Expired(_))
    ));

    let (sa, sb) = (
        snapshot_bytes(&t.a, "vol-a", "s1"),
        snapshot_bytes(&t.b, "vol-b", "s1"),
    );
    assert!(sa == sb, "the replicas' snapshots differ");
    assert!(
        sa[..65536].iter().all(|&x| x == 1),
        "acknowledged before: in it"
    );
    assert!(sa[4 << 20..(4 << 20) + 4096].iter().all(|&x| x == 2));
    assert_eq!(
        data_bytes(&t.a, "vol-a")[..4096],
        [9u8; 4096],
        "the volume moved on"
    );
    assert!(t.engines.stop("vol").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_whose_lease_runs_out_lets_requests_through_and_refuses_its_resume() {
    let t = two_nodes("engine-pause-lease", SIZE).await;
    let dev: Arc<dyn BlockDevice> = t.engines.lookup("vol").expect("export");
    let paused = t
        .engines
        .pause("vol", Duration::from_millis(100))
        .await
        .expect("pause");
    // The write waits for the lease, then goes through without any resume.
    dev.write(0, Bytes::from(vec![7u8; 4096]), false)
        .await
        .expect("write after the lease");
    assert!(matches!(
        t.engines.resume("vol", paused.pause_id).await,
        Err(PauseError::Expired(_))
    ));
    // A new pause can be taken and resumed.
    let again = t
        .engines
        .pause("vol", Duration::from_secs(30))
        .await
        .expect("pause again");
    assert_ne!(again.pause_id, paused.pause_id);
    t.engines
        .resume("vol", again.pause_id)
        .await
        .expect("resume");
    assert!(matches!(
        t.engines.pause("nope", Duration::from_secs(1)).await,
        Err(PauseError::NotFound(_))
    ));
    assert!(t.engines.stop("vol").await);
}

/// A replica that lacks a snapshot fetches it from the other node's replica server through a
/// read-only snapshot session: the copy equals the holder's byte for byte, only the blocks
/// that differed crossed, and an unknown snapshot or replica is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lacking_replica_fetches_a_snapshot_from_a_holder_by_its_differing_blocks() {
    use hawser_agent::replica::snapshot_fetch::fetch_snapshot;
    use hawser_wire::grant::HelloSnapshotRequest;
    let t = two_nodes("snapshot-fetch", SIZE).await;
    let dev: Arc<dyn BlockDevice> = t.engines.lookup("vol").expect("export");
    dev.write(0, Bytes::from(vec![1u8; 1 << 20]), false)
        .await
        .expect("write");
    // Only b's replica takes the snapshot (as if a's had been outdated then).
    let b = t.b.replica("vol-b").expect("replica b");
    b.take_snapshot(1, "s1").expect("snapshot on b");
    // Written since: a's data differs from the snapshot in one 64 KiB block.
    dev.write(128 << 10, Bytes::from(vec![9u8; 4096]), false)
        .await
        .expect("write");
    let addr = t.req.replicas[1].replica_addr.clone();
    let hello = |snapshot: &str, replica: &str| HelloSnapshotRequest {
        replica: replica.into(),
        snapshot: snapshot.into(),
        grant: None,
    };
    let fetched = fetch_snapshot(&t.a, "vol-a", &addr, None, hello("s1", "vol-b"))
        .await
        .expect("fetch");
    assert_eq!(fetched.compared_bytes, SIZE);
    assert_eq!(
        fetched.fetched_bytes,
        64 << 10,
        "only the block written since"
    );
    assert!(
        snapshot_bytes(&t.a, "vol-a", "s1") == snapshot_bytes(&t.b, "vol-b", "s1"),
        "the fetched copy is the holder's"
    );
    for (snap, replica) in [("nope", "vol-b"), ("s1", "nope")] {
        let e = fetch_snapshot(&t.a, "vol-a", &addr, None, hello(snap, replica))
            .await
            .expect_err("refused");
        assert!(e.contains("NoSuchReplica"), "{e}");
    }
}
