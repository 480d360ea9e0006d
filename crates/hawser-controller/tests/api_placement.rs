//! Placement through the REST API against fake agents (issue 4, acceptance f): zones, full
//! pools, thick and thin accounting, locality, balancing, pool selector, offline nodes.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use crate::common::{code, eventually, pool, Cluster, FakeAgent, GIB};
use hawser_api::controller::{PoolInfo, PoolKind};
use serde_json::{json, Value};

/// Registers (or heartbeats) `agent` with these pools and labels.
async fn heartbeat(c: &Cluster, agent: &FakeAgent, pools: Vec<PoolInfo>, labels: Value) {
    let (status, body) = c
        .put(
            &format!("/v1/nodes/{}", agent.node),
            json!({
                "admin_addr": agent.addr.to_string(),
                "replica_addr": "127.0.0.1:9600",
                "nbd_addr": null,
                "nbd_socket": null,
                "pools": pools,
                "labels": labels,
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}

/// Labels every node of `c` with `zone=<zones[i]>`, keeping its 100 GiB pool.
async fn zones(c: &Cluster, zones: &[&str]) {
    for (agent, zone) in c.agents.iter().zip(zones) {
        let pools = vec![pool(&agent.node, 100 * GIB, 100 * GIB)];
        heartbeat(c, agent, pools, json!({ "zone": zone })).await;
    }
}

async fn create(c: &Cluster, body: Value) -> (u16, Value) {
    c.post("/v1/volumes", body).await
}

fn nodes_of(v: &Value) -> Vec<String> {
    v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].as_str().unwrap().to_string())
        .collect()
}

fn message(e: &Value) -> &str {
    e["message"].as_str().unwrap()
}

#[tokio::test]
async fn two_zones_three_replicas_strict_by_default_or_preferred() {
    let c = Cluster::start(3).await;
    zones(&c, &["a", "a", "b"]).await;
    let (status, e) = c.create("v3", GIB, 3).await;
    assert_eq!((status, code(&e)), (507, "insufficient_capacity"), "{e}");
    assert_eq!(
        message(&e),
        "need 3 replicas in 3 different zones (zone spread strict), but the nodes with room \
         for a 1 GiB thin replica are in 2 zones: a (n1, n2), b (n3); add room in another \
         zone, create fewer replicas, or create with zone spread preferred"
    );
    assert!(
        c.all_replicas().is_empty(),
        "a refused create makes nothing"
    );
    // Two replicas: one per zone, and the volume records the spread it got.
    let (status, v) = c.create("v2", GIB, 2).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(nodes_of(&v), ["n1", "n3"]);
    assert_eq!(v["placement"]["zone_spread"], "strict");
    // Preferred spread: both zones, then a second replica in zone a.
    let (status, v) = create(
        &c,
        json!({"name": "p3", "size_bytes": GIB, "replicas": 3, "zone_spread": "preferred"}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let mut nodes = nodes_of(&v);
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2", "n3"]);
    assert_eq!(v["placement"]["zone_spread"], "preferred");
    assert_eq!(c.volume("p3").await["placement"], v["placement"]);
}

#[tokio::test]
async fn strict_spread_skips_unlabelled_nodes_and_none_ignores_zones() {
    let c = Cluster::start(3).await;
    zones(&c, &["a", "b"]).await;
    let (status, e) = c.create("v", GIB, 3).await;
    assert_eq!(status, 507, "{e}");
    assert!(
        message(&e).ends_with("not usable: n3 (no zone label)"),
        "{e}"
    );
    let (status, v) = create(
        &c,
        json!({"name": "v", "size_bytes": GIB, "replicas": 3, "zone_spread": "none"}),
    )
    .await;
    assert_eq!(
        (status, v["placement"]["zone_spread"].as_str()),
        (201, Some("none"))
    );
    // Without any zone label the default is none.
    let plain = Cluster::start(2).await;
    let (_, v) = plain.create("v", GIB, 2).await;
    assert_eq!(v["placement"]["zone_spread"], "none", "{v}");
}

#[tokio::test]
async fn full_pools_are_skipped_and_named() {
    let c = Cluster::start(3).await;
    let n1 = c.agent("n1");
    heartbeat(&c, n1, vec![pool("n1", 100 * GIB, 5 * GIB)], json!({})).await;
    let thick = |name: &str, replicas: u32| json!({"name": name, "size_bytes": 10 * GIB, "replicas": replicas, "thin": false});
    let (status, v) = create(&c, thick("two", 2)).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(nodes_of(&v), ["n2", "n3"]);
    let (status, e) = create(&c, thick("three", 3)).await;
    assert_eq!((status, code(&e)), (507, "insufficient_capacity"), "{e}");
    assert!(
        message(&e).contains("not usable: n1 (pool default: 5 GiB free)"),
        "{e}"
    );
}

#[tokio::test]
async fn thick_needs_free_space_thin_the_overprovision_limit() {
    // Two nodes, 100 GiB pools with 100 GiB free, overprovision ratio 2: 200 GiB thin limit.
    let c = Cluster::start(2).await;
    let body = |name: &str, gib: u64, thin: bool| json!({"name": name, "size_bytes": gib * GIB, "replicas": 2, "thin": thin});
    let (status, e) = create(&c, body("thick", 150, false)).await;
    assert_eq!(status, 507, "{e}");
    assert!(
        message(&e).contains("n1 (pool default: 100 GiB free)"),
        "{e}"
    );
    assert_eq!(create(&c, body("thin1", 150, true)).await.0, 201);
    // The first create is not reported by any heartbeat yet; its reservation still counts.
    let (status, e) = create(&c, body("thin2", 60, true)).await;
    assert_eq!(status, 507, "{e}");
    assert!(
        message(&e).contains("n1 (pool default: 50 GiB left of its 200 GiB thin limit)"),
        "{e}"
    );
    assert_eq!(create(&c, body("thin2", 50, true)).await.0, 201);
    // Thin replicas took no free space: a thick one still fits.
    assert_eq!(create(&c, body("thick", 60, false)).await.0, 201);
    // The agents now report all of it (twice, so the reservations expire): same answer.
    for _ in 0..2 {
        for a in &c.agents {
            let mut p = pool(&a.node, 100 * GIB, 40 * GIB);
            p.provisioned_bytes = 260 * GIB;
            p.replicas = 3;
            heartbeat(&c, a, vec![p], json!({})).await;
        }
    }
    let (status, e) = create(&c, body("more", 1, true)).await;
    assert_eq!(status, 507, "{e}");
    assert!(
        message(&e).contains("0 B left of its 200 GiB thin limit"),
        "{e}"
    );
    assert_eq!(create(&c, body("more", 40, false)).await.0, 201);
}

#[tokio::test]
async fn pool_kind_limits_what_a_pool_takes() {
    let c = Cluster::start(2).await;
    let mut thin_only = pool("n1", 100 * GIB, 100 * GIB);
    thin_only.kind = PoolKind::Thin;
    heartbeat(&c, c.agent("n1"), vec![thin_only], json!({})).await;
    let (status, e) = create(
        &c,
        json!({"name": "v", "size_bytes": GIB, "replicas": 2, "thin": false}),
    )
    .await;
    assert_eq!(status, 507, "{e}");
    assert!(
        message(&e).contains("n1 (pool default: thin replicas only)"),
        "{e}"
    );
    let (_, pools) = c.get("/v1/pools").await;
    assert_eq!(pools[0]["kind"], "thin");
    assert_eq!(pools[1]["kind"], "any");
    assert_eq!(c.create("v", GIB, 2).await.0, 201, "thin goes anywhere");
}

#[tokio::test]
async fn preferred_node_gets_a_replica() {
    let c = Cluster::start(3).await;
    // n3 has the least room, so only the preference puts a replica there.
    heartbeat(
        &c,
        c.agent("n3"),
        vec![pool("n3", 100 * GIB, 20 * GIB)],
        json!({}),
    )
    .await;
    let body = |name: &str, node: &str| {
        json!({"name": name, "size_bytes": GIB, "replicas": 2, "thin": false,
               "prefer_node": node})
    };
    let (status, v) = create(&c, body("local", "n3")).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(nodes_of(&v), ["n3", "n1"]);
    assert_eq!(v["placement"]["prefer_node"], "n3");
    // A preferred node that cannot take a replica is a preference, not a requirement.
    heartbeat(&c, c.agent("n3"), vec![pool("n3", 100 * GIB, 0)], json!({})).await;
    let (status, v) = create(&c, body("elsewhere", "n3")).await;
    assert_eq!(status, 201, "{v}");
    assert!(!nodes_of(&v).contains(&"n3".to_string()), "{v}");
    // An unknown node is a mistake in the request.
    let (status, e) = create(&c, body("typo", "n9")).await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
    assert_eq!(message(&e), "prefer_node \"n9\" is not a registered node");
    let (status, e) = create(&c, body("bad", "N 1")).await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
}

#[tokio::test]
async fn repeated_creates_balance_over_nodes() {
    let c = Cluster::start(3).await;
    for i in 0..6 {
        let (status, v) = c.create(&format!("v{i}"), 10 * GIB, 2).await;
        assert_eq!(status, 201, "{v}");
    }
    let per_node: BTreeMap<&str, usize> = c
        .agents
        .iter()
        .map(|a| (a.node.as_str(), a.replicas().len()))
        .collect();
    assert_eq!(per_node, BTreeMap::from([("n1", 4), ("n2", 4), ("n3", 4)]));
}

#[tokio::test]
async fn pool_selector_uses_only_that_pool() {
    let c = Cluster::start(3).await;
    for node in ["n1", "n2"] {
        let mut ssd = pool(node, 10 * GIB, 10 * GIB);
        ssd.name = "ssd".into();
        let pools = vec![pool(node, 100 * GIB, 100 * GIB), ssd];
        heartbeat(&c, c.agent(node), pools, json!({})).await;
    }
    let body = |name: &str, replicas: u32| json!({"name": name, "size_bytes": GIB, "replicas": replicas, "pool": "ssd"});
    let (status, v) = create(&c, body("fast", 2)).await;
    assert_eq!(status, 201, "{v}");
    let pools: Vec<&str> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pool"].as_str().unwrap())
        .collect();
    assert_eq!(pools, ["ssd", "ssd"]);
    assert_eq!(v["placement"]["pool"], "ssd");
    let (status, e) = create(&c, body("fast3", 3)).await;
    assert_eq!(status, 507, "{e}");
    assert!(message(&e).contains("in pool ssd, found 2"), "{e}");
    assert!(
        message(&e).contains("n3 (no pool ssd (has default))"),
        "{e}"
    );
    let (status, e) = create(
        &c,
        json!({"name": "x", "size_bytes": GIB, "replicas": 1, "pool": "../etc"}),
    )
    .await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
}

#[tokio::test]
async fn offline_nodes_get_no_replicas() {
    let c = Cluster::start_with(3, 2).await;
    eventually(10, || async {
        let (_, n) = c.get("/v1/nodes/n3").await;
        n["state"] == "offline"
    })
    .await;
    for node in ["n1", "n2"] {
        let pools = vec![pool(node, 100 * GIB, 100 * GIB)];
        heartbeat(&c, c.agent(node), pools, json!({})).await;
    }
    let (status, e) = c.create("v", GIB, 3).await;
    assert_eq!(status, 507, "{e}");
    assert!(message(&e).ends_with("not usable: n3 (offline)"), "{e}");
    let (status, v) = c.create("v", GIB, 2).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(nodes_of(&v), ["n1", "n2"]);
}

#[tokio::test]
async fn labels_are_stored_shown_and_checked() {
    let c = Cluster::start(1).await;
    let n1 = c.agent("n1");
    let pools = vec![pool("n1", 100 * GIB, 100 * GIB)];
    heartbeat(&c, n1, pools.clone(), json!({"zone": "a", "rack": "r1"})).await;
    let (_, n) = c.get("/v1/nodes/n1").await;
    assert_eq!(n["labels"], json!({"rack": "r1", "zone": "a"}));
    let (_, list) = c.get("/v1/nodes").await;
    assert_eq!(list[0]["labels"]["zone"], "a");
    for labels in [
        json!({"zone": ""}),
        json!({"bad key": "a"}),
        json!({"zone": 1}),
        json!(["zone=a"]),
    ] {
        let (status, e) = c
            .put(
                "/v1/nodes/n1",
                json!({"admin_addr": n1.addr.to_string(), "replica_addr": "h:1",
                       "nbd_addr": null, "nbd_socket": null, "pools": pools,
                       "labels": labels}),
            )
            .await;
        assert_eq!(
            (status, code(&e)),
            (400, "invalid_argument"),
            "{labels}: {e}"
        );
    }
    let (_, n) = c.get("/v1/nodes/n1").await;
    assert_eq!(
        n["labels"]["zone"], "a",
        "a refused heartbeat changes nothing"
    );
}
