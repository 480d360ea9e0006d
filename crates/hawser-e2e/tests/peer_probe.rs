//! Issue 44, item 4: the peer probe the controller asks of a node whose engine lost quorum
//! before it lifts the node's `hawser.dev/quorum-lost` taint (`POST /v1/peers/probe` on the
//! agent's admin API). Three real agents on loopback with TLS, as `make demo` runs them:
//! a probe reaches a live peer, not a killed one (connection refused) or a stopped one (it
//! accepts TCP but never finishes a handshake), and not a live port that belongs to another
//! node (the handshake checks who answers). Each answer that did not reach its peer says
//! whether the peer's host answered: here, on loopback, it always does (a refusal, or a
//! connection without a handshake); a silent host is `k8s_failover`'s power loss. Bad input
//! and clients that bring no credential are refused.

use hawser_api::agent::PeerReach;
use hawser_e2e::probe::{self, Tls};
use hawser_e2e::Cluster;
use hawser_tls::Peer;
use reqwest::Method;
use serde_json::{json, Value};

fn probe_from(c: &Cluster, from: &str, peers: &[(&str, &str)]) -> Vec<PeerReach> {
    let peers: Vec<Value> = peers
        .iter()
        .map(|(node, addr)| json!({"node": node, "replica_addr": addr}))
        .collect();
    let r = c
        .agent_request(Method::POST, from, "/v1/peers/probe")
        .json(&json!({ "peers": peers }))
        .send()
        .expect("the probe call");
    assert_eq!(r.status(), 200);
    r.json().expect("the probe's answer")
}

fn reached(answers: &[PeerReach], node: &str, addr: &str) -> Result<(), String> {
    let a = answers
        .iter()
        .find(|a| a.node == node)
        .unwrap_or_else(|| panic!("no answer for {node} at {addr}: {answers:?}"));
    match (a.reached, &a.error) {
        (true, None) => Ok(()),
        (false, Some(e)) => Err(e.clone()),
        _ => panic!("an answer that is reached with an error, or neither: {a:?}"),
    }
}

/// What the answer for `node` says of its host (`PeerReach::host_answered`).
fn host_answered(answers: &[PeerReach], node: &str) -> Option<bool> {
    answers
        .iter()
        .find(|a| a.node == node)
        .unwrap_or_else(|| panic!("no answer for {node}: {answers:?}"))
        .host_answered
}

#[test]
fn a_peer_probe_reaches_live_peers_only_and_checks_who_answers() {
    let mut c = Cluster::start("peer-probe", 3);
    c.wait_nodes_online(3);
    let r2 = c.agent("n2").replica.clone();
    let r3 = c.agent("n3").replica.clone();

    let a = probe_from(&c, "n1", &[("n2", &r2), ("n3", &r3)]);
    assert_eq!(reached(&a, "n2", &r2), Ok(()));
    assert_eq!(reached(&a, "n3", &r3), Ok(()));

    // n2's live replica port, probed as n3's: the handshake finds n2's certificate.
    let a = probe_from(&c, "n1", &[("n3", &r2)]);
    let e = reached(&a, "n3", &r2).expect_err("another node's port counts as not reached");
    assert!(e.contains("TLS handshake with node n3"), "{e}");
    assert_eq!(host_answered(&a, "n3"), Some(true), "a live host answered");

    // A hung node: its kernel still accepts the connection, nothing answers the handshake.
    c.pause_agent("n2");
    let a = probe_from(&c, "n1", &[("n2", &r2), ("n3", &r3)]);
    c.resume_agent("n2");
    let e = reached(&a, "n2", &r2).expect_err("a stopped agent is not reached");
    assert!(e.contains("no answer within 1000 ms"), "{e}");
    assert_eq!(host_answered(&a, "n2"), Some(true), "its kernel accepted");
    assert_eq!(reached(&a, "n3", &r3), Ok(()));
    assert_eq!(host_answered(&a, "n3"), None, "reached");

    // A dead one: nothing listens.
    c.kill_agent("n2");
    let a = probe_from(&c, "n1", &[("n2", &r2), ("n3", &r3)]);
    let e = reached(&a, "n2", &r2).expect_err("a killed agent is not reached");
    assert!(e.contains(&format!("connect to {r2}")), "{e}");
    // Refused by a live kernel: an agent down (or restarting), not a dead host, so the
    // controller does not fail the node over before its timeout for it.
    assert_eq!(host_answered(&a, "n2"), Some(true), "its kernel refused");
    assert_eq!(reached(&a, "n3", &r3), Ok(()));

    // Bad input: too many peers, garbage bodies.
    let many: Vec<Value> = (0..257)
        .map(|i| json!({"node": format!("x{i}"), "replica_addr": "127.0.0.1:1"}))
        .collect();
    let r = c
        .agent_request(Method::POST, "n1", "/v1/peers/probe")
        .json(&json!({ "peers": many }))
        .send()
        .expect("the call with too many peers");
    assert_eq!(r.status(), 400);
    let text = r.text().expect("the refusal's text");
    assert!(text.contains("at most 256"), "{text}");
    for body in [json!({}), json!({"peers": [{"node": "n3"}]}), json!([1, 2])] {
        let r = c
            .agent_request(Method::POST, "n1", "/v1/peers/probe")
            .json(&body)
            .send()
            .expect("the call with a bad body");
        assert!(r.status().is_client_error(), "{body}: {}", r.status());
    }

    // Clients that bring nothing: no TLS; TLS without a certificate; a token instead of one.
    let admin = c.agent("n1").admin.clone();
    let body = json!({"peers": [{"node": "n3", "replica_addr": r3}]});
    let anon = Tls::With {
        ca_pem: c.tokens.ca_pem().to_string(),
        expect: Peer::Node("n1".into()),
        creds: None,
    };
    let agent_token = c.tokens.agent_bearer();
    let token = agent_token.trim_start_matches("Bearer ");
    for (who, tls, bearer) in [
        ("no TLS", Tls::Plain, None),
        ("TLS without a certificate", anon.clone(), None),
        (
            "TLS without a certificate, with the agent token",
            anon,
            Some(token),
        ),
    ] {
        let status = probe::http_status(
            &tls,
            Method::POST,
            &admin,
            "/v1/peers/probe",
            bearer,
            &[],
            Some(body.clone()),
        );
        assert!(
            matches!(status, None | Some(401 | 403)),
            "{who}: the probe answered {status:?}"
        );
    }
}
