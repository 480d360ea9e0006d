//! Malformed and invalid requests get a 4xx JSON `ApiError`, create nothing, and leave the
//! server answering.
#![allow(clippy::unwrap_used)]

use crate::common::{code, pool, Cluster, GIB};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn bad_create_requests_are_400_and_create_nothing() {
    let c = Cluster::start(3).await;
    let bad = [
        json!({"name": "x", "size_bytes": "10GiB", "replicas": 1}),
        json!({"name": "x", "size_bytes": -4096, "replicas": 1}),
        json!({"name": "x", "size_bytes": 4096, "replicas": 1, "colour": "blue"}),
        json!({"name": "x", "size_bytes": 4096}),
        json!({"name": 7, "size_bytes": 4096, "replicas": 1}),
        json!({"name": "x", "size_bytes": 0, "replicas": 1}),
        json!({"name": "x", "size_bytes": 1000, "replicas": 1}),
        json!({"name": "x", "size_bytes": 4096, "replicas": 0}),
        json!({"name": "x", "size_bytes": 4096, "replicas": 6}),
        json!({"name": "Bad_Name", "size_bytes": 4096, "replicas": 1}),
        json!({"name": "", "size_bytes": 4096, "replicas": 1}),
        json!({"name": "-x", "size_bytes": 4096, "replicas": 1}),
        json!({"name": "a".repeat(64), "size_bytes": 4096, "replicas": 1}),
        json!({"name": "x", "size_bytes": (1u64 << 62) + 4096, "replicas": 1}),
        json!([1, 2, 3]),
    ];
    for body in bad {
        let (status, e) = c.post("/v1/volumes", body.clone()).await;
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "{body}: {e}");
    }
    let (_, e) = c.create("x", 0, 1).await;
    assert_eq!(e["message"], "size must be greater than 0");
    let (_, e) = c.create("x", 1000, 1).await;
    assert_eq!(
        e["message"],
        "size 1000 bytes is not a multiple of 4096 bytes"
    );
    for (ct, body) in [
        ("application/json", b"{not json".to_vec()),
        ("application/json", b"".to_vec()),
        ("text/plain", b"{}".to_vec()),
        ("application/json", vec![0xff, 0xfe, 0x00]),
    ] {
        let (status, e) = c.raw(Method::POST, "/v1/volumes", ct, body.clone()).await;
        assert_eq!(
            (status, code(&e)),
            (400, "invalid_argument"),
            "{ct} {body:?}: {e}"
        );
    }
    assert!(c.volume_names().await.is_empty());
    assert!(c.all_replicas().is_empty());
    assert_eq!(
        c.create("ok", GIB, 1).await.0,
        201,
        "the server still works"
    );
}

