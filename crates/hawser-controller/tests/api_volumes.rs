//! Volume lifecycle through the REST API against fake agents: create, attach, detach,
//! delete, placement, and rollback when an agent fails.
#![allow(clippy::unwrap_used)]

use crate::common::{code, eventually, pool, Cluster, Op, GIB};
use serde_json::json;

#[tokio::test]
async fn create_attach_detach_delete() {
    let c = Cluster::start(3).await;
    let (status, v) = c.create("demo", 10 * GIB, 2).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["state"], "detached");
    assert_eq!(v["epoch"], 0);
    assert_eq!(v["thin"], true);
    let replicas = v["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2);
    assert_ne!(
        replicas[0]["node"], replicas[1]["node"],
        "replicas on distinct nodes"
    );
    for r in replicas {
        assert_eq!(r["state"], "in_sync");
        let id = r["id"].as_str().unwrap();
        assert!(id.starts_with("demo-r"), "{id}");
        let node = r["node"].as_str().unwrap();
        assert_eq!(
            c.agent(node).replicas(),
            [id.to_string()],
            "replica exists on its node"
        );
    }
    assert_eq!(c.volume_names().await, ["demo"]);

    // Attach: a new epoch, an engine with both replicas, NBD addresses.
    let (status, v) = c
        .post("/v1/volumes/demo/attach", json!({"node": "n3"}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "attached");
    assert_eq!(v["attached_node"], "n3");
    assert_eq!(v["epoch"], 1);
    assert_eq!(v["nbd_uri"], "nbd://127.0.0.1:10809/demo");
    assert_eq!(
        v["nbd_unix_uri"],
        "nbd+unix:///demo?socket=/run/hawser/n3.sock"
    );
    let engine = c.agent("n3").engine("demo").unwrap();
    assert_eq!(engine.epoch, 1);
    assert_eq!(engine.size_bytes, 10 * GIB);
    assert_eq!(engine.replicas.len(), 2);
    assert_eq!(engine.controller_url, c.url);
    assert_eq!(
        c.volume("demo").await["nbd_uri"],
        "nbd://127.0.0.1:10809/demo"
    );

    // Attaching again to the same node is a no-op; to another node is a conflict.
    let (status, v) = c
        .post("/v1/volumes/demo/attach", json!({"node": "n3"}))
        .await;
    assert_eq!((status, v["epoch"].as_u64()), (200, Some(1)), "{v}");
    let (status, e) = c
        .post("/v1/volumes/demo/attach", json!({"node": "n1"}))
        .await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    // Deleting an attached volume is refused.
    let (status, e) = c.delete("/v1/volumes/demo").await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("detach it first"),
        "{e}"
    );

    let (status, v) = c.post("/v1/volumes/demo/detach", json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "detached");
    assert_eq!(v["nbd_uri"], serde_json::Value::Null);
    assert!(c.agent("n3").engine("demo").is_none(), "engine stopped");
    // Detach is idempotent; a re-attach gets a higher epoch.
    assert_eq!(c.post("/v1/volumes/demo/detach", json!({})).await.0, 200);
    let (_, v) = c
        .post("/v1/volumes/demo/attach", json!({"node": "n1"}))
        .await;
    assert_eq!(v["epoch"], 2);
    assert_eq!(c.post("/v1/volumes/demo/detach", json!({})).await.0, 200);

    let (status, _) = c.delete("/v1/volumes/demo").await;
    assert_eq!(status, 204);
    assert!(c.all_replicas().is_empty());
    assert!(c.volume_names().await.is_empty());
    let (status, e) = c.get("/v1/volumes/demo").await;
    assert_eq!((status, code(&e)), (404, "not_found"));
    let (status, e) = c.delete("/v1/volumes/demo").await;
    assert_eq!((status, code(&e)), (404, "not_found"));
}

