//! Prometheus metrics against a scripted workload on real processes: the scraped values say
//! what happened (requests and bytes written, a replica lost and outdated, its resync's
//! bytes equal to the dirty bytes the engine counted while it was away), both text formats
//! pass `promtool check metrics`, and a scrape without the metrics token is refused.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use hawser_e2e::cluster::Cluster;
use hawser_e2e::run::{have, qemu_io, wait_until};
use hawser_tls::Peer;

/// 64 KiB writes at distinct 1 MiB-aligned offsets: `n` requests starting at MiB `first`.
fn writes(first: u64, n: u64, pattern: u8) -> Vec<String> {
    (first..first + n)
        .map(|i| format!("write -P {pattern:#x} {}M 64k", i))
        .collect()
}

/// Samples of a classic-format scrape: series (name and labels, as written) to value.
fn samples(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn value(s: &BTreeMap<String, f64>, series: &str) -> f64 {
    *s.get(series)
        .unwrap_or_else(|| panic!("no series {series} in the scrape: {s:#?}"))
}

struct Scraper {
    token: String,
    ca_pem: String,
}

impl Scraper {
    /// A scraper of cluster `c`, with the metrics token its controller wrote at cluster init.
    fn of(c: &Cluster) -> Scraper {
        Scraper {
            token: std::fs::read_to_string(c.dir.path().join("controller/metrics.token"))
                .expect("the controller wrote the metrics token at cluster init")
                .trim()
                .to_string(),
            ca_pem: c.tokens.ca_pem().to_string(),
        }
    }

    /// GET https://`addr`/metrics as Prometheus would: ordinary hostname verification of
    /// the role's DNS name (`tls_config.server_name`) against the cluster CA, no client
    /// certificate, the bearer `token` if any, and the Accept header `accept`.
    fn get(&self, addr: &str, expect: Peer, token: Option<&str>, accept: &str) -> (u16, String) {
        let name = expect.role_dns_name();
        let socket: std::net::SocketAddr = addr.parse().expect("a socket address");
        let http = reqwest::blocking::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("the CA"),
            )
            .resolve(name, socket)
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTPS client");
        let addr = format!("{name}:{}", socket.port());
        let mut req = http
            .get(format!("https://{addr}/metrics"))
            .header("accept", accept);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().expect("scrape");
        (resp.status().as_u16(), resp.text().expect("scrape body"))
    }

    fn scrape(&self, addr: &str, expect: Peer) -> String {
        let (status, body) = self.get(addr, expect, Some(&self.token), "text/plain");
        assert_eq!(status, 200, "{body}");
        body
    }
}

