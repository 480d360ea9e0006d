//! Expanding a volume through the REST API against fake agents: every replica grows, then
//! the record, then (attached) the engine; bad sizes, shrinking, a node whose device cannot
//! grow, an offline node and a failing agent are refused with the record unchanged.
#![allow(clippy::unwrap_used)]

use crate::common::{code, replicas_of, Cluster, Op, GIB};
use serde_json::json;

/// A volume body's replicas as (id, node).
fn replica_ids(v: &serde_json::Value) -> Vec<(String, String)> {
    replicas_of(v)
        .into_iter()
        .map(|(id, node, _, _)| (id, node))
        .collect()
}

/// Replica grow calls the fake agents got.
fn grow_calls(c: &Cluster) -> usize {
    c.agents
        .iter()
        .flat_map(|a| a.calls())
        .filter(|x| x.contains("/replicas/") && x.contains("/grow"))
        .count()
}

/// Engine grow calls, in order.
fn engine_grow_calls(c: &Cluster) -> Vec<String> {
    c.agents
        .iter()
        .flat_map(|a| a.calls())
        .filter(|x| x.contains("/engines/") && x.contains("/grow"))
        .collect()
}

#[tokio::test]
async fn a_detached_volume_grows_every_replica_then_its_record() {
    let c = Cluster::start(3).await;
    let (_, v) = c.create("v", GIB, 2).await;
    let (status, v2) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 3 * GIB}))
        .await;
    assert_eq!((status, &v2["size_bytes"]), (200, &json!(3 * GIB)), "{v2}");
    for (id, node) in replica_ids(&v) {
        assert_eq!(
            c.agent(&node).replica_size(&id),
            Some(3 * GIB),
            "{id} on {node}"
        );
    }
    assert_eq!(c.volume("v").await["size_bytes"], 3 * GIB);
    // The same size again is a no-op that asks no agent anything (CSI retries).
    let calls = c.agent("n1").calls().len() + c.agent("n2").calls().len();
    let (status, _) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 3 * GIB}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        c.agent("n1").calls().len() + c.agent("n2").calls().len(),
        calls
    );
    // The next engine serves the new size.
    c.post("/v1/volumes/v/attach", json!({"node": "n3"})).await;
    assert_eq!(c.agent("n3").engine("v").unwrap().size_bytes, 3 * GIB);
}

#[tokio::test]
async fn an_attached_volume_grows_replicas_then_record_then_engine() {
    let c = Cluster::start(2).await;
    c.create("v", GIB, 2).await;
    c.post("/v1/volumes/v/attach", json!({"node": "n1"})).await;
    let (status, v) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 2 * GIB}))
        .await;
    assert_eq!((status, &v["size_bytes"]), (200, &json!(2 * GIB)), "{v}");
    // Asked first whether it can, then told, after every replica grew.
    let calls = c.agent("n1").calls();
    let at = |what: &str| calls.iter().position(|x| x.contains(what)).unwrap();
    let check = at(&format!("/v1/engines/v/grow {} check", 2 * GIB));
    let grow = calls
        .iter()
        .rposition(|x| x == &format!("POST /v1/engines/v/grow {}", 2 * GIB))
        .unwrap();
    let replica = at("/v1/replicas/");
    assert!(check < replica && replica < grow, "{calls:?}");
    assert_eq!(grow_calls(&c), 2);
    assert_eq!(c.agent("n1").engine("v").unwrap().size_bytes, 2 * GIB);
    // An engine that did not hear of a grow (its agent failed) hears of it on a retry.
    c.agent("n1").fail(Op::GrowEngine, true);
    let (status, e) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 3 * GIB}))
        .await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("retry"), "{e}");
    c.agent("n1").fail(Op::GrowEngine, false);
    let (status, _) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 3 * GIB}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(c.agent("n1").engine("v").unwrap().size_bytes, 3 * GIB);
}

#[tokio::test]
async fn bad_sizes_shrinking_and_devices_that_cannot_grow_are_refused() {
    let c = Cluster::start(2).await;
    c.create("v", 2 * GIB, 2).await;
    for (body, want) in [
        (json!({"size_bytes": 0}), "invalid_argument"),
        (json!({"size_bytes": 3 * GIB + 1}), "invalid_argument"),
        (json!({"size_bytes": GIB}), "invalid_argument"),
        (json!({"size": 3 * GIB}), "invalid_argument"),
    ] {
        let (status, e) = c.post("/v1/volumes/v/expand", body.clone()).await;
        assert_eq!((status, code(&e)), (400, want), "{body}: {e}");
    }
    let (_, e) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": GIB}))
        .await;
    assert!(e["message"].as_str().unwrap().contains("shrinking"), "{e}");
    let (status, e) = c
        .post("/v1/volumes/nope/expand", json!({"size_bytes": 4 * GIB}))
        .await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    c.post("/v1/volumes/v/attach", json!({"node": "n1"})).await;
    c.agent("n1").fail(Op::GrowEngineCannot, true);
    let (status, e) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 4 * GIB}))
        .await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("ublk") && msg.contains("detach"), "{e}");
    assert_eq!(c.volume("v").await["size_bytes"], 2 * GIB);
    assert_eq!(grow_calls(&c), 0, "a refused expand asked an agent to grow");
    assert_eq!(
        engine_grow_calls(&c),
        [format!("POST /v1/engines/v/grow {} check", 4 * GIB)]
    );
}

#[tokio::test]
async fn a_failing_agent_leaves_the_record_as_it_was() {
    let c = Cluster::start(2).await;
    c.create("v", GIB, 2).await;
    c.agent("n2").fail(Op::GrowReplica, true);
    let (status, e) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 2 * GIB}))
        .await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("n2"), "{e}");
    assert_eq!(c.volume("v").await["size_bytes"], GIB);
    // Retried once the agent works: the replica already grown is a no-op for it.
    c.agent("n2").fail(Op::GrowReplica, false);
    let (status, v) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 2 * GIB}))
        .await;
    assert_eq!((status, &v["size_bytes"]), (200, &json!(2 * GIB)), "{v}");
}

#[tokio::test]
async fn an_offline_replica_node_refuses_the_expand_before_anything_grows() {
    let c = Cluster::start_with(2, 1).await;
    c.create("v", GIB, 2).await;
    c.until_every_node_is_offline().await;
    let (status, e) = c
        .post("/v1/volumes/v/expand", json!({"size_bytes": 2 * GIB}))
        .await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("offline"), "{e}");
    assert_eq!(grow_calls(&c), 0);
    assert_eq!(c.volume("v").await["size_bytes"], GIB);
}