#[tokio::test]
async fn duplicate_name_is_already_exists() {
    let c = Cluster::start(2).await;
    assert_eq!(c.create("a", GIB, 1).await.0, 201);
    let (status, e) = c.create("a", GIB, 1).await;
    assert_eq!((status, code(&e)), (409, "already_exists"), "{e}");
    assert_eq!(c.all_replicas().len(), 1, "the duplicate created nothing");
}

#[tokio::test]
async fn replica_failure_rolls_everything_back() {
    let c = Cluster::start(3).await;
    // Whichever node gets the second replica fails it; the first must be deleted again.
    c.agent("n2").fail(Op::CreateReplica, true);
    let (status, e) = c.create("doomed", GIB, 3).await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("injected failure"),
        "{e}"
    );
    assert!(c.volume_names().await.is_empty(), "no record left");
    assert!(
        c.all_replicas().is_empty(),
        "no replica left: {:?}",
        c.all_replicas()
    );
    // The reservations were released: all three nodes are usable again.
    c.agent("n2").fail(Op::CreateReplica, false);
    let (status, v) = c.create("doomed", GIB, 3).await;
    assert_eq!(status, 201, "{v}");
}

#[tokio::test]
async fn attach_failure_returns_to_detached_keeping_the_epoch() {
    let c = Cluster::start(2).await;
    c.create("v", GIB, 2).await;
    c.agent("n1").fail(Op::StartEngine, true);
    let (status, e) = c.post("/v1/volumes/v/attach", json!({"node": "n1"})).await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("injected failure"),
        "{e}"
    );
    let v = c.volume("v").await;
    assert_eq!(v["state"], "detached");
    assert_eq!(v["attached_node"], serde_json::Value::Null);
    assert_eq!(v["epoch"], 1, "epochs never go down");
    let (status, v) = c.post("/v1/volumes/v/attach", json!({"node": "n2"})).await;
    assert_eq!((status, v["epoch"].as_u64()), (200, Some(2)), "{v}");
}

#[tokio::test]
async fn attach_to_unknown_or_offline_node() {
    let c = Cluster::start_with(2, 1).await;
    c.create("v", GIB, 1).await;
    let (status, e) = c
        .post("/v1/volumes/v/attach", json!({"node": "nope"}))
        .await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, e) = c
        .post("/v1/volumes/nope/attach", json!({"node": "n1"}))
        .await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    // Without heartbeats the nodes go offline after the 1 s timeout.
    c.until_every_node_is_offline().await;
    let (status, e) = c.post("/v1/volumes/v/attach", json!({"node": "n1"})).await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("offline"), "{e}");
    // Placement skips offline nodes and says so.
    let (status, e) = c.create("w", GIB, 1).await;
    assert_eq!((status, code(&e)), (507, "insufficient_capacity"), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("n1 (offline)"),
        "{e}"
    );
    // A heartbeat brings a node back.
    c.register(c.agent("n2"), vec![pool("n2", 100 * GIB, 100 * GIB)])
        .await;
    assert_eq!(c.create("w", GIB, 1).await.0, 201);
}

#[tokio::test]
async fn delete_with_failing_agent_stays_deleting_until_retry() {
    let c = Cluster::start(2).await;
    c.create("v", GIB, 2).await;
    c.agent("n2").fail(Op::DeleteReplica, true);
    let (status, e) = c.delete("/v1/volumes/v").await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert_eq!(c.volume("v").await["state"], "deleting");
    // A deleting volume cannot be attached.
    let (status, e) = c.post("/v1/volumes/v/attach", json!({"node": "n1"})).await;
    assert_eq!((status, code(&e)), (409, "conflict"), "{e}");
    c.agent("n2").fail(Op::DeleteReplica, false);
    assert_eq!(c.delete("/v1/volumes/v").await.0, 204);
    assert!(c.all_replicas().is_empty());
    assert!(c.volume_names().await.is_empty());
}

