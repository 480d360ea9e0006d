//! The outdate path, the safety-critical one: every branch through the API, and concurrent
//! reports about the two replicas of a 2-replica volume.
#![allow(clippy::unwrap_used)]

use crate::common::{code, Cluster, GIB};
use hawser_api::controller::ReplicaState;
use serde_json::{json, Value};

/// A 2- or 3-replica volume attached to n1 at epoch 1; returns its replica ids.
async fn attached(c: &Cluster, name: &str, replicas: u32) -> Vec<String> {
    let (status, v) = c.create(name, GIB, replicas).await;
    assert_eq!(status, 201, "{v}");
    let (status, v) = c
        .post(&format!("/v1/volumes/{name}/attach"), json!({"node": "n1"}))
        .await;
    assert_eq!((status, v["epoch"].as_u64()), (200, Some(1)), "{v}");
    ids(&v)
}

fn ids(v: &Value) -> Vec<String> {
    v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().into())
        .collect()
}

fn states(v: &Value) -> Vec<String> {
    v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["state"].as_str().unwrap().into())
        .collect()
}

async fn outdate(c: &Cluster, volume: &str, id: &str, epoch: u64) -> (u16, Value) {
    let path = format!("/v1/volumes/{volume}/replicas/{id}/outdate");
    c.post(&path, json!({"epoch": epoch, "reason": "write timed out"}))
        .await
}

#[tokio::test]
async fn outdate_succeeds_and_is_idempotent() {
    let c = Cluster::start(3).await;
    let ids = attached(&c, "v", 3).await;
    let (status, v) = outdate(&c, "v", &ids[1], 1).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(states(&v), ["in_sync", "outdated", "in_sync"]);
    assert_eq!(
        v["nbd_uri"], "nbd://127.0.0.1:10809/v",
        "the answer is the full volume view"
    );
    let (status, v) = outdate(&c, "v", &ids[1], 1).await;
    assert_eq!(
        (status, states(&v)),
        (
            200,
            vec!["in_sync".into(), "outdated".into(), "in_sync".into()]
        )
    );
    // The next attach gives the engine every replica with its state: it writes to the
    // in-sync ones and resyncs the outdated one.
    c.post("/v1/volumes/v/detach", json!({})).await;
    c.post("/v1/volumes/v/attach", json!({"node": "n2"})).await;
    let engine = c.agent("n2").engine("v").unwrap();
    let in_engine: Vec<(&str, ReplicaState)> = engine
        .replicas
        .iter()
        .map(|r| (r.replica_id.as_str(), r.state))
        .collect();
    assert_eq!(
        in_engine,
        [
            (ids[0].as_str(), ReplicaState::InSync),
            (ids[1].as_str(), ReplicaState::Outdated),
            (ids[2].as_str(), ReplicaState::InSync)
        ]
    );
    // The new engine (epoch 2) resynced it: in-sync again. The old epoch may not.
    let (status, _) = post_in_sync(&c, "v", &ids[1], 1).await;
    assert_eq!(status, 409);
    let (status, v) = post_in_sync(&c, "v", &ids[1], 2).await;
    assert_eq!(status, 200);
    assert_eq!(states(&v), vec!["in_sync", "in_sync", "in_sync"]);
}

async fn post_in_sync(c: &Cluster, vol: &str, id: &str, epoch: u64) -> (u16, Value) {
    c.post(
        &format!("/v1/volumes/{vol}/replicas/{id}/in-sync"),
        json!({ "epoch": epoch }),
    )
    .await
}

#[tokio::test]
async fn stale_epoch_is_refused() {
    let c = Cluster::start(2).await;
    let ids = attached(&c, "v", 2).await;
    // A re-attach fences the epoch-1 engine.
    c.post("/v1/volumes/v/detach", json!({})).await;
    c.post("/v1/volumes/v/attach", json!({"node": "n2"})).await;
    for epoch in [1, 3, 0] {
        let (status, e) = outdate(&c, "v", &ids[0], epoch).await;
        assert_eq!(
            (status, code(&e)),
            (409, "stale_epoch"),
            "epoch {epoch}: {e}"
        );
    }
    assert_eq!(states(&c.volume("v").await), ["in_sync", "in_sync"]);
    assert_eq!(outdate(&c, "v", &ids[0], 2).await.0, 200);
}

#[tokio::test]
async fn last_in_sync_replica_is_never_outdated() {
    let c = Cluster::start(2).await;
    let ids = attached(&c, "v", 2).await;
    assert_eq!(outdate(&c, "v", &ids[0], 1).await.0, 200);
    let (status, e) = outdate(&c, "v", &ids[1], 1).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("last in-sync"),
        "{e}"
    );
    assert_eq!(states(&c.volume("v").await), ["outdated", "in_sync"]);
    // Single-replica volumes: never.
    let ids = attached(&c, "solo", 1).await;
    assert_eq!(outdate(&c, "solo", &ids[0], 1).await.0, 409);
}

#[tokio::test]
async fn unknown_volume_or_replica_and_bad_body() {
    let c = Cluster::start(2).await;
    attached(&c, "v", 2).await;
    let (status, e) = outdate(&c, "v", "nope", 1).await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, e) = outdate(&c, "nope", "x", 1).await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, e) = c
        .post("/v1/volumes/v/replicas/x/outdate", json!({"epoch": "1"}))
        .await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_outdates_of_both_replicas_exactly_one_wins() {
    let c = Cluster::start(2).await;
    for round in 0..10 {
        let name = format!("v{round}");
        let ids = attached(&c, &name, 2).await;
        let (a, b) = tokio::join!(
            outdate(&c, &name, &ids[0], 1),
            outdate(&c, &name, &ids[1], 1)
        );
        let ok: Vec<u16> = [a.0, b.0].into_iter().filter(|s| *s == 200).collect();
        assert_eq!(ok.len(), 1, "round {round}: {a:?} {b:?}");
        let loser = if a.0 == 200 { &b } else { &a };
        assert_eq!((loser.0, code(&loser.1)), (409, "conflict"), "{loser:?}");
        let v = c.volume(&name).await;
        let s = states(&v);
        assert_eq!(s.iter().filter(|s| *s == "in_sync").count(), 1, "{v}");
    }
}
