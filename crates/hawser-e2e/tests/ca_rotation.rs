//! Issue 39, acceptance c: the cluster's CA is replaced under running I/O. fio with
//! verification writes to a replicated volume through all three steps of `hawser cluster
//! rotate-ca` and after them, with 0 errors, while the volume stays attached; each step is
//! seen where it lands (the nodes' trusted CAs and certificates, the controller's files).
//! Then the retired CA opens nothing, a restarted node makes new replica connections on the
//! new CA alone, the grant key did not change, and a node that was offline throughout
//! rejoins with a join token made after the rotation. Steps out of order are refused.

use std::path::Path;
use std::time::Duration;

use hawser_api::controller::CaRotation;
use hawser_e2e::{wait_until, Cluster};

fn fingerprints(pem_file: &Path) -> Vec<String> {
    let pem = std::fs::read_to_string(pem_file).unwrap_or_default();
    hawser_tls::certs_from_pem(&pem)
        .map(|certs| {
            certs
                .iter()
                .map(|c| hex(&hawser_tls::ca_fingerprint(c)))
                .collect()
        })
        .unwrap_or_default()
}

fn issuer(chain_file: &Path) -> String {
    let pem = std::fs::read_to_string(chain_file).unwrap_or_default();
    hawser_tls::issuer_fingerprint(&pem)
        .map(|f| hex(&f))
        .unwrap_or_default()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn status(c: &Cluster) -> CaRotation {
    let out = c.cli_ok(&["cluster", "rotate-ca", "--status", "-o", "json"]);
    serde_json::from_str(&out).expect("rotation JSON")
}

#[test]
fn ca_rotates_in_three_steps_under_fio_verify_and_an_offline_node_rejoins() {
    let mut c = Cluster::start("ca-rotation", 3);
    let uri = c.attached_volume("rot", "128M", 2, "n1");
    let holders: Vec<String> = c
        .volume("rot")
        .replicas
        .into_iter()
        .map(|r| r.node)
        .collect();
    let away = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| !holders.iter().any(|h| h == n))
        .expect("a node without a replica")
        .to_string();
    let online: Vec<String> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| n.to_string())
        .filter(|n| *n != away)
        .collect();
    let root = c.dir.path().to_path_buf();
    let tls_file = |node: &str, f: &str| root.join(node).join("tls").join(f);
    let old = fingerprints(&c.tokens.ca_file);
    assert_eq!(old.len(), 1);
    let grant_key = |node: &str| {
        std::fs::read_to_string(root.join(node).join("cluster-key")).expect("grant key")
    };
    let grant_before = grant_key("n1");

    // Refusals first: nothing to issue from or retire yet.
    c.cli_fails(
        &["cluster", "rotate-ca", "--step", "issue"],
        "no CA rotation is under way",
    );
    c.cli_fails(
        &["cluster", "rotate-ca", "--step", "retire"],
        "no CA rotation is under way",
    );
    assert_eq!(status(&c).step, None);

    // A node that is away for the whole rotation.
    c.kill_agent(&away);
    let fio = hawser_e2e::fio::verify("ca-rotation", &uri, "0", "64M", 600);

    // Step 1: both CAs trusted, everywhere; nothing reissued.
    c.cli_ok(&["cluster", "rotate-ca", "--step", "trust"]);
    let s = status(&c);
    let new = s.new_sha256.clone().expect("a new CA");
    assert_eq!(s.old_sha256.as_deref(), Some(old[0].as_str()));
    assert_eq!(
        fingerprints(&c.tokens.ca_file),
        vec![old[0].clone(), new.clone()],
        "the CLI's CA file"
    );
    c.cli_fails(
        &["cluster", "rotate-ca", "--step", "trust"],
        "a CA rotation is under way",
    );
    c.cli_fails(
        &["cluster", "rotate-ca", "--step", "retire"],
        "`retire` comes after `issue`",
    );
    for n in &online {
        wait_until(
            &format!("{n} trusts both CAs"),
            Duration::from_secs(20),
            || fingerprints(&tls_file(n, "ca.pem")).contains(&new),
        );
        assert_eq!(
            issuer(&tls_file(n, "node.pem")),
            old[0],
            "{n} is not reissued yet"
        );
    }

    // Step 2: every certificate from the new CA (the CLI waits for the nodes).
    c.cli_ok(&["cluster", "rotate-ca", "--step", "issue"]);
    for n in &online {
        wait_until(
            &format!("{n} renewed on the new CA"),
            Duration::from_secs(20),
            || issuer(&tls_file(n, "node.pem")) == new,
        );
    }

    // Step 3: the old CA retired.
    c.cli_ok(&["cluster", "rotate-ca", "--step", "retire"]);
    let s = status(&c);
    assert_eq!(s.offline, vec![away.clone()], "{s:?}");
    assert_eq!(fingerprints(&c.tokens.ca_file), vec![new.clone()]);
    let ctl = c.dir.path().join("controller");
    assert_eq!(fingerprints(&ctl.join("ca.pem")), vec![new.clone()]);
    assert!(
        ctl.join("grant-root.key").exists(),
        "the grant root is kept"
    );
    let key = std::fs::read_to_string(ctl.join("ca.key")).expect("ca.key");
    hawser_tls::Ca::from_pem(
        &std::fs::read_to_string(ctl.join("ca.pem")).expect("pem"),
        &key,
    )
    .expect("ca.key is the new CA's");
    for n in &online {
        wait_until(
            &format!("{n} trusts the new CA only"),
            Duration::from_secs(20),
            || fingerprints(&tls_file(n, "ca.pem")) == vec![new.clone()],
        );
    }

    // The retired CA opens nothing: a controller certificate of it, at a node's admin API.
    let refused = c
        .agent_request(reqwest::Method::GET, &online[0], "/v1/status")
        .send();
    assert!(
        refused.is_err(),
        "the old CA's certificate was served: {refused:?}"
    );

    // New replica connections on the new CA alone: a replica's node restarts (with its old
    // join token file beside it, which it must not be confused by) and resyncs.
    let other = holders
        .iter()
        .find(|h| *h != "n1")
        .expect("a second replica")
        .clone();
    c.restart_agent(&other);
    wait_until(
        "both replicas in sync again",
        Duration::from_secs(60),
        || {
            c.volume("rot")
                .replicas
                .iter()
                .all(|r| r.state == hawser_api::controller::ReplicaState::InSync)
        },
    );
    assert_eq!(
        grant_key("n1"),
        grant_before,
        "the grant key did not change"
    );
    assert_eq!(grant_key(&other), grant_before);

    // fio ran through all of it without an error, and the volume never left n1.
    hawser_e2e::fio::interrupted_passed(fio);
    assert_eq!(c.volume("rot").attached_node.as_deref(), Some("n1"));

    // The node that was away rejoins with a join token made now (pinning the new CA).
    let token = c.cli_ok(&["cluster", "join-token", "--node", &away]);
    std::fs::write(&c.tokens.join, token.trim()).expect("write the join token");
    c.restart_agent(&away);
    assert_eq!(fingerprints(&tls_file(&away, "ca.pem")), vec![new.clone()]);
    assert_eq!(issuer(&tls_file(&away, "node.pem")), new);
    c.wait_nodes_online(3);
    assert!(
        c.log(&away).contains("joining again"),
        "{away} joined again rather than keep a certificate of the retired CA"
    );
}
