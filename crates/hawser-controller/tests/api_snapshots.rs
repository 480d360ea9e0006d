//! Snapshots through the REST API against fake agents: the order of the agent calls (pause,
//! a copy on every in-sync replica, resume), names, idempotent retries, a failed copy rolled
//! back everywhere, a detached volume's snapshot without a pause, deletes, and a volume
//! with snapshots guarded against deletion.
#![allow(clippy::unwrap_used)]

use crate::common::{code, eventually, replicas_of, Cluster, Op, GIB};
use serde_json::json;

fn agent_calls(c: &Cluster, what: &str) -> Vec<String> {
    c.agents
        .iter()
        .flat_map(|a| a.calls())
        .filter(|x| x.contains(what))
        .collect()
}

fn copies(c: &Cluster) -> usize {
    c.agents.iter().map(|a| a.snapshots().len()).sum()
}

#[tokio::test]
async fn an_attached_volume_is_paused_copied_on_every_replica_and_resumed() {
    let c = Cluster::start(2).await;
    assert_eq!(c.create("db", GIB, 2).await.0, 201);
    let (s, v) = c.post("/v1/volumes/db/attach", json!({"node": "n1"})).await;
    assert_eq!(s, 200, "{v}");
    let (s, snap) = c
        .post("/v1/snapshots", json!({"name": "s1", "volume": "db"}))
        .await;
    assert_eq!(s, 201, "{snap}");
    assert_eq!(snap["state"], "ready");
    assert_eq!(snap["volume"], "db");
    assert_eq!(snap["size_bytes"], GIB);
    assert_eq!(snap["pause_micros"], 42);
    assert_eq!(snap["how"], "reflink");
    let id = snap["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("s1-"), "{id}");
    let mut holders: Vec<String> = snap["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    holders.sort();
    let mut replicas: Vec<String> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    replicas.sort();
    assert_eq!(holders, replicas, "every in-sync replica holds it");
    // Pause, then both copies, then resume: on the engine's node, in that order.
    let n1 = c.agent("n1").calls();
    let at = |what: &str| n1.iter().position(|x| x.contains(what)).unwrap();
    assert!(at("/pause") < at("/resume"), "{n1:?}");
    assert_eq!(agent_calls(&c, "/snapshots ").len(), 2);
    assert!(c.agents.iter().all(|a| a.paused().is_empty()), "resumed");
    assert_eq!(copies(&c), 2);

    // The same request again: the same snapshot, nothing copied again.
    let (s, again) = c
        .post("/v1/snapshots", json!({"name": "s1", "volume": "db"}))
        .await;
    assert_eq!((s, &again), (201, &snap));
    assert_eq!(agent_calls(&c, "/snapshots ").len(), 2);
    // The name is the cluster's: another volume cannot take it.
    assert_eq!(c.create("web", GIB, 1).await.0, 201);
    let (s, e) = c
        .post("/v1/snapshots", json!({"name": "s1", "volume": "web"}))
        .await;
    assert_eq!((s, code(&e)), (409, "already_exists"), "{e}");
    for (name, volume, want) in [("Bad", "db", 400), ("x", "nope", 404), ("", "db", 400)] {
        let (s, e) = c
            .post("/v1/snapshots", json!({"name": name, "volume": volume}))
            .await;
        assert_eq!(s, want, "{name:?} of {volume:?}: {e}");
    }

    // Listed, shown; listing a volume that does not exist is an error.
    let (_, list) = c.get("/v1/snapshots?volume=db").await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    let (s, _) = c.get("/v1/snapshots?volume=nope").await;
    assert_eq!(s, 404);
    let (s, shown) = c.get("/v1/snapshots/s1").await;
    assert_eq!((s, &shown), (200, &snap));

    // Its volume is not deleted from under it.
    c.post("/v1/volumes/db/detach", json!({})).await;
    let (s, e) = c.delete("/v1/volumes/db").await;
    assert_eq!((s, code(&e)), (409, "conflict"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("s1"), "{e}");

    // Deleting it removes every copy.
    let (s, _) = c.delete("/v1/snapshots/s1").await;
    assert_eq!(s, 204);
    assert_eq!(copies(&c), 0);
    let (s, _) = c.get("/v1/snapshots/s1").await;
    assert_eq!(s, 404);
    let (s, _) = c.delete("/v1/volumes/db").await;
    assert_eq!(s, 204);
}

/// A delete that a node did not answer leaves the snapshot `deleting`; once the node
/// answers again the reconcile round finishes it, with no retry by hand, and the volume can
/// be deleted.
#[tokio::test]
async fn a_snapshot_left_deleting_is_discarded_when_its_nodes_answer() {
    let c = Cluster::start(2).await;
    assert_eq!(c.create("db", GIB, 2).await.0, 201);
    let (s, snap) = c
        .post("/v1/snapshots", json!({"name": "s1", "volume": "db"}))
        .await;
    assert_eq!(s, 201, "{snap}");
    assert_eq!(copies(&c), 2);
    c.agent("n2").fail(Op::DeleteSnapshot, true);
    let (s, e) = c.delete("/v1/snapshots/s1").await;
    assert_eq!(s, 503, "{e}");
    let (s, shown) = c.get("/v1/snapshots/s1").await;
    assert_eq!(
        (s, shown["state"].as_str()),
        (200, Some("deleting")),
        "{shown}"
    );
    c.agent("n2").fail(Op::DeleteSnapshot, false);
    eventually(30, || async {
        c.get("/v1/snapshots/s1").await.0 == 404 && copies(&c) == 0
    })
    .await;
    let (s, _) = c.delete("/v1/volumes/db").await;
    assert_eq!(s, 204);
}

#[tokio::test]
async fn a_failed_copy_fails_the_snapshot_and_leaves_nothing() {
    let c = Cluster::start(2).await;
    assert_eq!(c.create("db", GIB, 2).await.0, 201);
    c.post("/v1/volumes/db/attach", json!({"node": "n1"})).await;
    c.agent("n2").fail(Op::TakeSnapshot, true);
    let (s, e) = c
        .post("/v1/snapshots", json!({"name": "s1", "volume": "db"}))
        .await;
    assert_eq!((s, code(&e)), (503, "unavailable"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("n2"), "{e}");
    assert_eq!(copies(&c), 0, "the copy that was made is deleted");
    assert!(c.agents.iter().all(|a| a.paused().is_empty()), "resumed");
    let (_, list) = c.get("/v1/snapshots").await;
    assert_eq!(list, json!([]));
    // Once the agent works again the name is free.
    c.agent("n2").fail(Op::TakeSnapshot, false);
    let (s, snap) = c
        .post("/v1/snapshots", json!({"name": "s1", "volume": "db"}))
        .await;
    assert_eq!(s, 201, "{snap}");
    // A pause that fails fails the snapshot before any copy.
    c.agent("n1").fail(Op::PauseEngine, true);
    let (s, _) = c
        .post("/v1/snapshots", json!({"name": "s2", "volume": "db"}))
        .await;
    assert_eq!(s, 503);
    assert_eq!(copies(&c), 2, "only s1's");
}

#[tokio::test]
async fn a_detached_volume_needs_no_pause_and_goes_with_its_snapshots_when_asked() {
    let c = Cluster::start(2).await;
    assert_eq!(c.create("db", GIB, 2).await.0, 201);
    let (s, snap) = c
        .post("/v1/snapshots", json!({"name": "cold", "volume": "db"}))
        .await;
    assert_eq!(s, 201, "{snap}");
    assert!(snap.get("pause_micros").is_none(), "{snap}");
    assert!(agent_calls(&c, "/pause").is_empty());
    assert_eq!(copies(&c), 2);
    let (s, _) = c.delete("/v1/volumes/db?with_snapshots=true").await;
    assert_eq!(s, 204);
    let (_, list) = c.get("/v1/snapshots").await;
    assert_eq!(list, json!([]));
    let (s, _) = c.delete("/v1/volumes/nope?with_snapshots=maybe").await;
    assert_eq!(s, 400);
}

#[tokio::test]
async fn a_clone_is_seeded_from_the_snapshot_on_its_holders_and_blank_elsewhere() {
    let c = Cluster::start(3).await;
    let (_, v) = c
        .post(
            "/v1/volumes",
            json!({"name": "db", "size_bytes": GIB, "replicas": 2, "prefer_node": "n1"}),
        )
        .await;
    let src: Vec<(String, String, String, bool)> = replicas_of(&v);
    let (s, snap) = c
        .post("/v1/snapshots", json!({"name": "s1", "volume": "db"}))
        .await;
    assert_eq!(s, 201, "{snap}");
    let snap_id = snap["id"].as_str().unwrap().to_string();

    // Three replicas from a snapshot on two: two seeded where the copies are, one blank.
    let (s, clone) = c
        .post(
            "/v1/volumes",
            json!({"name": "dev", "size_bytes": 2 * GIB, "replicas": 3, "from": {"snapshot": "s1"}}),
        )
        .await;
    assert_eq!(s, 201, "{clone}");
    assert_eq!(clone["size_bytes"], 2 * GIB);
    assert_eq!(
        clone["origin"],
        json!({"snapshot": "s1"}),
        "the clone names its source"
    );
    let reps = replicas_of(&clone);
    assert_eq!(reps.len(), 3);
    for (id, node, state, blank) in &reps {
        let made = c.agent(node).replica(id).unwrap();
        assert!(
            made.checksums,
            "a clone's own default: its copies are summed at create"
        );
        match &made.from {
            Some(f) => {
                assert_eq!(f.snapshot, snap_id);
                let holder = src.iter().find(|h| h.0 == f.replica_id).unwrap();
                assert_eq!(&holder.1, node, "seeded on the holder's node");
                assert_eq!((state.as_str(), *blank), ("in_sync", false));
            }
            None => {
                assert!(src.iter().all(|h| h.1 != *node), "{node} holds no copy");
                assert_eq!((state.as_str(), *blank), ("outdated", true));
            }
        }
    }
    assert_eq!(reps.iter().filter(|r| !r.3).count(), 2);

    // Errors: too small, unknown, both or neither source.
    for (from, size, want) in [
        (json!({"snapshot": "s1"}), GIB / 2, 400), // smaller than the snapshot
        (json!({"snapshot": "nope"}), GIB, 404),
        (json!({"snapshot": "s1", "volume": "db"}), GIB, 400),
        (json!({}), GIB, 400),
    ] {
        let body = json!({"name": "bad", "size_bytes": size, "replicas": 1, "from": from});
        let (s, e) = c.post("/v1/volumes", body).await;
        assert_eq!(s, want, "{from}: {e}");
    }
    assert!(!c.volume_names().await.contains(&"bad".to_string()));

    // From a volume: a snapshot of it is taken for the clone, then deleted.
    let (s, cv) = c
        .post(
            "/v1/volumes",
            json!({"name": "copy", "size_bytes": GIB, "replicas": 2, "from": {"volume": "db"},
                "checksums": false}),
        )
        .await;
    assert_eq!(s, 201, "{cv}");
    // Its own choice, not its source's.
    assert_eq!(cv["checksums"], false, "{cv}");
    for (id, node, _, _) in replicas_of(&cv) {
        assert!(!c.agent(&node).replica(&id).unwrap().checksums, "{id}");
    }
    assert!(replicas_of(&cv).iter().all(|r| r.2 == "in_sync"), "{cv}");
    assert_eq!(
        cv["origin"],
        json!({"volume": "db"}),
        "as asked, not its snapshot"
    );
    let (_, list) = c.get("/v1/snapshots").await;
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["s1"], "the clone's snapshot is gone");
    assert_eq!(copies(&c), 2, "only s1's copies are left");
}

/// A volume body's replicas as (id, state, blank).
fn replica_states(v: &serde_json::Value) -> Vec<(String, String, bool)> {
    replicas_of(v)
        .into_iter()
        .map(|(id, _, state, blank)| (id, state, blank))
        .collect()
}

/// Restore: the holders are restored and in sync, a replica that lacks the snapshot is
/// blank; a restore that stops half-way leaves the volume `restoring` (no attach, no
/// snapshot) until the same request finishes it; attached volumes, other volumes' snapshots
/// and unknown ones are refused.
#[tokio::test]
async fn a_restore_makes_the_holders_the_in_sync_set_and_finishes_when_asked_again() {
    let c = Cluster::start(2).await;
    assert_eq!(c.create("db", GIB, 2).await.0, 201);
    let (s, v) = c.post("/v1/volumes/db/attach", json!({"node": "n1"})).await;
    assert_eq!(s, 200, "{v}");
    let ids: Vec<String> = replica_states(&v).into_iter().map(|r| r.0).collect();
    // One replica misses writes: the snapshot is on the other only.
    let path = format!("/v1/volumes/db/replicas/{}/outdate", ids[1]);
    let (s, e) = c
        .post(&path, json!({"epoch": 1, "reason": "write timed out"}))
        .await;
    assert_eq!(s, 200, "{e}");
    let (s, snap) = c
        .post("/v1/snapshots", json!({"name": "s1", "volume": "db"}))
        .await;
    assert_eq!(s, 201, "{snap}");
    assert_eq!(snap["replicas"], json!([ids[0]]));
    let restore = |name: &str| json!({ "snapshot": name });
    let (s, e) = c.post("/v1/volumes/db/restore", restore("s1")).await;
    assert_eq!((s, code(&e)), (409, "conflict"), "attached: {e}");
    assert!(e["message"].as_str().unwrap().contains("detach"), "{e}");
    assert_eq!(c.post("/v1/volumes/db/detach", json!({})).await.0, 200);

    // Stopped half-way: every replica out of the in-sync set, the volume marked.
    c.agent("n1").fail(Op::RestoreReplica, true);
    c.agent("n2").fail(Op::RestoreReplica, true);
    let (s, e) = c.post("/v1/volumes/db/restore", restore("s1")).await;
    assert!(s >= 500, "{s} {e}");
    let (_, v) = c.get("/v1/volumes/db").await;
    assert_eq!(v["restoring"], "s1", "{v}");
    assert!(
        replica_states(&v).iter().all(|r| r.1 == "outdated"),
        "no replica is in sync half-way: {v}"
    );
    let (s, e) = c.post("/v1/volumes/db/attach", json!({"node": "n1"})).await;
    assert_eq!(s, 409, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("hawser volume restore db --snapshot s1"),
        "{e}"
    );
    let (s, e) = c
        .post("/v1/snapshots", json!({"name": "s2", "volume": "db"}))
        .await;
    assert_eq!(s, 409, "no snapshot of a half-restored volume: {e}");
    c.agent("n1").fail(Op::RestoreReplica, false);
    c.agent("n2").fail(Op::RestoreReplica, false);

    // The same request finishes it: the holder in sync, the other blank.
    let (s, v) = c.post("/v1/volumes/db/restore", restore("s1")).await;
    assert_eq!(s, 200, "{v}");
    assert!(v.get("restoring").is_none(), "{v}");
    let states = replica_states(&v);
    let want = vec![
        (ids[0].clone(), "in_sync".to_string(), false),
        (ids[1].clone(), "outdated".to_string(), true),
    ];
    assert_eq!(states, want);
    let restores = agent_calls(&c, "/restore ");
    assert!(
        restores.iter().all(|x| x.contains(&ids[0])),
        "only the holder is restored: {restores:?}"
    );
    assert_eq!(
        c.post("/v1/volumes/db/attach", json!({"node": "n1"}))
            .await
            .0,
        200
    );
    assert_eq!(c.post("/v1/volumes/db/detach", json!({})).await.0, 200);

    // Unknown snapshots, and another volume's.
    let (s, e) = c.post("/v1/volumes/db/restore", restore("nope")).await;
    assert_eq!((s, code(&e)), (404, "not_found"), "{e}");
    assert_eq!(c.create("web", GIB, 1).await.0, 201);
    let (s, e) = c.post("/v1/volumes/web/restore", restore("s1")).await;
    assert_eq!((s, code(&e)), (400, "invalid_argument"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("clone it"), "{e}");
}
