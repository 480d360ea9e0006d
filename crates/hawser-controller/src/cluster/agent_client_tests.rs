//! `AgentClient::engines` against a current agent (`GET /v1/engines`) and one from before
//! that route (its `/v1/engines` takes only POST; its full status has the engines), and
//! `AgentClient::held_replicas` with and without a tag, and against an agent from before
//! `GET /v1/replicas/held`.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use axum::routing::{delete, get, post};
use axum::{Json, Router};
use hawser_api::agent::{AgentStatus, EngineStatus, HeldReplica, ReplicaStatus};

use super::{Agent, AgentClient, HeldAnswer};

fn engine(volume: &str) -> EngineStatus {
    EngineStatus {
        volume: volume.into(),
        epoch: 3,
        size_bytes: 1 << 20,
        in_sync: vec!["r1".into()],
        replicas: vec![],
        recovery: None,
        active_extents: 0,
        qos: Default::default(),
        scrub: None,
    }
}

/// Serves `app` on loopback, recording the path of every request; returns its address.
async fn serve(app: Router, paths: Arc<Mutex<Vec<String>>>) -> String {
    let app = app.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let paths = paths.clone();
            async move {
                let line = format!("{} {}", req.method(), req.uri().path());
                paths.lock().unwrap().push(line);
                next.run(req).await
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn status() -> AgentStatus {
    AgentStatus {
        node: "n1".into(),
        pools: vec![],
        replicas: vec![],
        engines: vec![engine("old")],
        trash: vec![],
        cluster_id: None,
    }
}

#[tokio::test]
async fn engines_are_asked_alone_and_an_older_agent_falls_back_to_its_status() {
    let client = AgentClient::new(Some("t"), None).unwrap();

    let paths = Arc::new(Mutex::new(vec![]));
    let current = Router::new()
        .route(
            "/v1/engines",
            post(|| async { "" }).get(|| async { Json(vec![engine("new")]) }),
        )
        .route("/v1/status", get(|| async { Json(status()) }));
    let addr = serve(current, paths.clone()).await;
    let to = Agent {
        node: "n1",
        addr: &addr,
    };
    let engines = client.engines(to).await.unwrap();
    assert_eq!(engines, [engine("new")]);
    assert_eq!(
        *paths.lock().unwrap(),
        ["GET /v1/engines"],
        "not the status"
    );

    let paths = Arc::new(Mutex::new(vec![]));
    let older = Router::new()
        .route("/v1/engines", post(|| async { "" }))
        .route("/v1/status", get(|| async { Json(status()) }));
    let addr = serve(older, paths.clone()).await;
    let to = Agent {
        node: "n1",
        addr: &addr,
    };
    let engines = client.engines(to).await.unwrap();
    assert_eq!(engines, [engine("old")]);
    assert_eq!(
        *paths.lock().unwrap(),
        ["GET /v1/engines", "GET /v1/status"],
        "405 from the older agent, then its status"
    );

    // Any other refusal is an error, not a fallback.
    let paths = Arc::new(Mutex::new(vec![]));
    let failing = Router::new().route(
        "/v1/engines",
        get(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
    );
    let addr = serve(failing, paths.clone()).await;
    let to = Agent {
        node: "n1",
        addr: &addr,
    };
    let err = client.engines(to).await.unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
    assert_eq!(*paths.lock().unwrap(), ["GET /v1/engines"]);
}

fn held(id: &str) -> HeldReplica {
    HeldReplica {
        replica_id: id.into(),
        volume: "v".into(),
        failed: false,
    }
}

/// An agent whose list is tagged `"t1"`: 304 to a request that names that tag.
async fn tagged_list(headers: axum::http::HeaderMap) -> axum::response::Response {
    use axum::http::header::{ETAG, IF_NONE_MATCH};
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    if headers.get(IF_NONE_MATCH).is_some_and(|t| t == "\"t1\"") {
        return (StatusCode::NOT_MODIFIED, [(ETAG, "\"t1\"")]).into_response();
    }
    ([(ETAG, "\"t1\"")], Json(vec![held("r1")])).into_response()
}

#[tokio::test]
async fn held_replicas_are_sent_once_per_change_and_an_older_agent_sends_its_status() {
    let client = AgentClient::new(Some("t"), None).unwrap();

    let paths = Arc::new(Mutex::new(vec![]));
    let current = Router::new()
        .route("/v1/replicas/held", get(tagged_list))
        .route("/v1/status", get(|| async { Json(status()) }));
    let addr = serve(current, paths.clone()).await;
    let to = Agent {
        node: "n1",
        addr: &addr,
    };
    let listed = HeldAnswer::Listed {
        tag: Some("\"t1\"".into()),
        replicas: vec![held("r1")],
    };
    assert_eq!(client.held_replicas(to, None).await.unwrap(), listed);
    assert_eq!(
        client.held_replicas(to, Some("\"t1\"")).await.unwrap(),
        HeldAnswer::Unchanged
    );
    assert_eq!(
        client.held_replicas(to, Some("\"t0\"")).await.unwrap(),
        listed,
        "another tag: the list"
    );
    assert_eq!(paths.lock().unwrap().len(), 3);
    assert!(paths
        .lock()
        .unwrap()
        .iter()
        .all(|p| p == "GET /v1/replicas/held"));

    // Before the route, GET on the path is a 405 (only DELETE /v1/replicas/{id}).
    let paths = Arc::new(Mutex::new(vec![]));
    let mut old_status = status();
    old_status.replicas = vec![ReplicaStatus {
        replica_id: "r9".into(),
        volume: "v".into(),
        pool: "default".into(),
        size_bytes: 1 << 20,
        thin: true,
        epoch: 1,
        allocated_bytes: 0,
        data_path: "/x".into(),
        failed: true,
        error: None,
        cluster_id: None,
        key_check: None,
        checksums: false,
        wrapped_key: None,
        volume_uid: None,
    }];
    let older = Router::new()
        .route("/v1/replicas/{id}", delete(|| async { "" }))
        .route("/v1/status", get(move || async move { Json(old_status) }));
    let addr = serve(older, paths.clone()).await;
    let to = Agent {
        node: "n1",
        addr: &addr,
    };
    let answer = client.held_replicas(to, Some("\"t1\"")).await.unwrap();
    let mut r9 = held("r9");
    r9.failed = true;
    assert_eq!(
        answer,
        HeldAnswer::Listed {
            tag: None,
            replicas: vec![r9]
        }
    );
    assert_eq!(
        *paths.lock().unwrap(),
        ["GET /v1/replicas/held", "GET /v1/status"]
    );
}
