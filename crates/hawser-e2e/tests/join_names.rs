//! Issue 39, item 5: a join token can be bound to one node name, and a name held by a node
//! that is online cannot be taken by joining again, except with a token made for that name
//! (an operator replacing a machine). Refusals say why and spend no use of the token.

use std::time::Duration;

use hawser_e2e::Cluster;
use hawser_tls::Peer;
use serde_json::{json, Value};

/// POST /v1/join as `node` with `token`: the status and the answer's JSON.
fn join(c: &Cluster, node: &str, token: &str) -> (u16, Value) {
    use base64::Engine as _;
    let (_, spki) = hawser_tls::new_key().expect("a key");
    let key = base64::engine::general_purpose::STANDARD.encode(spki);
    let config = hawser_tls::client_config(c.tokens.ca_pem(), Peer::Controller, None)
        .expect("client config");
    let http = reqwest::blocking::Client::builder()
        .use_preconfigured_tls((*config).clone())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let r = http
        .post(format!("{}/v1/join", c.url))
        .json(&json!({"node": node, "token": token, "public_key": key}))
        .send()
        .expect("the controller answers");
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

fn message(v: &Value) -> &str {
    v["message"].as_str().unwrap_or_default()
}

#[test]
fn a_join_token_bound_to_a_name_joins_only_it_and_an_online_name_is_not_taken() {
    let c = Cluster::start("joins", 1);
    c.wait_nodes_online(1);

    // Bound to n5: not n6 (and the refusal spends nothing), then n5.
    let for_n5 = c.cli_ok(&["cluster", "join-token", "--node", "n5"]);
    let (s, e) = join(&c, "n6", for_n5.trim());
    assert_eq!(s, 403, "{e}");
    assert!(message(&e).contains("for node n5, not n6"), "{e}");
    let (s, cert) = join(&c, "n5", for_n5.trim());
    assert_eq!(s, 200, "{cert}");
    assert!(cert["chain_pem"]
        .as_str()
        .is_some_and(|p| p.contains("CERTIFICATE")));

    // n1 is online: a token for any name, or the agent token, does not take its name.
    let any = c.cli_ok(&["cluster", "join-token"]);
    let (s, e) = join(&c, "n1", any.trim());
    assert_eq!(s, 409, "{e}");
    assert!(
        message(&e).contains("node n1 is registered and online"),
        "{e}"
    );
    assert!(message(&e).contains("join-token --node n1"), "{e}");
    let agent = std::fs::read_to_string(&c.tokens.agent).expect("agent token");
    let (s, e) = join(&c, "n1", agent.trim());
    assert_eq!(s, 409, "{e}");
    // The refused token still has its one use.
    let (s, e) = join(&c, "n7", any.trim());
    assert_eq!(s, 200, "{e}");
    let (s, _) = join(&c, "n8", any.trim());
    assert_eq!(s, 401, "a one-use token joined twice");

    // A token made for n1 may replace it (a reinstalled machine), by the operator's choice.
    let for_n1 = c.cli_ok(&["cluster", "join-token", "--node", "n1"]);
    let (s, e) = join(&c, "n1", for_n1.trim());
    assert_eq!(s, 200, "{e}");
    // Bad input: a token for an invalid name is refused at creation.
    c.cli_fails(
        &["cluster", "join-token", "--node", "N/1"],
        "invalid node name",
    );
}