#[tokio::test]
async fn detach_with_failing_agent_stays_attached() {
    let c = Cluster::start(1).await;
    c.create("v", GIB, 1).await;
    c.post("/v1/volumes/v/attach", json!({"node": "n1"})).await;
    c.agent("n1").fail(Op::StopEngine, true);
    let (status, e) = c.post("/v1/volumes/v/detach", json!({})).await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert_eq!(c.volume("v").await["state"], "attached");
    c.agent("n1").fail(Op::StopEngine, false);
    assert_eq!(c.post("/v1/volumes/v/detach", json!({})).await.0, 200);
}

#[tokio::test]
async fn capacity_errors_and_no_overbooking() {
    let c = Cluster::start(3).await;
    let (status, e) = c.create("big", 10 * GIB, 4).await;
    assert_eq!((status, code(&e)), (507, "insufficient_capacity"), "{e}");
    assert!(
        e["message"].as_str().unwrap().starts_with("need 4 nodes"),
        "{e}"
    );
    // Thick: 100 GiB free per node; two 60 GiB volumes of 3 replicas cannot both fit even
    // though no heartbeat has reported the first one yet.
    let body =
        |name: &str| json!({"name": name, "size_bytes": 60 * GIB, "replicas": 3, "thin": false});
    assert_eq!(c.post("/v1/volumes", body("t1")).await.0, 201);
    let (status, e) = c.post("/v1/volumes", body("t2")).await;
    assert_eq!((status, code(&e)), (507, "insufficient_capacity"), "{e}");
    // Concurrent creates: exactly as many as fit succeed.
    let c2 = &c;
    let results = tokio::join!(
        c2.post(
            "/v1/volumes",
            json!({"name": "c1", "size_bytes": 30 * GIB, "replicas": 3, "thin": false})
        ),
        c2.post(
            "/v1/volumes",
            json!({"name": "c2", "size_bytes": 30 * GIB, "replicas": 3, "thin": false})
        ),
    );
    let ok = [results.0 .0, results.1 .0]
        .iter()
        .filter(|s| **s == 201)
        .count();
    assert_eq!(ok, 1, "{results:?}");
}

#[tokio::test]
async fn list_nodes_and_pools() {
    let c = Cluster::start(2).await;
    let (status, nodes) = c.get("/v1/nodes").await;
    assert_eq!(status, 200);
    let nodes = nodes.as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0]["name"], "n1");
    assert_eq!(nodes[0]["state"], "online");
    assert!(nodes[0]["last_seen_ms"].as_u64().unwrap() > 0);
    let (status, pools) = c.get("/v1/pools").await;
    assert_eq!(status, 200);
    let pools = pools.as_array().unwrap();
    assert_eq!(pools.len(), 2);
    assert_eq!(pools[1]["node"], "n2");
    assert_eq!(pools[1]["capacity_bytes"], 100 * GIB);
    let (status, n) = c.get("/v1/nodes/n2").await;
    assert_eq!((status, n["name"].as_str()), (200, Some("n2")));
    assert_eq!(c.get("/v1/nodes/n9").await.0, 404);
}

