//! The four operations against kube-rs + k8s-openapi: infer config, page through Pods,
//! watch Nodes with bookmarks, patch a Node's taints. Compiles; not meant to be run here.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Client, Config};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ns = std::env::args().nth(1).unwrap_or_else(|| "default".into());
    let node_name = std::env::args().nth(2).unwrap_or_else(|| "node-1".into());

    // 1. Config: kubeconfig ($KUBECONFIG, ~/.kube/config) or the in-cluster service account.
    let config = Config::infer().await?;
    let client = Client::try_from(config)?;

    // 2. Pods in a namespace, 100 at a time (limit/continue).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut lp = ListParams::default().limit(100);
    let mut total = 0usize;
    loop {
        let page = pods.list(&lp).await?;
        for p in &page.items {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("?");
            println!("{} {}", p.metadata.name.as_deref().unwrap_or("?"), phase);
        }
        total += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    println!("{total} pods");

    // 3. Watch Nodes with bookmarks, from a list's resourceVersion.
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list_metadata(&ListParams::default().limit(1)).await?;
    let mut rv = list.metadata.resource_version.unwrap_or_else(|| "0".into());
    // WatchParams::default() sets bookmarks: true (allowWatchBookmarks=true).
    let wp = WatchParams::default().timeout(290);
    assert!(wp.bookmarks);
    let mut stream = nodes.watch(&wp, &rv).await?.boxed();
    while let Some(ev) = stream.try_next().await? {
        match ev {
            WatchEvent::Added(n) | WatchEvent::Modified(n) => {
                rv = n.metadata.resource_version.clone().unwrap_or(rv);
                println!("node {}", n.metadata.name.unwrap_or_default());
            }
            WatchEvent::Deleted(n) => println!("node gone {}", n.metadata.name.unwrap_or_default()),
            WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
            WatchEvent::Error(e) => {
                eprintln!("watch error {}: {}", e.code, e.message);
                break;
            }
        }
    }
    println!("watched up to {rv}");

    // 4. Patch a Node's taints (strategic merge patch of spec.taints).
    let taint = Taint {
        key: "hawser.io/draining".into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    let patch = Node {
        spec: Some(NodeSpec { taints: Some(vec![taint]), ..Default::default() }),
        ..Default::default()
    };
    let patched = nodes
        .patch(&node_name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    let n = patched.spec.and_then(|s| s.taints).map_or(0, |t| t.len());
    println!("{node_name} has {n} taints");
    let _ = serde_json::to_string(&patched.metadata)?;
    Ok(())
}
