//! The same four operations against Hawser's own client (reqwest + serde_json::Value):
//! discover config, page through Pods, watch Nodes with bookmarks, patch a Node's taints.
//! Compiles; not meant to be run here.

#[allow(dead_code)]
#[path = "../../../../crates/hawser-kube/src/api.rs"]
mod api;
#[allow(dead_code)]
#[path = "../../../../crates/hawser-kube/src/config.rs"]
mod config;

use std::time::Duration;

use api::{Api, RawEvent};
use config::KubeConfig;
use serde_json::{json, Value};

fn query(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

fn rv_of(obj: &Value) -> Option<String> {
    obj.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_string)
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let ns = std::env::args().nth(1).unwrap_or_else(|| "default".into());
    let node_name = std::env::args().nth(2).unwrap_or_else(|| "node-1".into());

    // 1. Config: $KUBECONFIG, the in-cluster service account, or ~/.kube/config.
    let cfg = KubeConfig::discover().map_err(|e| e.to_string())?;
    let api = Api::new(&cfg, Duration::from_secs(30))?;

    // 2. Pods in a namespace, 100 at a time (limit/continue).
    let mut cont = String::new();
    let mut total = 0usize;
    loop {
        let mut pairs = vec![("limit", "100")];
        if !cont.is_empty() {
            pairs.push(("continue", cont.as_str()));
        }
        let page = api
            .get(&format!("/api/v1/namespaces/{ns}/pods?{}", query(&pairs)))
            .await
            .map_err(|e| e.to_string())?;
        for p in page.get("items").and_then(Value::as_array).into_iter().flatten() {
            let name = p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?");
            let phase = p.pointer("/status/phase").and_then(Value::as_str).unwrap_or("?");
            println!("{name} {phase}");
            total += 1;
        }
        match page.pointer("/metadata/continue").and_then(Value::as_str) {
            Some(c) if !c.is_empty() => cont = c.to_string(),
            _ => break,
        }
    }
    println!("{total} pods");

    // 3. Watch Nodes with bookmarks, from a list's resourceVersion.
    let list = api.get("/api/v1/nodes?limit=1").await.map_err(|e| e.to_string())?;
    let mut rv = rv_of(&list).unwrap_or_else(|| "0".into());
    let path = format!(
        "/api/v1/nodes?{}",
        query(&[
            ("watch", "1"),
            ("resourceVersion", &rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", "290"),
        ])
    );
    let mut stream = api.watch(&path).await.map_err(|e| e.to_string())?;
    while let Some(ev) = stream.next().await.map_err(|e| e.to_string())? {
        match ev {
            RawEvent::Added(n) | RawEvent::Modified(n) => {
                rv = rv_of(&n).unwrap_or(rv);
                println!("node {}", n.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""));
            }
            RawEvent::Deleted(n) => {
                println!("node gone {}", n.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""))
            }
            // The copied api.rs drops a bookmark's object, so its resourceVersion is not kept.
            RawEvent::Bookmark => {}
            RawEvent::Error(code, msg) => {
                eprintln!("watch error {code}: {msg}");
                break;
            }
        }
    }
    println!("watched up to {rv}");

    // 4. Patch a Node's taints. api.rs has only JSON merge patch, which replaces the whole
    // taints array: read the node, add the taint, write the list back guarded by its
    // resourceVersion.
    let node_path = format!("/api/v1/nodes/{node_name}");
    let node = api.get(&node_path).await.map_err(|e| e.to_string())?;
    let mut taints: Vec<Value> = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    taints.retain(|t| t.get("key").and_then(Value::as_str) != Some("hawser.io/draining"));
    taints.push(json!({"key": "hawser.io/draining", "value": "true", "effect": "NoSchedule"}));
    let patch = json!({
        "metadata": {"resourceVersion": rv_of(&node)},
        "spec": {"taints": taints},
    });
    let patched = api.merge_patch(&node_path, &patch).await.map_err(|e| e.to_string())?;
    let n = patched.pointer("/spec/taints").and_then(Value::as_array).map_or(0, Vec::len);
    println!("{node_name} has {n} taints");
    Ok(())
}