#[tokio::test]
async fn state_survives_a_controller_restart() {
    let dir = tempfile::tempdir().unwrap();
    let args = hawser_controller::ControllerArgs {
        advertise_url: Some("http://controller.example:9400/".into()),
        ..crate::common::controller_args(dir.path(), None, None)
    };
    let mut tokens = Vec::new();
    for round in 0..2 {
        let ctl = hawser_controller::Controller::bind(args.clone())
            .await
            .unwrap();
        let url = format!("http://{}", ctl.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(ctl.serve(async move {
            let _ = rx.await;
        }));
        // The restarted controller keeps the tokens of the first start.
        tokens.push(crate::common::read_token(&dir.path().join("admin.token")));
        let http = crate::common::client_with_token(&tokens[0]);
        if round == 0 {
            let body = json!({"admin_addr": "127.0.0.1:1", "replica_addr": "127.0.0.1:2",
                "nbd_addr": null, "nbd_socket": null, "pools": []});
            let r = http
                .put(format!("{url}/v1/nodes/n1"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        } else {
            let nodes: serde_json::Value = http
                .get(format!("{url}/v1/nodes"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(nodes[0]["name"], "n1", "{nodes}");
        }
        tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
    assert_eq!(tokens[0], tokens[1], "a restart does not make new tokens");
}

/// A node whose agent does not listen: its admin address is a port nobody holds.
async fn dead_node(c: &Cluster, name: &str, capacity: u64) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let body = json!({"admin_addr": format!("127.0.0.1:{port}"), "replica_addr": "127.0.0.1:9",
        "nbd_addr": null, "nbd_socket": null, "pools": [pool(name, capacity, capacity)]});
    let (status, e) = c.put(&format!("/v1/nodes/{name}"), body).await;
    assert_eq!(status, 200, "{e}");
}

#[tokio::test]
async fn unreachable_agent_during_create_rolls_back() {
    let c = Cluster::start(1).await;
    // n0 has less room than n1, so n1's replica is created first and must be rolled back
    // when n0's agent turns out not to be there.
    dead_node(&c, "n0", 10 * GIB).await;
    let (status, e) = c.create("v", GIB, 2).await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("unreachable") && msg.contains("refused"),
        "{e}"
    );
    assert!(c.volume_names().await.is_empty());
    assert!(c.all_replicas().is_empty(), "{:?}", c.all_replicas());
    let calls = c.agent("n1").calls();
    assert!(calls[0].starts_with("POST /v1/replicas v-r"), "{calls:?}");
    assert!(calls[1].starts_with("DELETE /v1/replicas/v-r"), "{calls:?}");
}

/// Agents that died a moment ago still count as online (no heartbeat timeout yet), and
/// placement may pick them; the create goes around them.
#[tokio::test]
async fn create_places_again_without_nodes_whose_agent_does_not_answer() {
    let c = Cluster::start(2).await;
    // Placement order (most room, then name): d1, n1, n1x, n2. The first attempt fails at
    // d1 before creating anything; the second creates on n1, fails at n1x and deletes n1's
    // replica again; the third uses n1 and n2.
    dead_node(&c, "d1", 1000 * GIB).await;
    dead_node(&c, "n1x", 100 * GIB).await;
    let (status, v) = c.create("v", GIB, 2).await;
    assert_eq!(status, 201, "{v}");
    let nodes: Vec<&str> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["n1", "n2"], "{v}");
    assert_eq!(c.all_replicas().len(), 2, "{:?}", c.all_replicas());
    let calls = c.agent("n1").calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls[0].starts_with("POST /v1/replicas v-r0-"), "{calls:?}");
    assert!(
        calls[1].starts_with("DELETE /v1/replicas/v-r0-"),
        "{calls:?}"
    );
    assert!(calls[2].starts_with("POST /v1/replicas v-r0-"), "{calls:?}");
    assert_eq!(
        c.agent("n2").calls().len(),
        1,
        "{:?}",
        c.agent("n2").calls()
    );
}

/// A third node that does not answer is one too many: the create stops with its error.
#[tokio::test]
async fn create_gives_up_after_a_bounded_number_of_unanswering_nodes() {
    let c = Cluster::start(1).await;
    for d in ["d1", "d2", "d3"] {
        dead_node(&c, d, 1000 * GIB).await;
    }
    let (status, e) = c.create("v", GIB, 2).await;
    assert_eq!((status, code(&e)), (503, "unavailable"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("d3"), "{e}");
    assert!(c.volume_names().await.is_empty());
    assert!(c.all_replicas().is_empty(), "{:?}", c.all_replicas());
}

#[tokio::test]
async fn detach_from_an_offline_unreachable_node_proceeds() {
    let c = Cluster::start_with(1, 1).await;
    c.create("v", GIB, 1).await;
    assert_eq!(
        c.post("/v1/volumes/v/attach", json!({"node": "n1"}))
            .await
            .0,
        200
    );
    // n1's agent moves to an address nobody answers at, then stops heartbeating.
    dead_node(&c, "n1", 100 * GIB).await;
    let (status, e) = c.post("/v1/volumes/v/detach", json!({})).await;
    assert_eq!(
        (status, code(&e)),
        (503, "unavailable"),
        "online but unreachable: {e}"
    );
    eventually(10, || async {
        let (_, n) = c.get("/v1/nodes/n1").await;
        n["state"] == "offline"
    })
    .await;
    // Offline: the next attach's epoch fences the engine, so the detach goes ahead.
    let (status, v) = c.post("/v1/volumes/v/detach", json!({})).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (200, Some("detached")),
        "{v}"
    );
    assert_eq!(v["epoch"], 1);
}

#[tokio::test]
async fn quorum_loss_policy_is_stored_and_given_to_the_engine() {
    let c = Cluster::start(3).await;
    let (status, v) = c.create("dflt", GIB, 3).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["on_quorum_loss"], "suspend", "the default");
    let body =
        json!({"name": "failing", "size_bytes": GIB, "replicas": 3, "on_quorum_loss": "fail"});
    let (status, v) = c.post("/v1/volumes", body).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["on_quorum_loss"], "fail");
    let body = json!({"name": "bad", "size_bytes": GIB, "replicas": 3, "on_quorum_loss": "maybe"});
    let (status, v) = c.post("/v1/volumes", body).await;
    assert_eq!(status, 400, "{v}");
    let (status, v) = c
        .post("/v1/volumes/failing/attach", json!({"node": "n1"}))
        .await;
    assert_eq!(status, 200, "{v}");
    let engine = c.agent("n1").engine("failing").unwrap();
    assert_eq!(
        engine.on_quorum_loss,
        hawser_api::controller::QuorumLoss::Fail
    );
}

