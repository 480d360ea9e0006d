//! Tests of the embedded store's own file: durability across reopen, one opener, corrupt
//! and left-over files, the log. What every backend must do (compare-and-swap, conditional
//! deletes, list order, concurrent writers, leases, watches) is the conformance suite
//! (hawser-testkit's store_conformance), which runs on this backend too.
#![allow(clippy::unwrap_used)]

use hawser_store::{get_json, put_json, EmbeddedStore, Expect, Store, StoreError};

fn open(dir: &tempfile::TempDir) -> EmbeddedStore {
    EmbeddedStore::open(dir.path().join("store.json")).unwrap()
}

#[tokio::test]
async fn persists_across_reopen_and_versions_keep_growing() {
    let dir = tempfile::tempdir().unwrap();
    let binary = vec![0u8, 255, 1, 2];
    let last = {
        let s = open(&dir);
        put_json(&s, "nodes/n1", &serde_json::json!({"x": 1}), Expect::Absent)
            .await
            .unwrap();
        s.put("blob", binary.clone(), Expect::Any).await.unwrap();
        s.put("gone", b"1".to_vec(), Expect::Any).await.unwrap();
        s.delete("gone", Expect::Any).await.unwrap();
        s.put("x", b"1".to_vec(), Expect::Any).await.unwrap()
    };
    let s = open(&dir);
    let (v, _): (serde_json::Value, u64) = get_json(&s, "nodes/n1").await.unwrap().unwrap();
    assert_eq!(v, serde_json::json!({"x": 1}));
    assert_eq!(s.get("blob").await.unwrap().unwrap().value, binary);
    assert_eq!(s.get("gone").await.unwrap(), None);
    assert_eq!(s.get("x").await.unwrap().unwrap().version, last);
    // Five mutations (the delete counts) and the counter survived the reopen.
    assert_eq!(last, 5);
    let next = s.put("y", b"1".to_vec(), Expect::Any).await.unwrap();
    assert_eq!(next, 6);
}

#[tokio::test]
async fn second_open_of_same_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _s = open(&dir);
    let err = EmbeddedStore::open(dir.path().join("store.json"))
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
}

#[test]
fn corrupt_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.json");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = EmbeddedStore::open(&path).unwrap();
        s.put("volumes/a", b"{\"size\":4096}".to_vec(), Expect::Any)
            .await
            .unwrap();
    });
    let good = std::fs::read(&path).unwrap();
    let mut flipped = good.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x01;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() - 5].to_vec()),
        ("bit flip", flipped),
        ("empty", Vec::new()),
        ("garbage", b"not a store at all\n{}".to_vec()),
        (
            "header only",
            good[..good.iter().position(|&b| b == b'\n').unwrap()].to_vec(),
        ),
    ];
    for (what, bytes) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let err = EmbeddedStore::open(&path)
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"));
        assert!(matches!(err, StoreError::Corrupt { .. }), "{what}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
    }
    // And the good file still opens.
    std::fs::write(&path, &good).unwrap();
    EmbeddedStore::open(&path).unwrap();
}

#[tokio::test]
async fn leftover_tmp_file_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(&dir);
        s.put("a", b"1".to_vec(), Expect::Any).await.unwrap();
    }
    // A crash between writing the temp file and the rename leaves it behind.
    std::fs::write(dir.path().join("store.json.tmp"), b"half-written").unwrap();
    let s = open(&dir);
    assert_eq!(s.get("a").await.unwrap().unwrap().value, b"1");
    s.put("b", b"2".to_vec(), Expect::Any).await.unwrap();
}

fn log_path(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("store.json.log")
}

/// A write after the first goes to the log, not into a rewritten snapshot, and a reopen
/// replays it.
#[tokio::test]
async fn writes_append_to_the_log_and_a_reopen_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("store.json");
    let last = {
        let s = open(&dir);
        s.put("a", b"1".to_vec(), Expect::Any).await.unwrap();
        let first = std::fs::read(&snapshot).unwrap();
        s.put("b", vec![0, 255], Expect::Any).await.unwrap();
        s.put("a", b"2".to_vec(), Expect::Any).await.unwrap();
        s.delete("b", Expect::Any).await.unwrap();
        let last = s.put("c", b"3".to_vec(), Expect::Any).await.unwrap();
        assert_eq!(
            std::fs::read(&snapshot).unwrap(),
            first,
            "snapshot rewritten"
        );
        assert!(std::fs::metadata(log_path(&dir)).unwrap().len() > 0);
        last
    };
    let s = open(&dir);
    assert_eq!(s.get("a").await.unwrap().unwrap().value, b"2");
    assert_eq!(s.get("b").await.unwrap(), None);
    assert_eq!(s.get("c").await.unwrap().unwrap().version, last);
    assert_eq!(s.revision().await.unwrap(), last);
    let read = EmbeddedStore::read_file(&snapshot).unwrap();
    assert_eq!(read.keys().collect::<Vec<_>>(), ["a", "c"]);
}

