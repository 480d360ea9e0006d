//! `AgentClient::engines` against a current agent (`GET /v1/engines`) and one from before
//! that route (its `/v1/engines` takes only POST; its full status has the engines).
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use axum::routing::{get, post};
use axum::{Json, Router};
use hawser_api::agent::{AgentStatus, EngineStatus};

use super::{Agent, AgentClient};

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