#[tokio::test]
async fn an_engine_missing_after_an_agent_restart_is_started_again() {
    let c = Cluster::start_opts(2, 15, 1).await;
    let (status, v) = c.create("back", GIB, 2).await;
    assert_eq!(status, 201, "{v}");
    let (status, v) = c
        .post("/v1/volumes/back/attach", json!({"node": "n1"}))
        .await;
    assert_eq!(status, 200, "{v}");
    let epoch = c.agent("n1").engine("back").unwrap().epoch;
    // The agent restarts: its engines are gone.
    c.agent("n1").state.lock().unwrap().engines.clear();
    eventually(10, || async { c.agent("n1").engine("back").is_some() }).await;
    let engine = c.agent("n1").engine("back").unwrap();
    assert_eq!(engine.epoch, epoch, "started again in the same epoch");
}

/// A replica an agent holds that no volume references (a failed create's leftover the
/// rollback could not delete, or a deposed leader's late create) is moved to its pool's
/// trash by the leader's reconcile round, never deleted; the replicas of existing volumes
/// are kept.
#[tokio::test]
async fn orphan_replicas_are_trashed_and_referenced_ones_kept() {
    let c = Cluster::start(2).await;
    let (status, e) = c.create("v", GIB, 2).await;
    assert_eq!(status, 201, "{e}");
    let kept = c.all_replicas();
    assert_eq!(kept.len(), 2, "{kept:?}");
    let orphan = hawser_api::agent::CreateReplica {
        replica_id: "gone-r0-abcdef".into(),
        volume: "gone".into(),
        size_bytes: GIB,
        pool: "default".into(),
        thin: true,
        cluster_id: None,
        from: None,
        key_check: None,
        checksums: false,
        wrapped_key: None,
        volume_uid: None,
    };
    let n1 = c.agent("n1");
    n1.state
        .lock()
        .unwrap()
        .replicas
        .insert(orphan.replica_id.clone(), orphan);
    // A round at most every 5 s (RECONCILE_INTERVAL).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while c.all_replicas().len() != 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            c.all_replicas()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(c.all_replicas(), kept);
    let calls = n1.calls();
    assert!(calls.contains(&"POST /v1/replicas/gone-r0-abcdef/trash".to_string()));
    assert!(
        !calls.iter().any(|c| c.starts_with("DELETE /v1/replicas/")),
        "{calls:?}"
    );
}

