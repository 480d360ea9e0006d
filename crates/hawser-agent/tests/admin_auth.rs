//! The agent's admin API requires the agent token on every call: without it (or with a
//! wrong one) a 401 JSON `ApiError` and nothing done; with it, the call runs.
#![allow(clippy::unwrap_used)]

use crate::node_support::admin_node;
use hawser_api::ApiError;
use serde_json::json;

const TOKEN: &str = "agent-token-for-the-admin-api-test-0123456789";

#[tokio::test]
async fn admin_calls_need_the_agent_token() {
    let (_dir, storage, _, base, metrics) = admin_node("admin-auth", TOKEN).await;
    let http = reqwest::Client::new();
    let create = json!({"replica_id": "r2", "volume": "v", "size_bytes": 1 << 20,
        "pool": "default", "thin": true});
    let wrong = format!("Bearer {}", "z".repeat(TOKEN.len()));
    for auth in [None, Some("Bearer"), Some(wrong.as_str()), Some(TOKEN)] {
        let calls = [
            http.get(format!("{base}/v1/status")),
            http.get(format!("{base}/v1/engines")),
            http.get(format!("{base}/v1/replicas/held")),
            http.post(format!("{base}/v1/replicas")).json(&create),
            http.delete(format!("{base}/v1/replicas/vol-a")),
            http.delete(format!("{base}/v1/engines/vol")),
            http.post(format!("{base}/v1/engines/vol/grow"))
                .json(&json!({"size_bytes": 2 << 20})),
            http.get(format!("{base}/v1/devices")),
            http.post(format!("{base}/v1/backup-jobs"))
                .json(&json!({"backup": "b"})),
            http.get(format!("{base}/v1/backup-jobs/b")),
            http.post(format!("{base}/v1/restore-jobs"))
                .json(&json!({"replica": "vol-a"})),
            http.put(format!("{base}/v1/replicas/vol-a/wrapped-key"))
                .json(&json!({"kek": 2, "wrapped": "AAAA", "check": "00".repeat(16)})),
        ];
        for req in calls {
            let req = match auth {
                Some(a) => req.header("authorization", a),
                None => req,
            };
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 401, "{auth:?}");
            assert_eq!(resp.headers()["www-authenticate"], "Bearer");
            let e: ApiError = resp.json().await.unwrap();
            assert_eq!(e.code, hawser_api::ErrorCode::Unauthorized, "{auth:?}");
        }
    }
    let ids = |s: &hawser_agent::storage::pools::NodeStorage| {
        s.replica_statuses()
            .into_iter()
            .map(|r| r.replica_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&storage), ["vol-a"], "nothing was created or deleted");
    let bearer = format!("Bearer {TOKEN}");
    let resp = http
        .post(format!("{base}/v1/replicas"))
        .header("authorization", &bearer)
        .json(&create)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let resp = http
        .get(format!("{base}/v1/status"))
        .header("authorization", &bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(ids(&storage).len(), 2);
    let resp = http
        .get(format!("{base}/v1/engines"))
        .header("authorization", &bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let engines: Vec<hawser_api::agent::EngineStatus> = resp.json().await.unwrap();
    assert!(engines.is_empty(), "no engine runs: {engines:?}");

    // Metrics: the scrape token the controller named, or the agent token; nothing else.
    const SCRAPE: &str = "metrics-token-for-the-admin-api-test";
    let scrape = |auth: Option<String>| {
        let req = http.get(format!("{base}/metrics"));
        let req = match auth {
            Some(a) => req.header("authorization", a),
            None => req,
        };
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    assert_eq!(scrape(None).await.0, 401);
    assert_eq!(
        scrape(Some(format!("Bearer {SCRAPE}"))).await.0,
        401,
        "not named yet"
    );
    metrics.set_scrape_tokens(&[hawser_api::auth::digest_hex(&hawser_api::auth::digest(
        SCRAPE,
    ))]);
    let (status, body) = scrape(Some(format!("Bearer {SCRAPE}"))).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#"hawser_pool_replicas{pool="default"} 2"#),
        "{body}"
    );
    assert!(body.contains("process_resident_memory_bytes "), "{body}");
    assert_eq!(
        scrape(Some(bearer.clone())).await.0,
        200,
        "the agent token scrapes too"
    );
    let resp = http
        .get(format!("{base}/v1/status"))
        .header("authorization", format!("Bearer {SCRAPE}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401, "the metrics token opens nothing else");

    // The reconcile round's list: tagged, and not sent again while it is unchanged.
    let held = |tag: Option<&str>| {
        let req = http
            .get(format!("{base}/v1/replicas/held"))
            .header("authorization", &bearer);
        let req = match tag {
            Some(t) => req.header("if-none-match", t),
            None => req,
        };
        async move {
            let resp = req.send().await.unwrap();
            let tag = resp.headers()["etag"].to_str().unwrap().to_string();
            (resp.status().as_u16(), tag, resp.text().await.unwrap())
        }
    };
    let (code, tag, body) = held(None).await;
    assert_eq!(code, 200);
    let list: Vec<hawser_api::agent::HeldReplica> = serde_json::from_str(&body).unwrap();
    let listed: Vec<&str> = list.iter().map(|r| r.replica_id.as_str()).collect();
    assert_eq!(listed, ["r2", "vol-a"]);
    assert_eq!(held(Some(&tag)).await, (304, tag.clone(), String::new()));
    let resp = http
        .delete(format!("{base}/v1/replicas/r2"))
        .header("authorization", &bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let (code, changed, body) = held(Some(&tag)).await;
    assert_eq!(code, 200, "a replica was deleted: the list again");
    assert_ne!(changed, tag);
    assert!(body.contains("vol-a") && !body.contains("r2"), "{body}");
}

/// A call meant for another node (its `x-hawser-node` header names it) is refused with a
/// Conflict and does nothing: the controller may still call a node's old address after
/// another node's agent took it over, and must not create or delete replicas there.
#[tokio::test]
async fn calls_meant_for_another_node_are_refused() {
    let (_dir, storage, _, base, _) = admin_node("admin-node", TOKEN).await;
    let http = reqwest::Client::new();
    let bearer = format!("Bearer {TOKEN}");
    let create = json!({"replica_id": "r2", "volume": "v", "size_bytes": 1 << 20,
        "pool": "default", "thin": true});
    let calls = [
        http.get(format!("{base}/v1/status")),
        http.post(format!("{base}/v1/replicas")).json(&create),
        http.delete(format!("{base}/v1/replicas/vol-a")),
        http.delete(format!("{base}/v1/engines/vol")),
    ];
    for req in calls {
        let resp = req
            .header("authorization", &bearer)
            .header(hawser_api::agent::NODE_HEADER, "b")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 409);
        let e: ApiError = resp.json().await.unwrap();
        assert_eq!(e.code, hawser_api::ErrorCode::Conflict);
        assert!(e.message.contains("node a, not b"), "{}", e.message);
    }
    let ids = || {
        storage
            .replica_statuses()
            .into_iter()
            .map(|r| r.replica_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(), ["vol-a"], "nothing was created or deleted");
    // Meant for this node: done.
    let resp = http
        .post(format!("{base}/v1/replicas"))
        .header("authorization", &bearer)
        .header(hawser_api::agent::NODE_HEADER, "a")
        .json(&create)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(ids().len(), 2);
}
