//! Failover on a real kube-apiserver (issue 15, acceptance d and the controller's part of c):
//! the controller keeps its state in the CRDs and fails over the pods of a node whose agent
//! went silent, and only then: not for a node that is only slow, and not while another
//! controller holds the leader lease; and the Events a volume's PVC gets. What Kubernetes
//! does next (the StatefulSet recreating the pod, the scheduler, the kubelet) is in the
//! end-to-end test; here the pods are objects bound to nodes that have no kubelet, which is
//! all the failover looks at.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{client_with_token, controller_args, kubectl, pool, FakeAgent, GIB};
use hawser_controller::{Controller, ControllerArgs};
use hawser_kube::{install_crds, KubeStore, KubeStoreUrl};
use hawser_store::{Expect, Store, WriteOptions};
use hawser_testkit::apiserver_process::ApiserverProcess;
use serde_json::{json, Value};

const NS: &str = "hawser-system";
/// The failover timeout of this test (the default is 10 s; shorter keeps the test quick).
const AFTER_SECS: u64 = 6;
/// After this long a silent node's peers are asked about it (the default is 4 s).
const CONFIRM_SECS: u64 = 2;

fn get_json(api: &ApiserverProcess, args: &[&str]) -> Value {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&kubectl(api, &a, None)).unwrap()
}

fn exists(api: &ApiserverProcess, args: &[&str]) -> bool {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--ignore-not-found", "-o", "name"]);
    !kubectl(api, &a, None).trim().is_empty()
}

/// The reasons of the Events about `name` in namespace default.
fn event_reasons(api: &ApiserverProcess, name: &str) -> Vec<String> {
    events(api, name).into_iter().map(|(r, _)| r).collect()
}

/// The (reason, message) of each Event about `name` in namespace default.
fn events(api: &ApiserverProcess, name: &str) -> Vec<(String, String)> {
    let sel = format!("involvedObject.name={name}");
    let list = get_json(api, &["events", "-n", "default", "--field-selector", &sel]);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let text = |k: &str| e[k].as_str().unwrap().to_string();
            (text("reason"), text("message"))
        })
        .collect()
}

/// How many peer probes `agent` has been asked for.
fn probes(agent: &FakeAgent) -> usize {
    agent
        .calls()
        .iter()
        .filter(|c| *c == "POST /v1/peers/probe")
        .count()
}

/// A Hawser PV, its PVC and a pod bound to `node` that mounts it.
fn workload(volume: &str, node: &str, opt_out: bool) -> String {
    let annotations = if opt_out {
        "\n  annotations: {hawser.dev/failover: \"false\"}"
    } else {
        ""
    };
    format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-{volume}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  csi: {{driver: csi.hawser.dev, volumeHandle: {volume}}}
  claimRef: {{namespace: default, name: data-{volume}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data-{volume}, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 1Gi}}}}
  volumeName: pv-{volume}
  storageClassName: ""
---
apiVersion: v1
kind: Pod
metadata:
  name: app-{volume}
  namespace: default{annotations}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  containers: [{{name: c, image: busybox}}]
  volumes: [{{name: d, persistentVolumeClaim: {{claimName: data-{volume}}}}}]
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {{name: va-{volume}}}
spec:
  attacher: csi.hawser.dev
  nodeName: {node}
  source: {{persistentVolumeName: pv-{volume}}}
"#
    )
}