/// Limits (QoS, issue 21): set at create and changed live; the attached engine's node gets
/// them at once, and from the engine watch when it missed the change; bad input changes
/// nothing.
#[tokio::test]
async fn limits_reach_the_engine_and_a_node_that_missed_them_gets_them() {
    let c = Cluster::start_opts(1, 15, 1).await;
    let (status, v) = c
        .post(
            "/v1/volumes",
            json!({"name": "v", "size_bytes": GIB, "replicas": 1, "qos": {"write_iops": 1000}}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["qos"], json!({"write_iops": 1000}));
    c.post("/v1/volumes/v/attach", json!({"node": "n1"})).await;
    let engine = || c.agent("n1").engine("v").unwrap().qos;
    assert_eq!(engine().write_iops, 1000, "the engine starts with them");

    let (status, v) = c
        .post(
            "/v1/volumes/v/qos",
            json!({"write_iops": 3000, "bytes_per_sec": 1 << 30}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["qos"],
        json!({"write_iops": 3000, "bytes_per_sec": 1u64 << 30})
    );
    assert_eq!(
        v["engine"]["qos"], v["qos"],
        "the reply shows what the node applies"
    );
    assert_eq!(
        (engine().write_iops, engine().bytes_per_sec),
        (3000, 1 << 30)
    );

    // Refused, and nothing changes: no limit given, a bandwidth below 4 KiB/s, a typo.
    for bad in [
        json!({}),
        json!({"read_bytes_per_sec": 100}),
        json!({"write_iops_limit": 5}),
    ] {
        let (status, e) = c.post("/v1/volumes/v/qos", bad.clone()).await;
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "{bad}: {e}");
    }
    let (status, e) = c.post("/v1/volumes/nosuch/qos", json!({"iops": 1})).await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    assert_eq!(c.volume("v").await["qos"]["write_iops"], 3000);

    // The node does not take the change: the record has it, and the engine watch gives it
    // to the node once it does.
    c.agent("n1").fail(Op::SetQos, true);
    let (status, v) = c.post("/v1/volumes/v/qos", json!({"write_iops": 0})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["qos"], json!({"bytes_per_sec": 1u64 << 30}));
    assert_eq!(
        engine().write_iops,
        3000,
        "the failing node kept its limits"
    );
    c.agent("n1").fail(Op::SetQos, false);
    eventually(10, || async { engine().write_iops == 0 }).await;
    assert_eq!(engine().bytes_per_sec, 1 << 30);

    // Detached: only the record changes; the next attach carries it.
    c.post("/v1/volumes/v/detach", json!({})).await;
    let (status, _) = c.post("/v1/volumes/v/qos", json!({"read_iops": 10})).await;
    assert_eq!(status, 200);
    c.post("/v1/volumes/v/attach", json!({"node": "n1"})).await;
    assert_eq!((engine().read_iops, engine().bytes_per_sec), (10, 1 << 30));
}

/// Block checksums are on unless a create says otherwise: the volume reports them and every
/// replica is created with them; `checksums: false` makes plain replicas.
#[tokio::test]
async fn new_volumes_keep_block_checksums_unless_asked_not_to() {
    let c = Cluster::start(2).await;
    let made_with = |v: &serde_json::Value| -> Vec<bool> {
        v["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let (id, node) = (r["id"].as_str().unwrap(), r["node"].as_str().unwrap());
                c.agent(node).replica(id).unwrap().checksums
            })
            .collect()
    };
    let (status, v) = c.create("summed", GIB, 2).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["checksums"], true, "the default: {v}");
    assert_eq!(made_with(&v), [true, true]);
    assert_eq!(c.volume("summed").await["checksums"], true);
    let body = json!({"name": "plain", "size_bytes": GIB, "replicas": 2, "checksums": false});
    let (status, v) = c.post("/v1/volumes", body).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["checksums"], false, "{v}");
    assert_eq!(made_with(&v), [false, false]);
    let body = json!({"name": "bad", "size_bytes": GIB, "replicas": 2, "checksums": "yes"});
    let (status, e) = c.post("/v1/volumes", body).await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
}

