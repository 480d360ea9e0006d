//! Bad StartEngine bodies get a clear 4xx or 503 and change nothing: no assert trips, no
//! allocation follows a size from the request, and the agent then starts a good engine.
#![allow(clippy::unwrap_used)]

use crate::node_support::admin_node;
use hawser_api::ApiError;
use serde_json::{json, Value};

const TOKEN: &str = "agent-token-for-the-admin-input-test-0123456789";

fn replica(id: &str, state: &str) -> Value {
    json!({"replica_id": id, "node": "a", "replica_addr": "127.0.0.1:1", "state": state})
}

fn engine(size: u64, epoch: u64, replicas: Vec<Value>) -> Value {
    json!({"volume": "vol", "size_bytes": size, "epoch": epoch, "replicas": replicas,
        "controller_url": "http://127.0.0.1:1"})
}

#[tokio::test]
async fn bad_engine_requests_are_refused_and_change_nothing() {
    let (_dir, storage, engines, base, _) = admin_node("admin-input", TOKEN).await;
    let http = reqwest::Client::new();
    let good = || replica("vol-a", "in_sync");
    let nine: Vec<Value> = (0..9)
        .map(|i| replica(&format!("r{i}"), "in_sync"))
        .collect();
    let bad: Vec<(&str, Value, u16, &str)> = vec![
        (
            "no replicas",
            engine(1 << 20, 1, vec![]),
            400,
            "1 to 8 replicas",
        ),
        (
            "nine replicas",
            engine(1 << 20, 1, nine),
            400,
            "1 to 8 replicas",
        ),
        (
            "size 2^60",
            engine(1 << 60, 1, vec![good()]),
            400,
            "largest volume",
        ),
        (
            "unaligned size",
            engine(1000, 1, vec![good()]),
            400,
            "multiple of 4096",
        ),
        (
            "epoch u64::MAX",
            engine(1 << 20, u64::MAX, vec![good()]),
            400,
            "bad epoch",
        ),
        (
            "epoch 0",
            engine(1 << 20, 0, vec![good()]),
            400,
            "bad epoch",
        ),
        (
            "twice",
            engine(1 << 20, 1, vec![good(), good()]),
            400,
            "listed twice",
        ),
        (
            "none in sync",
            engine(1 << 20, 1, vec![replica("vol-a", "failed")]),
            400,
            "no replica is in sync",
        ),
        (
            "bigger than the replica",
            engine(1 << 30, 1, vec![good()]),
            503,
            "1048576 bytes",
        ),
        (
            "unknown replica",
            engine(1 << 20, 1, vec![replica("nope", "in_sync")]),
            503,
            "not found",
        ),
        ("not JSON", json!("garbage"), 422, ""),
    ];
    for (what, body, status, says) in bad {
        let resp = http
            .post(format!("{base}/v1/engines"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{what}");
        let text = resp.text().await.unwrap();
        assert!(text.contains(says), "{what}: {text}");
        if status != 422 {
            let e: ApiError = serde_json::from_str(&text).unwrap();
            assert!(!e.message.is_empty(), "{what}");
        }
        assert!(engines.get("vol").is_none(), "{what} started an engine");
    }
    let untouched = storage.replica("vol-a").unwrap();
    assert_eq!(
        untouched.epoch(),
        0,
        "no bad request raised the replica's epoch"
    );

    let resp = http
        .post(format!("{base}/v1/engines"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(&engine(1 << 20, 1, vec![good()]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    assert_eq!(storage.replica("vol-a").unwrap().epoch(), 1);
    engines.stop("vol").await;
}
