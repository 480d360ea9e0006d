//! `docs/openapi.json` against the running controller: the document lists exactly the
//! routes the router serves, every route answers (no `no route`), and real responses
//! (successes and errors) validate against the document's schemas for their status.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use crate::common::{code, schema, Cluster, Op, GIB};
use reqwest::Method;
use serde_json::{json, Value};

fn document() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// (METHOD, path) of every operation in the document.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.insert((method.to_uppercase(), path.clone()));
        }
    }
    ops
}

#[test]
fn the_document_lists_exactly_the_served_routes() {
    let doc = document();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let served: BTreeSet<(String, String)> = hawser_controller::route_table().into_iter().collect();
    let documented = documented(&doc);
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let not_served: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not documented: {undocumented:?}"
    );
    assert!(
        not_served.is_empty(),
        "documented but not served: {not_served:?}"
    );
    // The bearer scheme, and the error body on every operation's 401.
    let schemes = &doc["components"]["securitySchemes"];
    for s in ["adminToken", "agentToken"] {
        assert_eq!(schemes[s]["scheme"], "bearer", "{s}");
    }
    for (method, path) in &documented {
        let op = &doc["paths"][path][method.to_lowercase()];
        let e = &op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"];
        assert_eq!(e, "#/components/schemas/ApiError", "{method} {path}");
    }
}

/// Sends a request and checks its answer against the document's operation
/// `(method, template)`: the status must be documented and the body must validate.
struct Probe<'a> {
    c: &'a Cluster,
    doc: Value,
    seen: BTreeSet<(String, String, u16)>,
}

impl Probe<'_> {
    async fn call(
        &mut self,
        auth: Option<&str>,
        (method, template): (Method, &str),
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let auth = auth.map(|t| format!("Bearer {t}"));
        let (status, got) = self
            .c
            .send_auth(auth.as_deref(), method.clone(), path, body)
            .await;
        let op = &self.doc["paths"][template][method.as_str().to_lowercase()];
        assert!(op.is_object(), "{method} {template} is not in the document");
        let resp = &op["responses"][status.to_string()];
        assert!(
            resp.is_object(),
            "{method} {path}: status {status} is not documented: {got}"
        );
        match resp["content"]["application/json"]["schema"].clone() {
            Value::Null => assert!(got.is_null(), "{method} {path}: {status} has a body"),
            s => {
                let errors = schema::validate(&self.doc, &s, &got);
                assert!(
                    errors.is_empty(),
                    "{method} {path} {status}: {errors:#?}\n{got}"
                );
            }
        }
        self.seen
            .insert((method.to_string(), template.to_string(), status));
        (status, got)
    }
}