/// Agents that heartbeat every 300 ms unless paused.
struct Heartbeats {
    paused: Arc<Mutex<HashSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn heartbeats(url: String, token: String, agents: Vec<(String, String, u64)>) -> Heartbeats {
    let paused = Arc::new(Mutex::new(HashSet::new()));
    let p = paused.clone();
    let http = client_with_token(&token);
    let task = tokio::spawn(async move {
        loop {
            for (node, addr, free_gib) in &agents {
                if p.lock().unwrap().contains(node) {
                    continue;
                }
                let body = json!({
                    "admin_addr": addr,
                    "replica_addr": "127.0.0.1:1",
                    "nbd_addr": null,
                    "nbd_socket": format!("/run/hawser/{node}.sock"),
                    "pools": [pool(node, 200 * GIB, free_gib * GIB)],
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
    Heartbeats { paused, task }
}

impl Heartbeats {
    fn pause(&self, node: &str, on: bool) {
        let mut p = self.paused.lock().unwrap();
        if on {
            p.insert(node.into());
        } else {
            p.remove(node);
        }
    }
}

async fn volume(http: &reqwest::Client, url: &str, name: &str) -> Value {
    let resp = http
        .get(format!("{url}/v1/volumes/{name}"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

/// Creates volume `name` of `replicas` (one on `node` if it can) and attaches it there.
async fn attach_new(http: &reqwest::Client, url: &str, name: &str, replicas: u32, node: &str) {
    let body = json!({"name": name, "size_bytes": GIB, "replicas": replicas, "prefer_node": node});
    let r = http
        .post(format!("{url}/v1/volumes"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let r = http
        .post(format!("{url}/v1/volumes/{name}/attach"))
        .json(&json!({"node": node}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

fn attachment(v: &Value) -> (String, Option<String>, u64) {
    (
        v["state"].as_str().unwrap().to_string(),
        v["attached_node"].as_str().map(str::to_string),
        v["epoch"].as_u64().unwrap(),
    )
}

/// Whether nothing failed over: the volume is attached on `node` at `epoch`, its pod and
/// attachment exist, the node is not tainted.
async fn untouched(
    api: &ApiserverProcess,
    http: &reqwest::Client,
    url: &str,
    vol: &str,
    node: &str,
    epoch: u64,
) {
    let v = volume(http, url, vol).await;
    assert_eq!(
        attachment(&v),
        ("attached".into(), Some(node.into()), epoch),
        "{v}"
    );
    assert!(exists(
        api,
        &["pod", &format!("app-{vol}"), "-n", "default"]
    ));
    assert!(exists(api, &["volumeattachment", &format!("va-{vol}")]));
    assert!(!tainted(api, node));
}

/// Whether `node` carries the failover's taint for a silent agent (the API server adds
/// others of its own).
fn tainted(api: &ApiserverProcess, node: &str) -> bool {
    has_taint(api, node, "hawser.dev/agent-unreachable")
}

fn has_taint(api: &ApiserverProcess, node: &str, key: &str) -> bool {
    let n = get_json(api, &["node", node]);
    n["spec"]["taints"]
        .as_array()
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_moves_only_what_it_can_vouch_for_and_only_while_leading() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiserverProcess::start(&dir.path().join("k8s"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    install_crds(&api.config(), Duration::from_secs(30))
        .await
        .unwrap();
    api.create_namespace(NS).await.unwrap();
    let store_url = format!("k8s://{NS}?kubeconfig={}", api.kubeconfig().display());
    let cdir = dir.path().join("controller");
    let args = ControllerArgs {
        failover_after_secs: AFTER_SECS,
        failover_confirm_secs: CONFIRM_SECS,
        node_timeout_secs: 60,
        ..controller_args(&cdir, Some(store_url.clone()), None)
    };
    let controller = Controller::bind(args).await.unwrap();
    let url = format!("http://{}", controller.local_addr().unwrap());
    let admin = crate::common::read_token(&cdir.join("admin.token"));
    let agent_token = crate::common::read_token(&cdir.join("agent.token"));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(controller.serve(async move {
        let _ = stop_rx.await;
    }));
    let http = client_with_token(&admin);
    let mut agents = Vec::new();
    let mut beats = Vec::new();
    for (node, free) in [("n1", 150), ("n2", 100), ("n3", 90)] {
        let a = FakeAgent::start(node).await;
        beats.push((node.to_string(), a.addr.to_string(), free));
        agents.push(a);
        kubectl(
            &api,
            &["create", "-f", "-"],
            Some(&format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n"
            )),
        );
    }
    kubectl(
        &api,
        &["create", "serviceaccount", "default", "-n", "default"],
        None,
    );
    let hb = heartbeats(url.clone(), agent_token, beats);
    crate::common::eventually(20, || async {
        let r = http.get(format!("{url}/v1/nodes")).send().await.unwrap();
        r.status() == 200 && r.json::<Value>().await.unwrap().as_array().unwrap().len() == 3
    })
    .await;
    // a: two replicas (n1 and another), the pod can move. b: the same, but its pod opted
    // out. c: one replica, on n1: nobody else has its writes.
    let mut epochs = std::collections::HashMap::new();
    for (vol, replicas) in [("a", 2), ("b", 2), ("c", 1)] {
        attach_new(&http, &url, vol, replicas, "n1").await;
        let v = volume(&http, &url, vol).await;
        epochs.insert(vol, attachment(&v).2);
        kubectl(
            &api,
            &["create", "-f", "-"],
            Some(&workload(vol, "n1", vol == "b")),
        );
    }
    let c = volume(&http, &url, "c").await;
    assert_eq!(c["replicas"][0]["node"], "n1", "{c}");
    let in_use = json!({"status": {"volumesInUse": [
        "kubernetes.io/csi/csi.hawser.dev^a", "kubernetes.io/csi/csi.hawser.dev^b",
        "kubernetes.io/csi/other.example^x"]}});
    kubectl(
        &api,
        &[
            "patch",
            "node",
            "n1",
            "--subresource=status",
            "--type=merge",
            "-p",
            &in_use.to_string(),
        ],
        None,
    );

    // 0. What happens to a volume shows on its PVC: its engine reports a replica outdated,
    // then in sync again (as an agent would, with the agent token).
    let agent_http = client_with_token(&crate::common::read_token(&cdir.join("agent.token")));
    let a = volume(&http, &url, "a").await;
    let other = a["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] != "n1")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    for (what, body) in [
        (
            "outdate",
            json!({"epoch": epochs["a"], "reason": "test: connection lost", "failed": false}),
        ),
        ("in-sync", json!({"epoch": epochs["a"]})),
    ] {
        let r = agent_http
            .post(format!("{url}/v1/volumes/a/replicas/{other}/{what}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{what}: {}", r.text().await.unwrap());
    }
    crate::common::eventually(15, || async {
        let reasons = event_reasons(&api, "data-a");
        reasons.contains(&"Degraded".to_string()) && reasons.contains(&"Resynced".to_string())
    })
    .await;

    // 1. A slow node: silent for less than the timeout. Its peers are asked about it after
    // CONFIRM_SECS, and they reach it, so nothing moves.
    let asked = || probes(&agents[1]) + probes(&agents[2]);
    let before = asked();
    hb.pause("n1", true);
    crate::common::eventually(AFTER_SECS, || async { asked() > before }).await;
    hb.pause("n1", false);
    tokio::time::sleep(Duration::from_secs(3)).await;
    untouched(&api, &http, &url, "a", "n1", epochs["a"]).await;

    // 2. Another controller holds the leader lease: this one must not act, however long n1
    // is silent. (A store client of the test's own takes over the leader key.)
    let thief = KubeStore::connect(
        &api.config(),
        &KubeStoreUrl::parse(&format!("k8s://{NS}")).unwrap(),
        "thief",
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let lease = thief.grant_lease(Duration::from_secs(60)).await.unwrap();
    let leader = thief.get("leader").await.unwrap().unwrap();
    thief
        .put_with(
            "leader",
            b"http://elsewhere".to_vec(),
            Expect::Version(leader.version),
            &WriteOptions {
                lease: Some(lease),
                fence: None,
            },
        )
        .await
        .unwrap();
    crate::common::eventually(10, || async {
        let r = http.get(format!("{url}/v1/volumes")).send().await.unwrap();
        r.status() == 503
    })
    .await;
    hb.pause("n1", true);
    let silent = Instant::now();
    tokio::time::sleep(Duration::from_secs(AFTER_SECS + 3)).await;
    // Read the records straight from the store: the controller answers not_leader.
    let rec = thief.get("volumes/a").await.unwrap().unwrap();
    let rec: Value = serde_json::from_slice(&rec.value).unwrap();
    assert_eq!(
        attachment(&rec),
        ("attached".into(), Some("n1".into()), epochs["a"])
    );
    assert!(exists(&api, &["pod", "app-a", "-n", "default"]));
    assert!(!tainted(&api, "n1"));

    // 3. The lease is free again: the controller leads and fails over at once (n1 has been
    // silent past the timeout).
    thief.revoke_lease(lease).await.unwrap();
    let released = Instant::now();
    crate::common::eventually(20, || async {
        !exists(&api, &["pod", "app-a", "-n", "default"])
    })
    .await;
    println!(
        "failover done {:?} after the lease came back ({:?} after n1 went silent)",
        released.elapsed(),
        silent.elapsed()
    );
    let a = volume(&http, &url, "a").await;
    assert_eq!(
        attachment(&a),
        ("detached".into(), None, epochs["a"] + 1),
        "{a}"
    );
    assert!(!exists(&api, &["volumeattachment", "va-a"]));
    assert!(tainted(&api, "n1"));
    let n1 = get_json(&api, &["node", "n1"]);
    let in_use: Vec<&str> = n1["status"]["volumesInUse"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        in_use,
        [
            "kubernetes.io/csi/csi.hawser.dev^b",
            "kubernetes.io/csi/other.example^x"
        ],
        "only a was released"
    );
    crate::common::eventually(10, || async {
        event_reasons(&api, "data-a").contains(&"FailedOver".to_string())
            && event_reasons(&api, "app-b").contains(&"FailoverSkipped".to_string())
            && event_reasons(&api, "data-c").contains(&"FailoverBlocked".to_string())
    })
    .await;
    // b (opted out) and c (nobody else has its writes) stay where they were.
    for vol in ["b", "c"] {
        let v = volume(&http, &url, vol).await;
        assert_eq!(
            attachment(&v),
            ("attached".into(), Some("n1".into()), epochs[vol])
        );
        assert!(exists(
            &api,
            &["pod", &format!("app-{vol}"), "-n", "default"]
        ));
    }
    // Events are not repeated every round.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        event_reasons(&api, "data-c")
            .iter()
            .filter(|r| *r == "FailoverBlocked")
            .count(),
        1
    );

    // 4. n1's agent is back: the taint goes.
    hb.pause("n1", false);
    crate::common::eventually(10, || async { !tainted(&api, "n1") }).await;
    // 5. A healthy node whose engine lost quorum (it reports a replica down that it may not
    // outdate, because n2 cannot reach that replica's node) for longer than the timeout: the
    // volume is fenced and its pod moved too. n2 heartbeats, so it gets the quorum-lost
    // taint, not the unreachable one, and keeps it until its agent reaches its peers.
    attach_new(&http, &url, "d", 2, "n2").await;
    let d = volume(&http, &url, "d").await;
    let d_epoch = attachment(&d).2;
    kubectl(
        &api,
        &["create", "-f", "-"],
        Some(&workload("d", "n2", false)),
    );
    let far = d["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] != "n2")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let far_node = d["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == far.as_str())
        .unwrap()["node"]
        .as_str()
        .unwrap()
        .to_string();
    agents[1].cut_off_from(&far_node, true);
    let lost = Instant::now();
    agents[1].report_down("d", vec![far]);
    crate::common::eventually(AFTER_SECS + 10, || async {
        !exists(&api, &["pod", "app-d", "-n", "default"])
    })
    .await;
    println!(
        "quorum-loss failover done {:?} after the engine reported it",
        lost.elapsed()
    );
    let d = volume(&http, &url, "d").await;
    assert_eq!(
        attachment(&d),
        ("detached".into(), None, d_epoch + 1),
        "{d}"
    );
    assert!(!tainted(&api, "n2"));
    crate::common::eventually(10, || async {
        event_reasons(&api, "data-d").contains(&"FailedOver".to_string())
    })
    .await;
    const QUORUM_LOST: &str = "hawser.dev/quorum-lost";
    crate::common::eventually(10, || async { has_taint(&api, "n2", QUORUM_LOST) }).await;
    // n2's agent is asked whether it reaches its peers, and while it does not, the taint
    // stays: wait for two probes after the taint was seen.
    let seen = probes(&agents[1]);
    crate::common::eventually(15, || async { probes(&agents[1]) >= seen + 2 }).await;
    assert!(has_taint(&api, "n2", QUORUM_LOST));
    assert!(!tainted(&api, "n2"));
    // Its path to the peer is back: the next probe lifts the taint.
    agents[1].report_down("d", vec![]);
    agents[1].cut_off_from(&far_node, false);
    crate::common::eventually(15, || async { !has_taint(&api, "n2", QUORUM_LOST) }).await;

    // 6. A node that lost power: silent to the controller and to its peers (their probes of
    // its replica port get no answer). It is failed over once its peers confirm it, before
    // the timeout, and the event says why. When it heartbeats again, it is untainted.
    attach_new(&http, &url, "e", 2, "n3").await;
    let e_epoch = attachment(&volume(&http, &url, "e").await).2;
    kubectl(
        &api,
        &["create", "-f", "-"],
        Some(&workload("e", "n3", false)),
    );
    agents[0].cut_off_from("n3", true);
    agents[1].cut_off_from("n3", true);
    hb.pause("n3", true);
    let lost = Instant::now();
    crate::common::eventually(AFTER_SECS + 10, || async {
        !exists(&api, &["pod", "app-e", "-n", "default"])
    })
    .await;
    println!(
        "confirmed failover done {:?} after n3 went silent (timeout {AFTER_SECS} s)",
        lost.elapsed()
    );
    let e = volume(&http, &url, "e").await;
    assert_eq!(
        attachment(&e),
        ("detached".into(), None, e_epoch + 1),
        "{e}"
    );
    assert!(tainted(&api, "n3"));
    crate::common::eventually(10, || async {
        events(&api, "data-e")
            .iter()
            .any(|(r, m)| r == "FailedOver" && m.contains("its host is silent to its peers"))
    })
    .await;
    hb.pause("n3", false);
    crate::common::eventually(10, || async { !tainted(&api, "n3") }).await;

    let _ = stop_tx.send(());
    serving.await.unwrap().unwrap();
    drop(agents);
}
