//! Per-volume QoS (issue 21, acceptance c): a volume capped at 1,000 write IOPS stays within
//! 10 % of the cap under fio at queue depth 32 for 20 s, as fio measures it; raising the cap
//! with `hawser volume set` takes effect without a detach; the record is the truth for a node
//! that missed a change or restarted; the node's metrics count the requests held back.

use std::time::Duration;

use hawser_api::controller::Volume;
use hawser_e2e::{have, run_ok, wait_until, Cluster};
use serde_json::Value;

/// fio's write IOPS over `secs` seconds of 4k random writes at queue depth 32.
fn write_iops(uri: &str, secs: u32) -> f64 {
    let out = run_ok(
        "fio",
        &[
            "--name=qos",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--size=128M",
            "--iodepth=32",
            "--time_based",
            &format!("--runtime={secs}"),
            "--output-format=json",
        ],
    );
    // fio may print notes before its JSON.
    let json = &out[out.find('{').expect("fio printed JSON")..];
    let report: Value = serde_json::from_str(json).expect("fio's JSON report");
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "fio failed:\n{out}");
    job["write"]["iops"]
        .as_f64()
        .expect("write iops in fio's report")
}

/// The limits the engine's node applies now, as the volume's engine view says.
fn live_write_iops(v: &Volume) -> Option<u64> {
    v.engine.as_ref().map(|e| e.qos.write_iops)
}

#[test]
fn a_write_iops_cap_holds_under_qd32_and_changes_live() {
    if !have("fio") {
        eprintln!("SKIP: fio missing (make test installs it)");
        return;
    }
    let mut c = Cluster::start("qos", 2);
    c.cli_ok(&[
        "volume",
        "create",
        "q",
        "--size",
        "256MiB",
        "--replicas",
        "2",
        "--write-iops-limit",
        "1000",
    ]);
    c.cli_ok(&["volume", "attach", "q", "--node", "n1"]);
    let v = c.volume("q");
    assert_eq!(v.qos.write_iops, 1000);
    assert_eq!(live_write_iops(&v), Some(1000), "{v:?}");
    let uri = v.nbd_unix_uri.expect("attached volume has a unix URI");

    // The cap: 1,000 IOPS, within 10 % over 20 s (the burst adds 100 requests, 0.5 %).
    let capped = write_iops(&uri, 20);
    eprintln!("capped at 1000: fio measured {capped:.0} write IOPS");
    assert!(
        (900.0..=1100.0).contains(&capped),
        "{capped:.0} write IOPS under a 1000 cap"
    );

    // The node's metrics say how often and how long the limit held requests back.
    let metrics = c
        .agent_request(reqwest::Method::GET, "n1", "/metrics")
        .send()
        .and_then(|r| r.text())
        .expect("scrape n1");
    let sample = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in n1's metrics:\n{metrics}"))
    };
    assert_eq!(
        sample(r#"hawser_volume_qos_limit{volume="q",limit="writeIopsLimit"}"#),
        1000.0
    );
    let throttled = sample(r#"hawser_volume_requests_throttled_total{volume="q"}"#);
    assert!(throttled > 10_000.0, "{throttled} requests throttled");
    let waited = sample(r#"hawser_volume_throttle_wait_seconds_total{volume="q"}"#);
    assert!(waited > 20.0, "{waited} s waited in all");

    // Raised live: the same export, no detach; well above the old cap, never above the new.
    let out = c.cli_ok(&["volume", "set", "q", "--write-iops-limit", "3000"]);
    assert!(out.contains("write 3000 IOPS (applied on n1)"), "{out}");
    let raised = write_iops(&uri, 10);
    eprintln!("raised to 3000: fio measured {raised:.0} write IOPS");
    assert!(
        raised > 1500.0 && raised <= 3300.0,
        "{raised:.0} write IOPS after raising the cap to 3000"
    );
    assert_eq!(c.volume("q").state, v.state, "the volume was not detached");

    // A node that misses a change (its agent hung) gets it from the engine watch once it
    // answers again.
    c.pause_agent("n1");
    c.cli_ok(&["volume", "set", "q", "--write-iops-limit", "2000"]);
    c.resume_agent("n1");
    wait_until(
        "the engine's node applies the limits it missed",
        Duration::from_secs(30),
        || live_write_iops(&c.volume("q")) == Some(2000),
    );

    // An agent that restarts gets the record's limits with its engine.
    c.kill_agent("n1");
    c.restart_agent("n1");
    wait_until(
        "the restarted engine applies the volume's limits",
        Duration::from_secs(60),
        || live_write_iops(&c.volume("q")) == Some(2000),
    );

    // Removing the limit, and bad input with a clear error and nothing changed.
    c.cli_fails(
        &["volume", "set", "q", "--write-bandwidth-limit", "100"],
        "below 4096 bytes/s",
    );
    c.cli_fails(&["volume", "set", "q"], "nothing to set");
    c.cli_fails(&["volume", "set", "nosuch", "--iops-limit", "5"], "nosuch");
    c.cli_ok(&["volume", "set", "q", "--write-iops-limit", "0"]);
    let v = c.volume("q");
    assert!(
        v.qos.is_unlimited() && live_write_iops(&v) == Some(0),
        "{v:?}"
    );
    c.cli_ok(&["volume", "detach", "q"]);
}