#[tokio::test]
async fn real_responses_validate_against_the_document() {
    let c = Cluster::start(2).await;
    let (admin, agent) = (c.admin_token.clone(), c.agent_token.clone());
    let mut p = Probe {
        c: &c,
        doc: document(),
        seen: BTreeSet::new(),
    };
    let (a, g) = (Some(admin.as_str()), Some(agent.as_str()));
    let vols = (Method::POST, "/v1/volumes");
    let vol = "/v1/volumes/{name}";
    let register = (Method::PUT, "/v1/nodes/{node}");
    let n1 = c.agent("n1");
    let body = json!({"admin_addr": n1.addr.to_string(), "replica_addr": "127.0.0.1:9",
        "nbd_addr": null, "nbd_socket": null, "labels": {},
        "pools": [crate::common::pool("n1", 100 * GIB, 100 * GIB)]});
    assert_eq!(
        p.call(g, register.clone(), "/v1/nodes/n1", Some(body))
            .await
            .0,
        200
    );
    let bad = json!({"admin_addr": "nowhere", "replica_addr": 9});
    assert_eq!(p.call(g, register, "/v1/nodes/n1", Some(bad)).await.0, 400);
    // A restarted agent asks for its engines; an unknown node is 404.
    let engines = (Method::POST, "/v1/nodes/{node}/engines");
    // The client that brings no token is refused on both agent-only node calls.
    assert_eq!(
        p.call(None, engines.clone(), "/v1/nodes/n1/engines", None)
            .await
            .0,
        401
    );
    let nothing = json!({"volume": "v", "reason": "FrontendFallback", "message": "x"});
    let events_path = (Method::POST, "/v1/nodes/{node}/events");
    assert_eq!(
        p.call(None, events_path, "/v1/nodes/n1/events", Some(nothing))
            .await
            .0,
        401
    );
    assert_eq!(
        p.call(g, engines.clone(), "/v1/nodes/n1/engines", None)
            .await
            .0,
        202
    );
    assert_eq!(
        p.call(a, engines, "/v1/nodes/n9/engines", None).await.0,
        404
    );
    p.call(a, (Method::GET, "/v1/nodes"), "/v1/nodes", None)
        .await;
    p.call(a, (Method::GET, "/v1/nodes/{node}"), "/v1/nodes/n1", None)
        .await;
    p.call(a, (Method::GET, "/v1/nodes/{node}"), "/v1/nodes/n9", None)
        .await;
    p.call(a, (Method::GET, "/v1/pools"), "/v1/pools", None)
        .await;
    let create = json!({"name": "v", "size_bytes": GIB, "replicas": 2});
    assert_eq!(
        p.call(a, vols.clone(), "/v1/volumes", Some(create.clone()))
            .await
            .0,
        201
    );
    assert_eq!(
        p.call(a, vols.clone(), "/v1/volumes", Some(create)).await.0,
        409
    );
    let bad = json!({"name": "w", "size_bytes": "1GiB", "replicas": 1});
    assert_eq!(
        p.call(a, vols.clone(), "/v1/volumes", Some(bad)).await.0,
        400
    );
    let huge = json!({"name": "w", "size_bytes": 1u64 << 45, "replicas": 2});
    assert_eq!(
        p.call(a, vols.clone(), "/v1/volumes", Some(huge)).await.0,
        507
    );
    p.call(a, (Method::GET, "/v1/volumes"), "/v1/volumes", None)
        .await;
    p.call(a, (Method::GET, vol), "/v1/volumes/v", None).await;
    p.call(a, (Method::GET, vol), "/v1/volumes/nope", None)
        .await;
    let attach = (Method::POST, "/v1/volumes/{name}/attach");
    let (s, v) = p
        .call(
            a,
            attach,
            "/v1/volumes/v/attach",
            Some(json!({"node": "n1"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let replica = v["replicas"][1]["id"].as_str().unwrap().to_string();
    let epoch = v["epoch"].as_u64().unwrap();
    let outdate = (Method::POST, "/v1/volumes/{name}/replicas/{id}/outdate");
    let in_sync = (Method::POST, "/v1/volumes/{name}/replicas/{id}/in-sync");
    let r = format!("/v1/volumes/v/replicas/{replica}");
    let body = json!({"epoch": epoch, "reason": "test"});
    assert_eq!(
        p.call(g, outdate.clone(), &format!("{r}/outdate"), Some(body))
            .await
            .0,
        200
    );
    let stale = json!({"epoch": epoch - 1, "reason": "old"});
    assert_eq!(
        p.call(g, outdate, &format!("{r}/outdate"), Some(stale))
            .await
            .0,
        409
    );
    let body = json!({"epoch": epoch});
    assert_eq!(
        p.call(g, in_sync, &format!("{r}/in-sync"), Some(body))
            .await
            .0,
        200
    );
    // An agent's report about a device of a volume attached to it; about another node's
    // volume it is refused, and an unknown volume is 404.
    let dev_event = (Method::POST, "/v1/nodes/{node}/events");
    let ev = json!({"volume": "v", "reason": "FrontendFallback", "message": "ublk unavailable"});
    let to = |n: &str| format!("/v1/nodes/{n}/events");
    assert_eq!(
        p.call(g, dev_event.clone(), &to("n1"), Some(ev.clone()))
            .await
            .0,
        202
    );
    assert_eq!(
        p.call(g, dev_event.clone(), &to("n2"), Some(ev)).await.0,
        400
    );
    let gone = json!({"volume": "nope", "reason": "NoKernelFrontend", "message": "x"});
    assert_eq!(
        p.call(g, dev_event.clone(), &to("n1"), Some(gone)).await.0,
        404
    );
    let odd = json!({"volume": "v", "reason": "Anything", "message": "x"});
    assert_eq!(p.call(g, dev_event, &to("n1"), Some(odd)).await.0, 400);
    // Health, replicas, evacuation (while the volume has an outdated-then-resynced replica).
    p.call(a, (Method::GET, "/v1/status"), "/v1/status", None)
        .await;
    let (s, io) = p.call(a, (Method::GET, "/v1/io"), "/v1/io", None).await;
    assert_eq!(s, 200, "{io}");
    let (s, events) = p
        .call(a, (Method::GET, "/v1/events"), "/v1/events", None)
        .await;
    assert_eq!(s, 200, "{events}");
    let reasons: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    // Newest first: the resync after the outdate, after the attach, after the create.
    let at = |r: &str| reasons.iter().position(|x| *x == r).unwrap_or(usize::MAX);
    assert!(
        at("Resynced") < at("Degraded") && at("Degraded") < at("Attached"),
        "{reasons:?}"
    );
    assert!(at("Attached") < at("Created"), "{reasons:?}");
    assert!(at("FrontendFallback") < at("Resynced"), "{reasons:?}");
    // Snapshots of the attached volume.
    let snaps = (Method::POST, "/v1/snapshots");
    let body = json!({"name": "s1", "volume": "v"});
    let (s, snap) = p.call(a, snaps.clone(), "/v1/snapshots", Some(body)).await;
    assert_eq!(s, 201, "{snap}");
    let body = json!({"name": "s1", "volume": "w-none"});
    assert_eq!(
        p.call(a, snaps.clone(), "/v1/snapshots", Some(body))
            .await
            .0,
        409
    );
    let body = json!({"name": "BAD", "volume": "v"});
    assert_eq!(p.call(a, snaps, "/v1/snapshots", Some(body)).await.0, 400);
    let list = (Method::GET, "/v1/snapshots");
    let (s, all) = p.call(a, list.clone(), "/v1/snapshots", None).await;
    assert_eq!((s, all.as_array().map(Vec::len)), (200, Some(1)), "{all}");
    assert_eq!(
        p.call(a, list, "/v1/snapshots?volume=nope", None).await.0,
        404
    );
    let one = (Method::GET, "/v1/snapshots/{name}");
    assert_eq!(
        p.call(a, one.clone(), "/v1/snapshots/s1", None).await.0,
        200
    );
    assert_eq!(p.call(a, one, "/v1/snapshots/nope", None).await.0, 404);
    let del = (Method::DELETE, "/v1/snapshots/{name}");
    assert_eq!(
        p.call(a, del.clone(), "/v1/snapshots/s1", None).await.0,
        204
    );
    assert_eq!(p.call(a, del, "/v1/snapshots/s1", None).await.0, 404);
    probe_backups(&mut p, a).await;
    let (s, list) = p
        .call(a, (Method::GET, "/v1/replicas"), "/v1/replicas", None)
        .await;
    assert_eq!((s, list.as_array().map(Vec::len)), (200, Some(2)), "{list}");
    let one = (Method::GET, "/v1/replicas/{id}");
    assert_eq!(
        p.call(a, one.clone(), &format!("/v1/replicas/{replica}"), None)
            .await
            .0,
        200
    );
    assert_eq!(p.call(a, one, "/v1/replicas/nope", None).await.0, 404);
    let evacuate = (Method::POST, "/v1/nodes/{node}/evacuate");
    let restore = (Method::POST, "/v1/nodes/{node}/restore");
    let (s, n) = p
        .call(a, evacuate.clone(), "/v1/nodes/n2/evacuate", None)
        .await;
    assert_eq!((s, &n["evacuating"]), (200, &json!(true)), "{n}");
    assert_eq!(
        p.call(a, evacuate, "/v1/nodes/n9/evacuate", None).await.0,
        404
    );
    let (s, n) = p.call(a, restore, "/v1/nodes/n2/restore", None).await;
    assert_eq!((s, &n["evacuating"]), (200, &json!(false)), "{n}");
    let del = (Method::DELETE, vol);
    assert_eq!(p.call(a, del.clone(), "/v1/volumes/v", None).await.0, 409);
    // Limits: changed live on the attached volume; a change naming none is 400.
    let qos = (Method::POST, "/v1/volumes/{name}/qos");
    let cap = json!({"write_iops": 1000});
    let (s, v) = p.call(a, qos.clone(), "/v1/volumes/v/qos", Some(cap)).await;
    assert_eq!((s, &v["qos"]["write_iops"]), (200, &json!(1000)), "{v}");
    let none = p.call(a, qos, "/v1/volumes/v/qos", Some(json!({})));
    assert_eq!(none.await.0, 400);
    // Scrub: of the attached volume; its engine view shows the pass.
    let scrub = (Method::POST, "/v1/volumes/{name}/scrub");
    let (s, v) = p.call(a, scrub.clone(), "/v1/volumes/v/scrub", None).await;
    assert_eq!(
        (s, &v["engine"]["scrub"]["running"]),
        (200, &json!(true)),
        "{v}"
    );
    assert_eq!(
        p.call(a, scrub.clone(), "/v1/volumes/nope/scrub", None)
            .await
            .0,
        404
    );
    // Expand: refused (409) where the attached volume's device cannot grow, else online.
    let expand = (Method::POST, "/v1/volumes/{name}/expand");
    let bigger = json!({"size_bytes": 2 * GIB});
    let node = c.volume("v").await["attached_node"]
        .as_str()
        .unwrap()
        .to_string();
    c.agent(&node).fail(Op::GrowEngineCannot, true);
    let attached = p.call(
        a,
        expand.clone(),
        "/v1/volumes/v/expand",
        Some(bigger.clone()),
    );
    assert_eq!(attached.await.0, 409);
    c.agent(&node).fail(Op::GrowEngineCannot, false);
    let detach = (Method::POST, "/v1/volumes/{name}/detach");
    assert_eq!(p.call(a, detach, "/v1/volumes/v/detach", None).await.0, 200);
    // A detached volume has no engine to scrub.
    assert_eq!(p.call(a, scrub, "/v1/volumes/v/scrub", None).await.0, 409);
    let (s, v) = p
        .call(a, expand.clone(), "/v1/volumes/v/expand", Some(bigger))
        .await;
    assert_eq!((s, &v["size_bytes"]), (200, &json!(2 * GIB)), "{v}");
    // Restore: to a snapshot of the detached volume; unknown snapshots are 404.
    let body = json!({"name": "s2", "volume": "v"});
    let (s, snap) = p
        .call(
            a,
            (Method::POST, "/v1/snapshots"),
            "/v1/snapshots",
            Some(body),
        )
        .await;
    assert_eq!(s, 201, "{snap}");
    let restore = (Method::POST, "/v1/volumes/{name}/restore");
    let (s, v) = p
        .call(
            a,
            restore.clone(),
            "/v1/volumes/v/restore",
            Some(json!({"snapshot": "s2"})),
        )
        .await;
    assert_eq!((s, &v["state"]), (200, &json!("detached")), "{v}");
    let nope = json!({"snapshot": "nope"});
    assert_eq!(
        p.call(a, restore, "/v1/volumes/v/restore", Some(nope))
            .await
            .0,
        404
    );
    // Activate: only a standby volume (`tests/` has no second cluster to follow; e2e
    // standby_volume does), so here the refusals.
    let activate = (Method::POST, "/v1/volumes/{name}/activate");
    let plain = json!({"as_is": true});
    for (token, path, body, want) in [
        (None, "/v1/volumes/v/activate", json!({}), 401),
        (a, "/v1/volumes/v/activate", plain.clone(), 400),
        (a, "/v1/volumes/v/activate", json!({"junk": 1}), 400),
        (a, "/v1/volumes/nope/activate", plain, 404),
    ] {
        let (s, e) = p.call(token, activate.clone(), path, Some(body)).await;
        assert_eq!(s, want, "{path}: {e}");
    }
    let del_snap = (Method::DELETE, "/v1/snapshots/{name}");
    assert_eq!(p.call(a, del_snap, "/v1/snapshots/s2", None).await.0, 204);
    let shrink = json!({"size_bytes": GIB});
    assert_eq!(
        p.call(a, expand.clone(), "/v1/volumes/v/expand", Some(shrink))
            .await
            .0,
        400
    );
    let huge = json!({"size_bytes": 1u64 << 45});
    let nope = p
        .call(a, expand, "/v1/volumes/nope/expand", Some(huge))
        .await;
    assert_eq!(nope.0, 404);
    // Forcing it up from one replica: refused unless the loss is accepted.
    let force = (Method::POST, "/v1/volumes/{name}/force-promote");
    let timid = json!({"replica": replica, "accept_data_loss": false});
    let (s, e) = p
        .call(a, force.clone(), "/v1/volumes/v/force-promote", Some(timid))
        .await;
    assert_eq!((s, code(&e)), (400, "invalid_argument"), "{e}");
    let keep = json!({"replica": replica, "accept_data_loss": true});
    let (s, v) = p
        .call(
            a,
            force.clone(),
            "/v1/volumes/v/force-promote",
            Some(keep.clone()),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let blank = v["replicas"].as_array().map_or(0, |rs| {
        rs.iter()
            .filter(|r| r["blank"] == json!(true) && r["state"] == json!("outdated"))
            .count()
    });
    assert_eq!(blank, 1, "the other replica is outdated as blank: {v}");
    assert_eq!(
        p.call(a, force, "/v1/volumes/nope/force-promote", Some(keep))
            .await
            .0,
        404
    );
    assert_eq!(p.call(a, del.clone(), "/v1/volumes/v", None).await.0, 204);
    // The cluster's identity, the trash, a recovery with nothing to recover.
    let (s, c) = p
        .call(a, (Method::GET, "/v1/cluster"), "/v1/cluster", None)
        .await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["id"].as_str().map(str::len), Some(32), "{c}");
    let (s, t) = p
        .call(a, (Method::GET, "/v1/trash"), "/v1/trash", None)
        .await;
    assert_eq!((s, t), (200, json!([])));
    let recover = (Method::POST, "/v1/cluster/recover");
    let (s, r) = p
        .call(a, recover, "/v1/cluster/recover", Some(json!({})))
        .await;
    assert_eq!(
        (s, &r["adopted"], &r["cluster_id"]),
        (200, &json!(false), &c["id"]),
        "{r}"
    );
    let key = (Method::POST, "/v1/cluster/volume-key");
    let (s, r) = p.call(a, key, "/v1/cluster/volume-key", None).await;
    assert_eq!(
        (s, &r["rewrapped"]),
        (200, &json!([])),
        "no encrypted volume here: {r}"
    );
    // Joining and renewing certificates: refused by a controller without TLS (the TLS
    // answers are checked end to end by hawser-e2e's tls_identity).
    let (s, e) = p
        .call(
            a,
            (Method::POST, "/v1/join-tokens"),
            "/v1/join-tokens",
            Some(json!({})),
        )
        .await;
    assert_eq!((s, code(&e)), (409, "conflict"), "{e}");
    let join = json!({"node": "n9", "token": "x", "public_key": ""});
    let (s, e) = p
        .call(None, (Method::POST, "/v1/join"), "/v1/join", Some(join))
        .await;
    assert_eq!((s, code(&e)), (409, "conflict"), "{e}");
    let renew = (Method::POST, "/v1/nodes/{node}/certificate");
    let (s, e) = p
        .call(
            g,
            renew,
            "/v1/nodes/n1/certificate",
            Some(json!({"public_key": ""})),
        )
        .await;
    assert_eq!((s, code(&e)), (409, "conflict"), "{e}");
    let client_cert = json!({"volumes": ["v"], "public_key": ""});
    let (s, e) = p
        .call(
            a,
            (Method::POST, "/v1/client-certificates"),
            "/v1/client-certificates",
            Some(client_cert),
        )
        .await;
    assert_eq!((s, code(&e)), (409, "conflict"), "{e}");
    let rotation = "/v1/cluster/ca-rotation";
    let (s, e) = p.call(a, (Method::GET, rotation), rotation, None).await;
    assert_eq!((s, code(&e)), (409, "conflict"), "{e}");
    let step = json!({"step": "trust"});
    let (s, e) = p
        .call(a, (Method::POST, rotation), rotation, Some(step))
        .await;
    assert_eq!((s, code(&e)), (409, "conflict"), "{e}");
    let (s, e) = p
        .call(
            a,
            (Method::POST, rotation),
            rotation,
            Some(json!({"step": "rotate"})),
        )
        .await;
    assert_eq!((s, code(&e)), (400, "invalid_argument"), "{e}");
    // Authentication errors.
    let (s, e) = p
        .call(None, (Method::GET, "/v1/volumes"), "/v1/volumes", None)
        .await;
    assert_eq!((s, code(&e)), (401, "unauthorized"));
    let (s, e) = p
        .call(g, (Method::GET, "/v1/volumes"), "/v1/volumes", None)
        .await;
    assert_eq!((s, code(&e)), (403, "forbidden"));
    let wrong = "x".repeat(64);
    let (s, _) = p.call(Some(&wrong), del, "/v1/volumes/v", None).await;
    assert_eq!(s, 401);
    // Admin token rotation: a bad grace, then a rotation whose old token keeps working.
    let rotate = (Method::POST, "/v1/cluster/admin-token");
    let (s, e) = p
        .call(
            a,
            rotate.clone(),
            "/v1/cluster/admin-token",
            Some(json!({"grace_secs": 999_999_999})),
        )
        .await;
    assert_eq!((s, code(&e)), (400, "invalid_argument"), "{e}");
    let (s, r) = p
        .call(a, rotate, "/v1/cluster/admin-token", Some(json!({})))
        .await;
    assert_eq!(s, 200, "{r}");
    let new = r["token"].as_str().expect("a new token").to_string();
    let (s, _) = p
        .call(
            Some(&new),
            (Method::GET, "/v1/volumes"),
            "/v1/volumes",
            None,
        )
        .await;
    assert_eq!(s, 200, "the new token works");
    let (s, _) = p
        .call(a, (Method::GET, "/v1/volumes"), "/v1/volumes", None)
        .await;
    assert_eq!(s, 200, "the old token works during the grace period");
    // The agent token does not rotate in a plaintext cluster (agents check the controller's
    // calls against it); tls_identity shows it rotating over TLS.
    let (s, e) = p
        .call(
            Some(&new),
            (Method::POST, "/v1/cluster/agent-token"),
            "/v1/cluster/agent-token",
            Some(json!({"grace_secs": 0})),
        )
        .await;
    assert_eq!((s, code(&e)), (409, "conflict"), "{e}");
    // Metrics: refused without a token, served (as text) with the metrics token, which
    // opens nothing else; the token rotates like the others.
    let scrape = (Method::GET, "/metrics");
    let (s, e) = p.call(None, scrape.clone(), "/metrics", None).await;
    assert_eq!((s, code(&e)), (401, "unauthorized"), "{e}");
    let (s, e) = p.call(g, scrape.clone(), "/metrics", None).await;
    assert_eq!((s, code(&e)), (403, "forbidden"), "{e}");
    let metrics_token = crate::common::read_token(&p.c.dir.path().join("controller/metrics.token"));
    let url = format!("{}/metrics", p.c.url);
    let text = |token: String| {
        let url = url.clone();
        async move {
            let resp = reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
            (resp.status().as_u16(), ct, resp.text().await.unwrap())
        }
    };
    let (s, ct, body) = text(metrics_token.clone()).await;
    assert_eq!(s, 200, "{body}");
    assert!(ct.starts_with("text/plain"), "{ct}");
    assert!(body.contains("hawser_controller_leader 1\n"), "{body}");
    assert!(body.contains("process_resident_memory_bytes "), "{body}");
    p.seen.insert(("GET".into(), "/metrics".into(), 200));
    let (s, e) = p
        .call(
            Some(&metrics_token),
            (Method::GET, "/v1/volumes"),
            "/v1/volumes",
            None,
        )
        .await;
    assert_eq!(
        (s, code(&e)),
        (403, "forbidden"),
        "the metrics token reads metrics only"
    );
    let (s, r) = p
        .call(
            Some(&new),
            (Method::POST, "/v1/cluster/metrics-token"),
            "/v1/cluster/metrics-token",
            Some(json!({"grace_secs": 0})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let rotated = r["token"].as_str().expect("a new token").to_string();
    assert_eq!(text(rotated).await.0, 200);
    assert_eq!(
        text(metrics_token).await.0,
        401,
        "no grace asked: the old token is gone"
    );
    // Every documented operation was exercised at least once.
    let exercised: BTreeSet<(String, String)> = p
        .seen
        .iter()
        .map(|(m, t, _)| (m.clone(), t.clone()))
        .collect();
    assert_eq!(exercised, documented(&p.doc));
}

/// Backup targets and backups: a directory target added (and refused without a token, for a
/// missing directory, and under another spec), an S3 target whose check fails (nothing
/// listens), the backups of unknown volumes and targets.
async fn probe_backups(p: &mut Probe<'_>, a: Option<&str>) {
    let dir = std::env::temp_dir().join(format!("hawser-openapi-backups-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let add = (Method::POST, "/v1/backup-targets");
    let spec = json!({"name": "t1", "spec": {"kind": "dir", "path": dir.display().to_string()}});
    let call = |body: &Value| Some(body.clone());
    assert_eq!(
        p.call(None, add.clone(), "/v1/backup-targets", call(&spec))
            .await
            .0,
        401
    );
    let (s, t) = p
        .call(a, add.clone(), "/v1/backup-targets", call(&spec))
        .await;
    assert_eq!((s, &t["credentials"]), (201, &json!(false)), "{t}");
    let other = json!({"name": "t1", "spec": {"kind": "dir", "path": "/tmp"}});
    assert_eq!(
        p.call(a, add.clone(), "/v1/backup-targets", call(&other))
            .await
            .0,
        409
    );
    let missing = json!({"name": "t2", "spec": {"kind": "dir", "path": "/no/such/dir"}});
    assert_eq!(
        p.call(a, add.clone(), "/v1/backup-targets", call(&missing))
            .await
            .0,
        400
    );
    let s3 = json!({"name": "t3", "spec": {"kind": "s3", "endpoint": "http://127.0.0.1:9",
        "bucket": "b"}, "credentials": {"access_key_id": "a", "secret_access_key": "c2s="}});
    let (s, e) = p.call(a, add, "/v1/backup-targets", call(&s3)).await;
    assert_eq!(s, 503, "nothing listens on port 9: {e}");
    let list = (Method::GET, "/v1/backup-targets");
    let (s, all) = p.call(a, list, "/v1/backup-targets", None).await;
    assert_eq!((s, all.as_array().map(Vec::len)), (200, Some(1)), "{all}");
    let one = (Method::GET, "/v1/backup-targets/{name}");
    assert_eq!(
        p.call(a, one.clone(), "/v1/backup-targets/t1", None)
            .await
            .0,
        200
    );
    assert_eq!(p.call(a, one, "/v1/backup-targets/t9", None).await.0, 404);

    let create = (Method::POST, "/v1/backups");
    let nope = json!({"volume": "nope", "target": "t1"});
    assert_eq!(
        p.call(None, create.clone(), "/v1/backups", call(&nope))
            .await
            .0,
        401
    );
    assert_eq!(
        p.call(a, create.clone(), "/v1/backups", call(&nope))
            .await
            .0,
        404
    );
    let junk = json!({"volume": "v1", "target": "t1", "junk": 1});
    assert_eq!(p.call(a, create, "/v1/backups", call(&junk)).await.0, 400);
    let backups = (Method::GET, "/v1/backups");
    assert_eq!(p.call(a, backups.clone(), "/v1/backups", None).await.0, 200);
    assert_eq!(
        p.call(a, backups, "/v1/backups?volume=v1&target=t1", None)
            .await
            .0,
        200
    );
    let show = (Method::GET, "/v1/backups/{name}");
    assert_eq!(p.call(a, show, "/v1/backups/nope", None).await.0, 404);
    let del = (Method::DELETE, "/v1/backups/{name}");
    for (token, path, want) in [
        (None, "/v1/backups/nope", 401),
        (a, "/v1/backups/nope", 404),
        (a, "/v1/backups/No_Such", 400),
    ] {
        let (s, e) = p.call(token, del.clone(), path, None).await;
        assert_eq!(s, want, "{path}: {e}");
    }

    // A schedule of volume v (made by the caller) to t1.
    let set = (Method::PUT, "/v1/volumes/{name}/backup-schedules/{target}");
    let at = "/v1/volumes/v/backup-schedules/t1";
    let good = json!({"cron": "0 * * * *", "retain": 3});
    for (token, path, body, want) in [
        (None, at, good.clone(), 401),
        (a, at, json!({"cron": "junk", "retain": 3}), 400),
        (a, at, json!({"cron": "0 * * * *", "retain": 0}), 400),
        (
            a,
            at,
            json!({"cron": "0 * * * *", "retain": 3, "junk": 1}),
            400,
        ),
        (a, "/v1/volumes/v/backup-schedules/t9", good.clone(), 404),
        (a, "/v1/volumes/nope/backup-schedules/t1", good.clone(), 404),
    ] {
        let (s, e) = p.call(token, set.clone(), path, Some(body)).await;
        assert_eq!(s, want, "{path}: {e}");
    }
    let (s, sch) = p.call(a, set, at, Some(good)).await;
    assert_eq!((s, &sch["retain"]), (200, &json!(3)), "{sch}");
    assert!(sch["next_run_ms"].as_u64().is_some(), "{sch}");
    let vol = (Method::GET, "/v1/volumes/{name}");
    let (_, v) = p.call(a, vol, "/v1/volumes/v", None).await;
    assert_eq!(v["backup_schedules"][0]["target"], json!("t1"), "{v}");
    let unset = (
        Method::DELETE,
        "/v1/volumes/{name}/backup-schedules/{target}",
    );
    for (token, want) in [(None, 401), (a, 204), (a, 404)] {
        let (s, e) = p.call(token, unset.clone(), at, None).await;
        assert_eq!(s, want, "{e}");
    }

    // A prune of t1: nothing on it yet.
    let prune = (Method::POST, "/v1/backup-targets/{name}/prune");
    for (token, path, want) in [
        (None, "/v1/backup-targets/t1/prune", 401),
        (a, "/v1/backup-targets/t9/prune", 404),
    ] {
        let (s, e) = p.call(token, prune.clone(), path, None).await;
        assert_eq!(s, want, "{path}: {e}");
    }
    let (s, r) = p.call(a, prune, "/v1/backup-targets/t1/prune", None).await;
    assert_eq!((s, &r["deleted_blocks"]), (200, &json!(0)), "{r}");

    let remove = (Method::DELETE, "/v1/backup-targets/{name}");
    assert_eq!(
        p.call(a, remove.clone(), "/v1/backup-targets/t1", None)
            .await
            .0,
        204
    );
    assert_eq!(
        p.call(a, remove, "/v1/backup-targets/t1", None).await.0,
        404
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The checker finds what it must: a wrong type, a missing or unknown property, a value
/// outside an enum (so the test above can fail).
#[test]
fn the_checker_catches_violations() {
    let doc = document();
    let node = json!({"$ref": "#/components/schemas/Node"});
    let good = json!({"name": "n1", "admin_addr": "a", "replica_addr": "b", "nbd_addr": null,
        "nbd_socket": "/s", "last_seen_ms": 5, "state": "online", "labels": {"zone": "z"}});
    assert_eq!(schema::validate(&doc, &node, &good), Vec::<String>::new());
    let mut cases = Vec::new();
    for (k, v) in [
        ("last_seen_ms", json!("5")),
        ("state", json!("asleep")),
        ("extra", json!(1)),
        ("labels", json!({"zone": 3})),
        ("nbd_addr", json!(7)),
    ] {
        let mut bad = good.clone();
        bad[k] = v;
        cases.push(bad);
    }
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("admin_addr");
    cases.push(missing);
    for bad in cases {
        assert!(!schema::validate(&doc, &node, &bad).is_empty(), "{bad}");
    }
}