/// Once the log outgrows the snapshot (and 1 MiB), a write folds it into a new snapshot and
/// empties it. A crash between the snapshot's rename and the emptying leaves records the
/// snapshot holds: the next open skips them, and later records append after them.
#[tokio::test]
async fn the_log_folds_into_a_snapshot_and_stale_records_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let value = vec![b'x'; 64 << 10];
    let mut before_fold = Vec::new();
    let mut folded_at = None;
    for i in 0..40u32 {
        let log = std::fs::read(log_path(&dir)).unwrap_or_default();
        let v = s
            .put(&format!("k{i:02}"), value.clone(), Expect::Any)
            .await
            .unwrap();
        if std::fs::metadata(log_path(&dir)).unwrap().len() < log.len() as u64 {
            before_fold = log;
            folded_at = Some(v);
            break;
        }
    }
    let folded_at = folded_at.expect("the log never folded");
    // At the write that took the log past 1 MiB (the snapshot was smaller).
    let crossed = before_fold.len() + value.len();
    assert!(
        before_fold.len() < 1 << 20 && crossed > 1 << 20,
        "folded at {}",
        before_fold.len()
    );
    drop(s);
    // The crash: the old records are back in the log.
    std::fs::write(log_path(&dir), &before_fold).unwrap();
    let s = open(&dir);
    assert_eq!(s.revision().await.unwrap(), folded_at);
    let next = s.put("after", b"1".to_vec(), Expect::Any).await.unwrap();
    assert_eq!(next, folded_at + 1);
    drop(s);
    let s = open(&dir);
    assert_eq!(s.get("after").await.unwrap().unwrap().version, next);
    assert_eq!(s.list("k").await.unwrap().len() as u64, folded_at);
}

/// A crash in the middle of an append leaves part of a record, never acknowledged: the open
/// cuts it off, and the store goes on from the last whole record.
#[tokio::test]
async fn an_unfinished_log_record_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let kept = {
        let s = open(&dir);
        s.put("a", b"1".to_vec(), Expect::Any).await.unwrap();
        s.put("b", b"1".to_vec(), Expect::Any).await.unwrap()
    };
    let whole = std::fs::read(log_path(&dir)).unwrap();
    let mut torn = whole.clone();
    torn.extend_from_slice(&whole[..whole.len() / 2]);
    std::fs::write(log_path(&dir), &torn).unwrap();
    {
        let s = open(&dir);
        assert_eq!(s.revision().await.unwrap(), kept);
        assert_eq!(std::fs::read(log_path(&dir)).unwrap(), whole);
        s.put("c", b"1".to_vec(), Expect::Any).await.unwrap();
    }
    let s = open(&dir);
    assert_eq!(s.list("").await.unwrap().len(), 3);
}

/// Damage the open must not paper over: a bad record with good ones after it (acknowledged
/// writes would be lost), and a log whose snapshot was deleted.
#[test]
fn a_damaged_log_or_one_without_its_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("store.json");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = open(&dir);
        for k in ["a", "b", "c"] {
            s.put(k, b"1".to_vec(), Expect::Any).await.unwrap();
        }
    });
    let good = std::fs::read(log_path(&dir)).unwrap();
    let mut flipped = good.clone();
    let at = good.iter().position(|&b| b == b'{').unwrap() + 3;
    flipped[at] ^= 0x01;
    std::fs::write(log_path(&dir), &flipped).unwrap();
    let err = EmbeddedStore::open(&snapshot).err().expect("opened");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("store.json.log"), "{err}");

    std::fs::write(log_path(&dir), &good).unwrap();
    let saved = std::fs::read(&snapshot).unwrap();
    std::fs::remove_file(&snapshot).unwrap();
    let err = EmbeddedStore::open(&snapshot).err().expect("opened");
    assert!(err.to_string().contains("do not belong together"), "{err}");
    std::fs::write(&snapshot, saved).unwrap();
    EmbeddedStore::open(&snapshot).unwrap();
}

/// A write whose caller goes away mid-call (an HTTP handler whose client hung up drops its
/// future at any await) still finishes whole: the log reopens, and what the store showed
/// before the reopen is what it holds after. Before, a put dropped while its log record was
/// being written left the log's length unrecorded, the next record overwrote it, and the
/// file no longer opened ("record at offset 0 has revision 3, expected 2").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_caller_goes_away_finishes_whole() {
    use std::future::Future;
    for polls in 1..=4 {
        let dir = tempfile::tempdir().unwrap();
        let s = open(&dir);
        s.put("a", b"1".to_vec(), Expect::Any).await.unwrap();
        {
            let mut dropped = Box::pin(s.put("b", b"2".to_vec(), Expect::Any));
            for _ in 0..polls {
                std::future::poll_fn(|cx| {
                    let _ = dropped.as_mut().poll(cx);
                    std::task::Poll::Ready(())
                })
                .await;
                tokio::task::yield_now().await;
            }
        }
        // The next writes queue behind the dropped one's lock, so they come after it.
        s.put("c", b"3".to_vec(), Expect::Any).await.unwrap();
        s.delete("a", Expect::Any).await.unwrap();
        let shown = s.get("b").await.unwrap().map(|v| v.value);
        assert_eq!(shown.as_deref(), Some(&b"2"[..]), "after {polls} polls");
        drop(s);
        let s = open(&dir);
        assert_eq!(s.get("b").await.unwrap().map(|v| v.value), shown);
        assert_eq!(s.get("c").await.unwrap().unwrap().value, b"3");
        assert!(s.get("a").await.unwrap().is_none());
    }
}
