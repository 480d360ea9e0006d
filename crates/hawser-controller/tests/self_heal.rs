//! Self-healing through the REST API against fake agents (issue 4, item 4): a replica whose
//! node stays offline is replaced under the volume's zone rules, a detached volume gets a
//! sync engine (not exported) until its new replica is in sync, and the stale replica is
//! deleted when its node returns.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{eventually, pool, Cluster, GIB};
use serde_json::{json, Value};

/// Heartbeats every node but those in `down` every 300 ms, with its zone label, until dropped.
struct Heartbeats {
    stop: Arc<AtomicBool>,
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn heartbeats(c: &Cluster, zones: &[&str], down: Arc<std::sync::Mutex<Vec<String>>>) -> Heartbeats {
    let stop = Arc::new(AtomicBool::new(false));
    let nodes: Vec<(String, String, String)> = c
        .agents
        .iter()
        .zip(zones)
        .map(|(a, z)| (a.node.clone(), a.addr.to_string(), z.to_string()))
        .collect();
    let (url, http, flag) = (c.url.clone(), c.http.clone(), stop.clone());
    tokio::spawn(async move {
        while !flag.load(Ordering::Acquire) {
            for (node, addr, zone) in &nodes {
                if down.lock().unwrap().contains(node) {
                    continue;
                }
                let body = json!({
                    "admin_addr": addr, "replica_addr": "127.0.0.1:9600",
                    "nbd_addr": null, "nbd_socket": null,
                    "pools": [pool(node, 100 * GIB, 100 * GIB)], "labels": { "zone": zone },
                });
                let _ = http
                    .put(format!("{url}/v1/nodes/{node}"))
                    .json(&body)
                    .send()
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    Heartbeats { stop }
}

fn replicas(v: &Value) -> Vec<Value> {
    v["replicas"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_replica_is_replaced_in_its_zone_synced_and_its_stale_copy_deleted() {
    let c = Cluster::start_healing(4, 2).await;
    let zones = ["a", "a", "b", "b"];
    let down = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let _hb = heartbeats(&c, &zones, down.clone());
    // Labels arrive with the first heartbeat round.
    eventually(5, || async {
        let (_, nodes) = c.get("/v1/nodes").await;
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["labels"]["zone"].is_string())
    })
    .await;
    let (status, v) = c
        .post(
            "/v1/volumes",
            json!({"name": "z", "size_bytes": GIB, "replicas": 2, "encrypted": true}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let zone_of = |node: &str| zones[node[1..].parse::<usize>().unwrap() - 1];
    let rs = replicas(&v);
    let victim = rs
        .iter()
        .find(|r| zone_of(r["node"].as_str().unwrap()) == "b")
        .unwrap();
    let (victim_id, victim_node) = (
        victim["id"].as_str().unwrap().to_string(),
        victim["node"].as_str().unwrap().to_string(),
    );
    let keeper = rs.iter().find(|r| r["id"] != victim["id"]).unwrap()["node"]
        .as_str()
        .unwrap()
        .to_string();
    down.lock().unwrap().push(victim_node.clone());

    // Replaced, in zone b (strict spread), by a blank replica on the other zone-b node.
    let spare = if victim_node == "n3" { "n4" } else { "n3" };
    eventually(20, || async {
        let v = c.volume("z").await;
        replicas(&v)
            .iter()
            .any(|r| r["node"] == spare && r["blank"] == true)
    })
    .await;
    let v = c.volume("z").await;
    assert!(
        replicas(&v).iter().all(|r| r["id"] != victim_id.as_str()),
        "{v}"
    );
    let blank = replicas(&v)
        .into_iter()
        .find(|r| r["node"] == spare)
        .unwrap();
    let blank_id = blank["id"].as_str().unwrap().to_string();
    assert!(c.agent(spare).replicas().contains(&blank_id));
    // Like the volume's first replicas, with block checksums (the default at create), and
    // the encrypted volume's key check and a copy of its wrapped data key.
    let made = c.agent(spare).replica(&blank_id).unwrap();
    assert!(made.checksums);
    let first = c
        .agent(&keeper)
        .replicas()
        .into_iter()
        .find_map(|id| c.agent(&keeper).replica(&id))
        .unwrap();
    assert!(made.key_check.is_some());
    assert_eq!(
        (made.key_check, &made.wrapped_key),
        (first.key_check, &first.wrapped_key)
    );
    assert!(made.wrapped_key.is_some());
    // Detached: an engine that is not exported syncs it, on the in-sync replica's node.
    eventually(10, || async { c.agent(&keeper).engine("z").is_some() }).await;
    let engine = c.agent(&keeper).engine("z").unwrap();
    assert!(
        !engine.export,
        "a detached volume's sync engine is not exported"
    );
    assert!(engine
        .replicas
        .iter()
        .any(|r| r.replica_id == blank_id && r.blank));
    let v = c.volume("z").await;
    assert_eq!(v["sync_node"], keeper.as_str(), "{v}");
    assert_eq!(v["epoch"], engine.epoch, "{v}");

    // The engine reports the resync done: in sync, no longer blank; the sync engine stops.
    let path = format!("/v1/volumes/z/replicas/{blank_id}/in-sync");
    let (status, body) = c.post(&path, json!({ "epoch": engine.epoch })).await;
    assert_eq!(status, 200, "{body}");
    eventually(10, || async {
        c.agent(&keeper).engine("z").is_none() && c.volume("z").await["sync_node"].is_null()
    })
    .await;
    let v = c.volume("z").await;
    assert!(
        replicas(&v)
            .iter()
            .all(|r| r["state"] == "in_sync" && r["blank"].is_null()),
        "{v}"
    );

    // The retired replica is listed until its node returns and deletes it.
    let (_, listed) = c.get("/v1/replicas").await;
    let retired: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["retired"] == true)
        .collect();
    assert_eq!(retired.len(), 1, "{listed}");
    assert_eq!(retired[0]["replica"]["id"], victim_id.as_str());
    assert!(c.agent(&victim_node).replicas().contains(&victim_id));
    down.lock().unwrap().clear();
    eventually(10, || async {
        !c.agent(&victim_node).replicas().contains(&victim_id)
    })
    .await;
    eventually(10, || async {
        let (_, listed) = c.get("/v1/replicas").await;
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["retired"] == false)
    })
    .await;
}
