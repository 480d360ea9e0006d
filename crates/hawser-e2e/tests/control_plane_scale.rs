//! The control plane with many volumes (issue 44, item 2): a three-node cluster on the store
//! `HAWSER_E2E_STORE` selects (embedded, etcd or kubernetes), then `HAWSER_SCALE_VOLUMES`
//! (1,000 unless told; `make bench` runs 10,000) two-replica volumes created, a few attached
//! and detached, the list read whole, by pages and by the CLI, and every volume deleted.
//!
//! Prints one `scale:` line: latency per operation (p50/p99), list times, the controller's
//! RSS and idle CPU, and the store's size. `make test` runs the 1,000-volume run as a
//! regression guard: the bounds below are several times what this machine measures, so
//! they catch a list or a loop that went quadratic, not noise (`make bench` only measures:
//! `HAWSER_SCALE_MEASURE_ONLY=1`). With `HAWSER_BENCH_FIGURES`, the line's figures are
//! appended there too, for `make bench`'s charts (`hawser_bench::cluster_figures`).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use hawser_bench::cluster_figures::{self, ApiFigure, Figure, Quantiles};
use hawser_e2e::run::{cpu_ticks, rss_kib};
use hawser_e2e::Cluster;
use serde_json::{json, Value};

/// Volumes attached (and detached again), spread over the three nodes: attaching them all
/// waits for replica sessions multiplexed per node pair (issue 44, item 1).
const ATTACHED: usize = 30;
/// The controller's CPU is measured over this long with nothing asked of it, unless
/// `HAWSER_SCALE_IDLE_SECS` says otherwise (longer, to profile it: the test prints the
/// controller's pid as the window opens).
fn idle_window() -> Duration {
    let secs = std::env::var("HAWSER_SCALE_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(10);
    Duration::from_secs(secs)
}

/// The guard's bounds for 1,000 volumes (scaled with the count where the cost should be).
const MAX_OP_P99: Duration = Duration::from_secs(3);
const MAX_LIST_PER_1000: Duration = Duration::from_secs(2);
const MAX_RSS_MIB: u64 = 512;
const MAX_IDLE_CPU_PCT: f64 = 10.0;

fn count() -> usize {
    std::env::var("HAWSER_SCALE_VOLUMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1000)
}

/// p50 and p99 of `v` (sorted here).
fn quantiles(v: &mut [Duration]) -> (Duration, Duration) {
    v.sort();
    let at = |q: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((v.len() as f64 - 1.0) * q).round() as usize;
        v[i]
    };
    (at(0.50), at(0.99))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn dir_bytes(p: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(p).map_or(0, |d| d.flatten().map(|e| dir_bytes(&e.path())).sum())
}

#[test]
fn ten_thousand_volumes_or_a_thousand_within_bounds() {
    let n = count();
    let c = Cluster::start("scale", 3);
    let store = match (&c.etcd, &c.apiserver) {
        (Some(_), _) => "etcd",
        (_, Some(_)) => "Kubernetes (CRD)",
        _ => "embedded",
    };
    let http = c.controller_http();
    let url = c.controllers[0].url.clone();
    let bearer = c.tokens.admin_bearer();
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| -> Duration {
        let t = Instant::now();
        let mut req = http
            .request(method.clone(), format!("{url}{path}"))
            .header("authorization", &bearer);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req
            .send()
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = r.status();
        let text = r.text().unwrap_or_default();
        let took = t.elapsed();
        assert!(status.is_success(), "{method} {path}: {status}: {text}");
        took
    };
    let name = |i: usize| format!("s{i:05}");

    let mut create = Vec::with_capacity(n);
    for i in 0..n {
        let body = json!({"name": name(i), "size_bytes": 16u64 << 20, "replicas": 2});
        create.push(call(reqwest::Method::POST, "/v1/volumes", Some(body)));
    }
    let mut attach = Vec::new();
    let mut detach = Vec::new();
    for i in 0..ATTACHED.min(n) {
        let node = ["n1", "n2", "n3"][i % 3];
        let path = format!("/v1/volumes/{}/attach", name(i));
        attach.push(call(
            reqwest::Method::POST,
            &path,
            Some(json!({"node": node})),
        ));
    }

    // The controller with every volume in its store and some attached: its loops (engine
    // watch, self-heal, catch-up, events) run, and nobody asks anything.
    let pid = c.controllers[0].child.id();
    let window = idle_window();
    eprintln!(
        "scale: idle window of {} s opens on controller pid {pid}",
        window.as_secs()
    );
    let before = cpu_ticks(pid);
    let t = Instant::now();
    std::thread::sleep(window);
    // Ticks are hundredths of a second: ticks / secs is percent of one core.
    #[allow(clippy::cast_precision_loss)]
    let idle_pct = cpu_ticks(pid).saturating_sub(before) as f64 / t.elapsed().as_secs_f64();

    // The list, whole (best of three: the first one warms the store's cache too).
    let mut whole = Duration::MAX;
    let mut bytes = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let r = http
            .get(format!("{url}/v1/volumes"))
            .header("authorization", &bearer)
            .send()
            .expect("list volumes");
        let body = r.bytes().expect("list body");
        whole = whole.min(t.elapsed());
        bytes = body.len();
        let all: Vec<Value> = serde_json::from_slice(&body).expect("list JSON");
        assert_eq!(all.len(), n, "every volume is listed");
    }
    // By pages of 1,000, following the links: every name once, in order.
    let t = Instant::now();
    let mut next = Some(format!("{url}/v1/volumes?limit=1000"));
    let mut names = Vec::with_capacity(n);
    while let Some(u) = next.take() {
        let r = http
            .get(&u)
            .header("authorization", &bearer)
            .send()
            .expect("list a page");
        assert!(r.status().is_success(), "{u}: {}", r.status());
        next = r.headers().get("link").and_then(|l| {
            let l = l.to_str().ok()?;
            let path = l.strip_prefix('<')?.split('>').next()?;
            Some(format!("{url}{path}"))
        });
        let page: Vec<Value> = r.json().expect("page JSON");
        names.extend(
            page.iter()
                .filter_map(|v| v["name"].as_str().map(String::from)),
        );
    }
    let paged = t.elapsed();
    let want: Vec<String> = (0..n).map(name).collect();
    assert_eq!(
        names, want,
        "the pages hold every volume once, in name order"
    );
    let t = Instant::now();
    let table = c.cli_ok(&["volume", "list"]);
    let cli = t.elapsed();
    assert_eq!(
        table.lines().count(),
        n + 1,
        "a header and a line per volume"
    );

    let rss_mib = rss_kib(pid) / 1024;
    // etcd's data directory holds its history until compaction: an upper bound.
    let store_bytes = match (&c.etcd, &c.apiserver) {
        (Some(_), _) => dir_bytes(&c.dir.path().join("etcd-data")),
        (_, Some(_)) => dir_bytes(&c.dir.path().join("apiserver").join("etcd")),
        _ => {
            let data = c.dir.path().join(&c.controllers[0].name);
            dir_bytes(&data.join("store.json")) + dir_bytes(&data.join("store.json.log"))
        }
    };

    for i in 0..ATTACHED.min(n) {
        let path = format!("/v1/volumes/{}/detach", name(i));
        detach.push(call(reqwest::Method::POST, &path, Some(json!({}))));
    }
    let mut delete = Vec::with_capacity(n);
    for i in 0..n {
        delete.push(call(
            reqwest::Method::DELETE,
            &format!("/v1/volumes/{}", name(i)),
            None,
        ));
    }
    assert!(c.volumes().is_empty(), "every volume deleted");

    let (c50, c99) = quantiles(&mut create);
    let (a50, a99) = quantiles(&mut attach);
    let (t50, t99) = quantiles(&mut detach);
    let (d50, d99) = quantiles(&mut delete);
    println!(
        "scale: {store} store, {n} volumes (2 replicas, 3 nodes): create p50 {:.0} ms p99 {:.0} \
         ms; attach ({}) p50 {:.0} ms p99 {:.0} ms; detach p50 {:.0} ms p99 {:.0} ms; delete p50 \
         {:.0} ms p99 {:.0} ms; list whole {:.0} ms ({:.1} MiB of JSON), by pages of 1,000 {:.0} \
         ms, `hawser volume list` {:.0} ms; controller {rss_mib} MiB RSS, {idle_pct:.1}% of a \
         core idle over {} s; store {:.1} MiB",
        ms(c50),
        ms(c99),
        attach.len(),
        ms(a50),
        ms(a99),
        ms(t50),
        ms(t99),
        ms(d50),
        ms(d99),
        ms(whole),
        bytes as f64 / 1048576.0,
        ms(paged),
        ms(cli),
        window.as_secs(),
        store_bytes as f64 / 1048576.0,
    );
    let _ = std::io::stdout().flush();
    let q = |(p50, p99): (Duration, Duration)| Quantiles {
        p50: ms(p50),
        p99: ms(p99),
    };
    let figure = Figure::Api(ApiFigure {
        store: store.to_string(),
        volumes: n as u64,
        create_ms: q((c50, c99)),
        attach_ms: q((a50, a99)),
        detach_ms: q((t50, t99)),
        delete_ms: q((d50, d99)),
        list_whole_ms: ms(whole),
        list_pages_ms: ms(paged),
        cli_list_ms: ms(cli),
        controller_rss_mib: rss_mib,
        controller_idle_pct: idle_pct,
        store_mib: store_bytes as f64 / 1048576.0,
    });
    cluster_figures::record(&figure).expect("record the figure for make bench's charts");

    // The guard; `make bench` only measures (`HAWSER_SCALE_MEASURE_ONLY=1`), so that a store
    // past the bounds still gets its line and the bench goes on.
    if std::env::var("HAWSER_SCALE_MEASURE_ONLY").is_ok_and(|v| v == "1") {
        return;
    }
    #[allow(clippy::cast_possible_truncation)]
    let max_list = MAX_LIST_PER_1000 * (n.div_ceil(1000) as u32);
    for (what, p99) in [
        ("create", c99),
        ("attach", a99),
        ("detach", t99),
        ("delete", d99),
    ] {
        assert!(p99 <= MAX_OP_P99, "{what} p99 {p99:?} > {MAX_OP_P99:?}");
    }
    assert!(whole <= max_list, "whole list {whole:?} > {max_list:?}");
    assert!(paged <= max_list, "paged list {paged:?} > {max_list:?}");
    assert!(
        rss_mib <= MAX_RSS_MIB,
        "controller RSS {rss_mib} MiB > {MAX_RSS_MIB}"
    );
    assert!(
        idle_pct <= MAX_IDLE_CPU_PCT,
        "controller idle CPU {idle_pct:.1}% > {MAX_IDLE_CPU_PCT}%"
    );
}