/// `promtool check metrics` on `body`: no lint findings.
fn promtool_clean(what: &str, body: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics on {what}: {}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn scraped_metrics_match_a_workload_with_a_lost_replica_and_its_resync() {
    if !have("qemu-io") || !have("promtool") {
        panic!("this test needs qemu-io and promtool (make deps installs them)");
    }
    let mut c = Cluster::start("metrics", 2);
    let uri = c.attached_volume("m", "64MiB", 2, "n1");
    let scraper = Scraper::of(&c);
    let n1 = c.agent("n1").admin.clone();
    let ctl = c.url.trim_start_matches("https://").to_string();
    let r2 = c.replica_on("m", "n2").id;

    // Refused without the token, or with another one; the agent learns the token's digest
    // with its heartbeat, so wait for that first.
    wait_until(
        "n1 takes the metrics token",
        Duration::from_secs(20),
        || {
            scraper
                .get(
                    &n1,
                    Peer::Node("n1".into()),
                    Some(&scraper.token),
                    "text/plain",
                )
                .0
                == 200
        },
    );
    for (addr, peer) in [(&n1, Peer::Node("n1".into())), (&ctl, Peer::Controller)] {
        assert_eq!(scraper.get(addr, peer.clone(), None, "text/plain").0, 401);
        let wrong = "0".repeat(64);
        assert_eq!(scraper.get(addr, peer, Some(&wrong), "text/plain").0, 401);
    }

    // 20 writes with both replicas, then n2 is killed and 10 more go to n1 alone.
    let first = writes(0, 20, 0x11);
    qemu_io(&uri, &first.iter().map(String::as_str).collect::<Vec<_>>());
    c.kill_agent("n2");
    let more = writes(20, 10, 0x22);
    qemu_io(&uri, &more.iter().map(String::as_str).collect::<Vec<_>>());
    wait_until(
        "the store says n2's replica is outdated",
        Duration::from_secs(30),
        || c.replica_on("m", "n2").state == hawser_api::controller::ReplicaState::Outdated,
    );
    let during = samples(&scraper.scrape(&n1, Peer::Node("n1".into())));
    let rl = |name: &str| format!(r#"{name}{{volume="m",replica="{r2}"}}"#);
    let dirty = value(&during, &rl("hawser_volume_resync_remaining_bytes"));
    assert!(
        dirty >= 10.0 * 65536.0,
        "the 10 writes n2 missed are dirty: {dirty} bytes"
    );
    assert_eq!(
        value(&during, r#"hawser_volume_replicas_in_sync{volume="m"}"#),
        1.0
    );
    assert_eq!(value(&during, &rl("hawser_volume_replica_connected")), 0.0);

    // n2 comes back; the engine resyncs it and the store has it in sync again.
    c.restart_agent("n2");
    wait_until(
        "n2's replica in sync again",
        Duration::from_secs(60),
        || c.replica_on("m", "n2").state == hawser_api::controller::ReplicaState::InSync,
    );
    let agent = scraper.scrape(&n1, Peer::Node("n1".into()));
    let s = samples(&agent);
    let op = |name: &str, op: &str| format!(r#"{name}{{volume="m",op="{op}"}}"#);
    assert_eq!(
        value(&s, &op("hawser_volume_requests_total", "write")),
        30.0
    );
    assert_eq!(
        value(&s, &op("hawser_volume_request_bytes_total", "write")),
        30.0 * 65536.0
    );
    assert_eq!(
        value(&s, &op("hawser_volume_request_errors_total", "write")),
        0.0
    );
    assert_eq!(
        value(
            &s,
            &op("hawser_volume_request_duration_seconds_count", "write")
        ),
        30.0
    );
    assert_eq!(
        value(&s, r#"hawser_volume_requests_in_flight{volume="m"}"#),
        0.0
    );
    assert_eq!(
        value(&s, &rl("hawser_volume_resync_copied_bytes_total")),
        dirty,
        "the resync copied exactly the dirty bytes"
    );
    assert_eq!(value(&s, &rl("hawser_volume_resync_remaining_bytes")), 0.0);
    assert_eq!(
        value(&s, r#"hawser_volume_replicas_in_sync{volume="m"}"#),
        2.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"hawser_volume_replica_state{{volume="m",replica="{r2}",state="in_sync"}}"#)
        ),
        1.0
    );
    // Writes to new extents, the outdate and the resync each needed a journal commit.
    assert!(value(&s, r#"hawser_volume_journal_commits_total{volume="m"}"#) >= 2.0);
    assert!(value(&s, r#"hawser_pool_capacity_bytes{pool="default"}"#) > 0.0);
    assert!(value(&s, "process_resident_memory_bytes") > 1e6);

    let controller = scraper.scrape(&ctl, Peer::Controller);
    let k = samples(&controller);
    assert_eq!(value(&k, "hawser_replica_outdates_total"), 1.0);
    assert_eq!(value(&k, "hawser_replica_resyncs_completed_total"), 1.0);
    assert_eq!(value(&k, "hawser_replica_failures_total"), 0.0);
    assert_eq!(value(&k, "hawser_controller_leader"), 1.0);
    assert!(
        value(
            &k,
            r#"hawser_store_request_duration_seconds_count{op="get"}"#
        ) > 0.0
    );
    assert_eq!(value(&k, r#"hawser_node_online{node="n2"}"#), 1.0);
    assert_eq!(
        value(&k, r#"hawser_volume_replicas{volume="m",state="in_sync"}"#),
        2.0
    );

    // Every series the chart's Grafana dashboard queries is one these scrapes have.
    let dashboard = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/hawser/dashboards/hawser.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dashboard).expect("the dashboard"))
            .expect("the dashboard is JSON");
    let scraped: std::collections::BTreeSet<&str> = s
        .keys()
        .chain(k.keys())
        .map(|series| series.split('{').next().unwrap_or(series))
        .collect();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("hawser_") || word.starts_with("process_") {
                    queried += 1;
                    assert!(
                        scraped.contains(word),
                        "the dashboard queries {word}, which no scrape has ({expr})"
                    );
                }
            }
        }
    }
    assert!(queried >= 15, "the dashboard queries {queried} series");

    promtool_clean("the agent's scrape", &agent);
    promtool_clean("the controller's scrape", &controller);
    // OpenMetrics when asked, as Prometheus asks.
    let (status, om) = scraper.get(
        &n1,
        Peer::Node("n1".into()),
        Some(&scraper.token),
        "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
    );
    assert_eq!(status, 200);
    assert!(om.ends_with("# EOF\n"), "{om}");
}

/// A connection the replica port refuses at a limit is counted by the limit's name and
/// logged with it (issue 44: refusals were debug lines, and a node pair out of connections
/// failed attaches with nothing said on either side). The limit here is the one anyone can
/// reach: connections from one address that have not said Hello.
#[test]
fn a_refused_replica_connection_is_counted_and_logged_by_its_limit() {
    use hawser_agent::constants::REPLICA_UNGREETED_MAX_PER_PEER as LIMIT;
    use std::io::Read;
    use std::net::TcpStream;

    let c = Cluster::start("refusals", 1);
    let scraper = Scraper::of(&c);
    let n1 = c.agent("n1");
    let (admin, replica_addr) = (n1.admin.clone(), n1.replica.clone());
    let series =
        r#"hawser_replica_connections_refused_total{limit="REPLICA_UNGREETED_MAX_PER_PEER"}"#;
    let refused = || {
        let (status, body) = scraper.get(
            &admin,
            Peer::Node("n1".into()),
            Some(&scraper.token),
            "text/plain",
        );
        (status == 200).then(|| samples(&body).get(series).copied().unwrap_or(0.0))
    };
    wait_until(
        "n1 takes the metrics token",
        Duration::from_secs(20),
        || refused().is_some(),
    );
    assert_eq!(refused(), Some(0.0), "refused before anything was");
    // LIMIT silent connections hold every place an address has; the next is closed unread.
    let held: Vec<TcpStream> = (0..LIMIT)
        .map(|_| TcpStream::connect(&replica_addr).expect("connect"))
        .collect();
    wait_until(
        "the held connections are admitted",
        Duration::from_secs(10),
        || {
            let mut extra = TcpStream::connect(&replica_addr).expect("connect");
            extra
                .set_read_timeout(Some(Duration::from_secs(3)))
                .expect("timeout");
            // Closed at once (EOF or reset), not held for the Hello timeout.
            let closed = match extra.read(&mut [0u8; 1]) {
                Ok(0) => true,
                Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
                Ok(_) => false,
            };
            closed && refused().is_some_and(|n| n >= 1.0)
        },
    );
    let log = c.log("n1");
    assert!(
        log.contains(&format!(
            "replica connection refused: REPLICA_UNGREETED_MAX_PER_PEER ({LIMIT}) reached"
        )),
        "n1's log names the limit"
    );
    drop(held);
}