/// A volume record stored before checksums existed (no `checksums` field) describes
/// replicas without sums: it loads, and reads as false.
#[tokio::test]
async fn a_volume_stored_before_checksums_existed_loads_without_them() {
    use hawser_store::Store;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(hawser_controller::STORE_FILE);
    let store = hawser_store::EmbeddedStore::open(&path).unwrap();
    let old = json!({"name": "old", "size_bytes": GIB, "replica_count": 1, "thin": true,
        "state": "detached", "epoch": 3, "attached_node": null,
        "replicas": [{"id": "old-r0-abcdef", "node": "n1", "pool": "default",
            "state": "in_sync"}]});
    let value = serde_json::to_vec(&old).unwrap();
    store
        .put("volumes/old", value, hawser_store::Expect::Absent)
        .await
        .unwrap();
    drop(store);
    let args = crate::common::controller_args(dir.path(), None, None);
    let ctl = hawser_controller::Controller::bind(args).await.unwrap();
    let url = format!("http://{}", ctl.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(ctl.serve(async move {
        let _ = rx.await;
    }));
    let http = crate::common::client_with_token(&crate::common::read_token(
        &dir.path().join("admin.token"),
    ));
    let r = http
        .get(format!("{url}/v1/volumes/old"))
        .send()
        .await
        .unwrap();
    let (status, v) = crate::common::read(r).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["epoch"].as_u64(), &v["checksums"]),
        (Some(3), &json!(false)),
        "{v}"
    );
    tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// `?limit=` pages in name order, each page's `Link` leads to the next, the last page has
/// none, and every volume comes exactly once; bad limits and unknown parameters are refused.
#[tokio::test]
async fn lists_come_in_pages_that_follow_the_link() {
    let c = Cluster::start(2).await;
    for name in ["v3", "v1", "v5", "v2", "v4"] {
        let (status, v) = c.create(name, GIB, 1).await;
        assert_eq!(status, 201, "{v}");
    }
    let mut next = Some(format!("{}/v1/volumes?limit=2", c.url));
    let (mut seen, mut pages) = (Vec::new(), 0);
    while let Some(url) = next.take() {
        let resp = c.http.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        next = resp.headers().get("link").map(|l| {
            let l = l.to_str().unwrap();
            assert!(l.ends_with(">; rel=\"next\""), "{l}");
            let path = l.trim_start_matches('<').split('>').next().unwrap();
            format!("{}{path}", c.url)
        });
        let page: serde_json::Value = resp.json().await.unwrap();
        let page = page.as_array().unwrap();
        assert!(page.len() <= 2, "{page:?}");
        seen.extend(page.iter().map(|v| v["name"].as_str().unwrap().to_string()));
        pages += 1;
    }
    assert_eq!(seen, ["v1", "v2", "v3", "v4", "v5"]);
    assert_eq!(pages, 3);
    let (status, v) = c.get("/v1/volumes?after=v3").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    for bad in ["limit=0", "limit=10001", "limit=two", "limt=2"] {
        let (status, e) = c.get(&format!("/v1/volumes?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {e}");
        assert_eq!(code(&e), "invalid_argument", "{bad}: {e}");
    }
    let (status, v) = c.get("/v1/replicas?limit=4").await;
    assert_eq!((status, v.as_array().unwrap().len()), (200, 4), "{v}");
    let (status, v) = c.get("/v1/nodes?limit=1&after=n1").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v[0]["name"], "n2", "{v}");
}