#[tokio::test]
async fn oversized_body_is_413_json() {
    let c = Cluster::start(1).await;
    let big = format!(
        r#"{{"name":"x","size_bytes":4096,"replicas":1,"pad":"{}"}}"#,
        "a".repeat(2 << 20)
    );
    let (status, e) = c
        .raw(
            Method::POST,
            "/v1/volumes",
            "application/json",
            big.into_bytes(),
        )
        .await;
    assert_eq!((status, code(&e)), (413, "invalid_argument"), "{e}");
    assert!(c.volume_names().await.is_empty());
    assert_eq!(c.create("ok", GIB, 1).await.0, 201);
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json() {
    let c = Cluster::start(1).await;
    let (status, e) = c.get("/v2/nothing").await;
    assert_eq!((status, code(&e)), (404, "not_found"), "{e}");
    let (status, e) = c.send(Method::PATCH, "/v1/volumes", None).await;
    assert_eq!(status, 405, "{e}");
}

#[tokio::test]
async fn bad_node_registrations_are_400() {
    let c = Cluster::start(1).await;
    let good = |pools: serde_json::Value| {
        json!({"admin_addr": "127.0.0.1:9500", "replica_addr": "10.0.0.1:9501",
               "nbd_addr": null, "nbd_socket": null, "pools": pools})
    };
    let mut wrong_node = pool("n9", GIB, GIB);
    wrong_node.node = "other".into();
    let mut bad_ratio = pool("n9", GIB, GIB);
    bad_ratio.overprovision_ratio = 0.0;
    let cases = [
        ("/v1/nodes/Bad_Name", good(json!([]))),
        (
            "/v1/nodes/n9",
            json!({"admin_addr": "nope", "replica_addr": "10.0.0.1:1", "pools": []}),
        ),
        (
            "/v1/nodes/n9",
            json!({"admin_addr": "h:1", "replica_addr": "h:0", "pools": []}),
        ),
        (
            "/v1/nodes/n9",
            json!({"admin_addr": "h:1", "replica_addr": "h:2", "pools": [], "x": 1}),
        ),
        ("/v1/nodes/n9", good(json!([wrong_node]))),
        ("/v1/nodes/n9", good(json!([bad_ratio]))),
        (
            "/v1/nodes/n9",
            good(json!([pool("n9", GIB, GIB), pool("n9", GIB, GIB)])),
        ),
        ("/v1/nodes/n9", good(json!([{"node": "n9", "name": "p"}]))),
    ];
    for (path, body) in cases {
        let (status, e) = c.put(path, body.clone()).await;
        assert_eq!(
            (status, code(&e)),
            (400, "invalid_argument"),
            "{path} {body}: {e}"
        );
    }
    let (_, nodes) = c.get("/v1/nodes").await;
    assert_eq!(nodes.as_array().unwrap().len(), 1, "only n1: {nodes}");
    let (status, _) = c
        .put("/v1/nodes/n9", good(json!([pool("n9", GIB, GIB)])))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn bad_attach_bodies() {
    let c = Cluster::start(1).await;
    c.create("v", GIB, 1).await;
    for body in [
        json!({}),
        json!({"node": 1}),
        json!({"node": "n1", "force": true}),
    ] {
        let (status, e) = c.post("/v1/volumes/v/attach", body.clone()).await;
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "{body}: {e}");
    }
    assert_eq!(c.volume("v").await["state"], "detached");
}

/// No token, malformed or wrong tokens: 401 `unauthorized` with a JSON body and a
/// `WWW-Authenticate: Bearer` header, on known routes and unknown ones alike; the agent token
/// on an admin route: 403 `forbidden`. Nothing is created, and the server still answers.
#[tokio::test]
async fn missing_wrong_and_misused_tokens_are_refused() {
    let c = Cluster::start(2).await;
    let create = json!({"name": "x", "size_bytes": GIB, "replicas": 1});
    let admin = c.admin_token.clone();
    let long = format!("Bearer {}", "a".repeat(10_000));
    let unauthorized = [
        None,
        Some("".to_string()),
        Some("Bearer".to_string()),
        Some("Bearer ".to_string()),
        Some(format!("Basic {admin}")),
        Some(admin.clone()),
        Some(format!("Bearer {}", "0".repeat(64))),
        Some(format!("Bearer {admin}x")),
        Some(format!("Bearer {}", &admin[..admin.len() - 1])),
        Some(long),
    ];
    for auth in &unauthorized {
        for (method, path) in [
            (Method::POST, "/v1/volumes"),
            (Method::GET, "/v1/volumes"),
            (Method::GET, "/v1/no-such-route"),
            (Method::PATCH, "/v1/volumes"),
            (Method::PUT, "/v1/nodes/n1"),
        ] {
            let (status, e) = c
                .send_auth(auth.as_deref(), method.clone(), path, Some(create.clone()))
                .await;
            let shown = auth.as_deref().map(|a| &a[..a.len().min(40)]);
            assert_eq!(
                (status, code(&e)),
                (401, "unauthorized"),
                "{method} {path} with {shown:?}: {e}"
            );
        }
    }
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/volumes", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");

    let agent = format!("Bearer {}", c.agent_token);
    for (method, path) in [
        (Method::POST, "/v1/volumes"),
        (Method::GET, "/v1/volumes"),
        (Method::GET, "/v1/nodes"),
        (Method::GET, "/v1/nodes/n1"),
        (Method::GET, "/v1/pools"),
        (Method::DELETE, "/v1/volumes/x"),
        (Method::POST, "/v1/volumes/x/attach"),
    ] {
        let (status, e) = c
            .send_auth(Some(&agent), method.clone(), path, Some(create.clone()))
            .await;
        assert_eq!(
            (status, code(&e)),
            (403, "forbidden"),
            "{method} {path}: {e}"
        );
    }
    assert!(c.volume_names().await.is_empty());
    assert!(c.all_replicas().is_empty());

    // The agent token works where agents need it; the admin token everywhere.
    let a = c.agent("n1");
    let body = json!({"admin_addr": a.addr.to_string(), "replica_addr": "127.0.0.1:9",
        "nbd_addr": null, "nbd_socket": null, "pools": [pool("n1", 100 * GIB, 100 * GIB)]});
    let (status, e) = c
        .send_auth(Some(&agent), Method::PUT, "/v1/nodes/n1", Some(body))
        .await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(
        c.create("ok", GIB, 2).await.0,
        201,
        "the server still works"
    );
    // The controller called the agents with the agent token, every time.
    for a in &c.agents {
        let calls = a.authorizations();
        assert!(!calls.is_empty());
        assert!(
            calls.iter().all(|h| h.as_deref() == Some(agent.as_str())),
            "{calls:?}"
        );
    }
}
