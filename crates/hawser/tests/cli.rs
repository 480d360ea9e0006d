//! The `hawser` binary's client commands against a controller started by the test (in
//! process, on 127.0.0.1:0) and a minimal fake agent that accepts every admin call.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use hawser_api::agent::{CreateReplica, EngineStatus, ReplicaStatus, StartEngine};
use hawser_controller::{Controller, ControllerArgs};
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;

/// The hawser binary with no token from the environment or the user's config: each test
/// says which token it uses.
fn hawser_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hawser"));
    cmd.env_remove("HAWSER_TOKEN")
        .env_remove("HAWSER_TOKEN_FILE")
        .env_remove("HAWSER_CA_FILE")
        .env("XDG_CONFIG_HOME", "/nonexistent/hawser-test-config");
    cmd
}

/// A controller and a fake agent on a runtime of their own; dropped at the end of the test.
struct Env {
    url: String,
    agent: SocketAddr,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Env {
    fn start() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let args = ControllerArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().to_path_buf(),
            store: None,
            etcd: Default::default(),
            node_timeout_secs: 60,
            advertise_url: None,
            engine_check_secs: 0,
            scrub_interval_secs: 0,
            backup_rate: 0,
            backup_retry_secs: 120,
            standby_poll_secs: 60,
            backup_prune_grace_secs: 600,
            replace_after_secs: 300,
            max_rebuilds: 2,
            heal_check_secs: 0,
            admin_token_file: None,
            agent_token_file: None,
            metrics_token_file: None,
            insecure: true,
            ca_secret: None,
            cert_lifetime_secs: 3600,
            tls_san: Vec::new(),
            failover_after_secs: 10,
            failover_confirm_secs: 4,
            csi_driver: "csi.hawser.dev".into(),
        };
        let ctl = rt.block_on(Controller::bind(args)).unwrap();
        let url = format!("http://{}", ctl.local_addr().unwrap());
        rt.spawn(ctl.serve(std::future::pending()));
        let agent = rt.block_on(fake_agent());
        Env {
            url,
            agent,
            _rt: rt,
            _dir: dir,
        }
    }

    /// Registers nodes n1..=n{count}, all served by the fake agent.
    fn register(&self, count: usize) {
        let none: Vec<&str> = vec![""; count];
        self.register_zones(&none);
    }

    /// Registers one node per entry of `zones`, n1 in the first; "" means no zone label.
    fn register_zones(&self, zones: &[&str]) {
        let http = reqwest::blocking::Client::new();
        let token = std::fs::read_to_string(self.token_file()).unwrap();
        let bearer = format!("Bearer {}", token.trim());
        for (i, zone) in zones.iter().enumerate() {
            let node = format!("n{}", i + 1);
            let labels = if zone.is_empty() {
                json!({})
            } else {
                json!({ "zone": zone })
            };
            let body = json!({
                "admin_addr": self.agent.to_string(),
                "replica_addr": "127.0.0.1:9600",
                "nbd_addr": "127.0.0.1:10809",
                "nbd_socket": null,
                "pools": [{"node": node, "name": "default", "path": "/srv/pool",
                    "capacity_bytes": 100 * GIB, "free_bytes": 80 * GIB,
                    "provisioned_bytes": 0, "overprovision_ratio": 1.5, "replicas": 0}],
                "labels": labels,
            });
            let r = http
                .put(format!("{}/v1/nodes/{node}", self.url))
                .header("authorization", &bearer)
                .json(&body)
                .send()
                .unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().unwrap());
        }
    }

    /// The admin token file the controller wrote at cluster init.
    fn token_file(&self) -> std::path::PathBuf {
        self._dir.path().join("admin.token")
    }

    fn hawser(&self, args: &[&str]) -> Output {
        hawser_cmd()
            .args(args)
            .env("HAWSER_CONTROLLER", &self.url)
            .env("HAWSER_TOKEN_FILE", self.token_file())
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.hawser(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }
}

async fn fake_agent() -> SocketAddr {
    async fn create(Json(r): Json<CreateReplica>) -> (StatusCode, Json<ReplicaStatus>) {
        let status = ReplicaStatus {
            replica_id: r.replica_id,
            volume: r.volume,
            pool: r.pool,
            size_bytes: r.size_bytes,
            thin: r.thin,
            epoch: 0,
            allocated_bytes: 0,
            data_path: "/srv/pool/x".into(),
            failed: false,
            error: None,
            cluster_id: None,
            key_check: r.key_check,
            checksums: r.checksums,
            wrapped_key: r.wrapped_key,
            volume_uid: None,
        };
        (StatusCode::CREATED, Json(status))
    }
    async fn start(Json(s): Json<StartEngine>) -> Json<EngineStatus> {
        Json(EngineStatus {
            volume: s.volume,
            epoch: s.epoch,
            size_bytes: s.size_bytes,
            in_sync: s.replicas.into_iter().map(|r| r.replica_id).collect(),
            replicas: vec![],
            recovery: None,
            active_extents: 0,
            qos: s.qos,
            scrub: None,
        })
    }
    let app = Router::new()
        .route("/v1/replicas", post(create))
        .route(
            "/v1/replicas/{id}",
            delete(|| async { StatusCode::NO_CONTENT }),
        )
        .route("/v1/engines", post(start))
        .route(
            "/v1/engines/{volume}",
            delete(|| async { StatusCode::NO_CONTENT }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[test]
fn bad_sizes_names_and_replicas_are_refused_before_any_request() {
    let env = Env::start();
    env.register(3);
    let cases: &[(&[&str], &str)] = &[
        (&["--size", "0"], "size must be greater than 0"),
        (&["--size", "-1"], "negative"),
        (&["--size", "abc"], "not a number"),
        (&["--size", "1000"], "not a multiple of 4096"),
        (&["--size", "1GiB", "--replicas", "0"], "1..=5"),
        (&["--size", "1GiB", "--replicas", "6"], "1..=5"),
    ];
    for (extra, msg) in cases {
        let mut args = vec!["volume", "create", "demo"];
        args.extend_from_slice(extra);
        let out = env.hawser(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(msg), "{args:?}: {stderr}");
    }
    for name in ["Demo", "a_b", "x".repeat(64).as_str()] {
        let out = env.hawser(&["volume", "create", name, "--size", "1GiB"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains("invalid volume name"), "{stderr}");
    }
    assert_eq!(env.json(&["volume", "list", "-o", "json"]), json!([]));
    assert_eq!(
        env.ok(&["volume", "list"]),
        "NAME  SIZE  TYPE  CHECKSUMS  IN-SYNC  STATE  NODE  EPOCH\n"
    );
}

#[test]
fn node_and_pool_lists() {
    let env = Env::start();
    assert_eq!(env.json(&["node", "list", "-o", "json"]), json!([]));
    env.register(2);
    let nodes = env.json(&["node", "list", "-o", "json"]);
    assert_eq!(nodes.as_array().unwrap().len(), 2);
    assert_eq!(nodes[0]["name"], "n1");
    assert_eq!(nodes[0]["state"], "online");
    let table = env.ok(&["node", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME  STATE   ADMIN"), "{table}");
    assert!(lines[1].starts_with("n1    online  127.0.0.1:"), "{table}");
    let pools = env.json(&["pool", "list", "-o", "json"]);
    assert_eq!(pools[1]["node"], "n2");
    assert_eq!(pools[1]["free_bytes"], 80 * GIB);
    let table = env.ok(&["pool", "list"]);
    assert!(
        table.contains("n2    default  100 GiB   80 GiB  0 B"),
        "{table}"
    );
}

/// A reader that stops early (`| head -1`, `| grep -q`): the CLI ends quietly, as Unix tools
/// do, instead of panicking about a broken pipe.
#[test]
fn a_closed_stdout_ends_the_cli_quietly() {
    let env = Env::start();
    env.register(2);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = hawser_cmd()
        .args(["node", "list", "-o", "json"])
        .env("HAWSER_CONTROLLER", &env.url)
        .env("HAWSER_TOKEN_FILE", env.token_file())
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}

#[test]
fn volume_lifecycle() {
    let env = Env::start();
    env.register(3);
    let out = env.ok(&[
        "volume",
        "create",
        "demo",
        "--size",
        "10GiB",
        "--replicas",
        "2",
    ]);
    assert!(out.starts_with("volume demo created\n"), "{out}");
    assert!(out.contains("10 GiB (thin)"), "{out}");
    assert!(
        out.contains("Checksum: on (CRC-32C per 4 KiB block, checked on every read)\n"),
        "{out}"
    );
    let v = env.json(&[
        "volume", "create", "big", "--size", "1GiB", "--thick", "-o", "json",
    ]);
    assert_eq!(
        (v["thin"].as_bool(), v["replicas"].as_array().unwrap().len()),
        (Some(false), 2)
    );
    let list = env.ok(&["volume", "list"]);
    assert!(
        list.contains("demo  10 GiB  thin   on         2/2      detached  -     0"),
        "{list}"
    );

    let v = env.json(&["volume", "attach", "demo", "--node", "n2", "-o", "json"]);
    assert_eq!(
        (v["state"].as_str(), v["epoch"].as_u64()),
        (Some("attached"), Some(1))
    );
    let show = env.ok(&["volume", "show", "demo"]);
    assert!(
        show.contains("NBD:      nbd://127.0.0.1:10809/demo"),
        "{show}"
    );
    assert!(show.contains("Node:     n2"), "{show}");

    // Controller refusals: exit 1 with the controller's message.
    let out = env.hawser(&["volume", "delete", "demo"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: volume \"demo\" is attached to node \"n2\""),
        "{stderr}"
    );
    let out = env.hawser(&["volume", "create", "demo", "--size", "1GiB"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: volume \"demo\" already exists\n"
    );
    let out = env.hawser(&[
        "volume",
        "create",
        "five",
        "--size",
        "1GiB",
        "--replicas",
        "5",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("need 5 nodes"));

    assert!(env
        .ok(&["volume", "detach", "demo"])
        .starts_with("volume demo detached\n"));
    assert_eq!(
        env.ok(&["volume", "delete", "demo"]),
        "volume demo deleted\n"
    );
    let out = env.json(&["volume", "delete", "big", "-o", "json"]);
    assert_eq!(out, json!({"name": "big", "deleted": true}));
    assert_eq!(env.json(&["volume", "list", "-o", "json"]), json!([]));
    let out = env.hawser(&["volume", "show", "demo"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: volume \"demo\" not found\n"
    );
}

/// `--checksums on|off` (default on) reaches the volume, and list, show and JSON say it.
#[test]
fn checksums_flag_defaults_on_and_shows_everywhere() {
    let env = Env::start();
    env.register(2);
    let v = env.json(&["volume", "create", "summed", "--size", "1GiB", "-o", "json"]);
    assert_eq!(v["checksums"], true, "{v}");
    let v = env.json(&[
        "volume",
        "create",
        "plain",
        "--size",
        "1GiB",
        "--checksums",
        "off",
        "-o",
        "json",
    ]);
    assert_eq!(v["checksums"], false, "{v}");
    let v = env.json(&["volume", "show", "summed", "-o", "json"]);
    assert_eq!(v["checksums"], true, "{v}");
    let show = env.ok(&["volume", "show", "plain"]);
    assert!(show.contains("Checksum: off\n"), "{show}");
    let list = env.json(&["volume", "list", "-o", "json"]);
    let sums: Vec<(&str, bool)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap(),
                v["checksums"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(sums, [("plain", false), ("summed", true)]);
    let list = env.ok(&["volume", "list"]);
    assert!(list.contains("plain   1 GiB  thin  off "), "{list}");
    assert!(list.contains("summed  1 GiB  thin  on  "), "{list}");
    let out = env.hawser(&[
        "volume",
        "create",
        "x",
        "--size",
        "1GiB",
        "--checksums",
        "yes",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--checksums"), "{stderr}");
}

#[test]
fn zones_labels_and_placement_flags() {
    let env = Env::start();
    env.register_zones(&["a", "a", "b"]);
    let table = env.ok(&["node", "list"]);
    assert!(
        table.lines().next().unwrap().ends_with("LAST-SEEN  LABELS"),
        "{table}"
    );
    assert!(
        table.lines().nth(1).unwrap().ends_with(" zone=a"),
        "{table}"
    );
    let show = env.ok(&["node", "show", "n3"]);
    assert!(show.contains("Labels:    zone=b\n"), "{show}");
    assert!(
        show.contains("  default  any   100 GiB   80 GiB  0 B          150 GiB (1.5x)  0"),
        "{show}"
    );
    assert_eq!(
        env.json(&["node", "show", "n3", "-o", "json"])["labels"]["zone"],
        "b"
    );
    let out = env.hawser(&["node", "show", "n9"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: node \"n9\" not found\n"
    );
    let pools = env.ok(&["pool", "list"]);
    assert!(
        pools.contains("0 B          150 GiB (1.5x)  any   0"),
        "{pools}"
    );

    // Zones are labelled, so spread is strict unless asked otherwise.
    let out = env.hawser(&["volume", "create", "v", "--size", "1GiB", "--replicas", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("in 2 zones: a (n1, n2), b (n3)"),
        "{stderr}"
    );
    let v = env.json(&[
        "volume",
        "create",
        "v",
        "--size",
        "1GiB",
        "--replicas",
        "3",
        "--zone-spread",
        "preferred",
        "--prefer-node",
        "n2",
        "-o",
        "json",
    ]);
    assert_eq!(v["replicas"][0]["node"], "n2", "{v}");
    assert_eq!(
        v["placement"],
        json!({"pool": null, "zone_spread": "preferred", "prefer_node": "n2"})
    );
    let show = env.ok(&["volume", "show", "v"]);
    assert!(
        show.contains("Policy:   zone spread preferred, prefer node n2\n"),
        "{show}"
    );
    let out = env.hawser(&["volume", "create", "w", "--size", "1GiB", "--pool", "ssd"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("n3 (no pool ssd (has default))"),
        "{stderr}"
    );
    for bad in [
        &["--zone-spread", "sometimes"][..],
        &["--pool", "SSD"],
        &["--prefer-node", "n 1"],
    ] {
        let mut args = vec!["volume", "create", "w", "--size", "1GiB"];
        args.extend_from_slice(bad);
        let out = env.hawser(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn unreachable_controller_is_exit_1() {
    // Bind and drop to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = hawser_cmd()
        .env("HAWSER_TOKEN", "t".repeat(40))
        .args(["--controller", &url, "volume", "list"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: cannot reach the controller at {url}")),
        "{stderr}"
    );
}

/// `hawser controller` itself: starts with TLS by default (its CA made at first start),
/// answers over HTTPS a client that trusts that CA, refuses plaintext, and stops on SIGTERM
/// with its state saved.
#[test]
fn controller_subcommand_serves_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = hawser_cmd()
        .args(["controller", "--listen", &listen, "--data-dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("https://{listen}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = hawser_cmd()
            .arg("--token-file")
            .arg(dir.path().join("admin.token"))
            .arg("--ca-file")
            .arg(dir.path().join("ca.pem"))
            .args(["--controller", &url, "node", "list", "-o", "json"])
            .output()
            .unwrap();
        if out.status.success() {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "controller did not answer: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Plain HTTP is not served.
    let plain = hawser_cmd()
        .arg("--token-file")
        .arg(dir.path().join("admin.token"))
        .args(["--controller", &format!("http://{listen}"), "node", "list"])
        .output()
        .unwrap();
    assert!(!plain.status.success(), "plaintext answered");
    // Cluster init wrote both tokens and the CA key, readable by the owner only.
    for file in ["admin.token", "agent.token", "ca.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
    // SIGTERM: a graceful stop exits 0.
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// The controller never reaches etcd off loopback in plaintext unless told `--insecure`, and
/// refuses etcd flags it would ignore or that are half given.
#[test]
fn controller_refuses_plaintext_etcd_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        hawser_cmd()
            .args(["controller", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap()
    };
    // 192.0.2.0/24 is TEST-NET-1: never routed, so nothing is sent anywhere.
    let out = run(&["--store", "etcd://192.0.2.1:2379"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("plaintext") && stderr.contains("--etcd-ca-file"),
        "{stderr}"
    );
    let out = run(&["--etcd-ca-file", "/nonexistent"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("need an etcd:// store"), "{stderr}");
    // A certificate without its key, a user without a password: usage errors.
    for half in [
        &["--etcd-cert-file", "c.pem", "--etcd-ca-file", "ca.pem"][..],
        &["--etcd-user", "hawser"][..],
    ] {
        let out = run(half);
        assert_eq!(out.status.code(), Some(2), "{half:?}");
    }
}

/// A follower controller: answers everything with `not_leader`, naming `leader`. Counts the
/// requests it got.
async fn fake_follower(
    leader: Option<String>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = Router::new().fallback(move || {
        let leader = leader.clone();
        h.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut e = hawser_api::ApiError::new(
                hawser_api::ErrorCode::NotLeader,
                "this controller is not the leader",
            );
            e.leader_url = leader;
            (StatusCode::SERVICE_UNAVAILABLE, Json(e))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, hits)
}

/// `--controller A,B,C`: a controller that cannot be reached is skipped, a follower's
/// `not_leader` is followed to the leader it names, and with no leader anywhere the error
/// says so (exit 1).
#[test]
fn controller_list_skips_the_unreachable_and_follows_the_leader() {
    use std::sync::atomic::Ordering;
    let env = Env::start();
    env.register(1);
    let dead = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("http://127.0.0.1:{port}")
    };
    let (follower, hits) = env._rt.block_on(fake_follower(Some(env.url.clone())));
    let list = format!("{dead},{follower}");
    let out = hawser_cmd()
        .env("HAWSER_TOKEN_FILE", env.token_file())
        .args(["--controller", &list, "node", "list", "-o", "json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let nodes: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(nodes[0]["name"], "n1", "{nodes}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "the follower was asked once"
    );
    // A create through the follower happens exactly once, on the leader.
    let out = hawser_cmd()
        .env("HAWSER_TOKEN_FILE", env.token_file())
        .args([
            "--controller",
            &follower,
            "volume",
            "create",
            "v1",
            "--size",
            "1GiB",
            "--replicas",
            "1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let volumes = env.json(&["volume", "list", "-o", "json"]);
    assert_eq!(volumes.as_array().unwrap().len(), 1, "{volumes}");

    let (nobody, _) = env._rt.block_on(fake_follower(None));
    let out = hawser_cmd()
        .env("HAWSER_TOKEN_FILE", env.token_file())
        .args([
            "--controller",
            &format!("{dead},{nobody}"),
            "volume",
            "list",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not the leader"), "{stderr}");
}

/// The CLI's token sources: none is a clear error (exit 1, nothing sent), a wrong token is
/// the controller's `unauthorized`, and `--token-file` beats `HAWSER_TOKEN`, which works on
/// its own too.
#[test]
fn token_sources_and_refusals() {
    let env = Env::start();
    let run = |cmd: &mut Command| {
        let out = cmd
            .env("HAWSER_CONTROLLER", &env.url)
            .args(["node", "list", "-o", "json"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), stderr)
    };
    let (code, stderr) = run(&mut hawser_cmd());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no API token"), "{stderr}");
    let wrong = "w".repeat(40);
    let (code, stderr) = run(hawser_cmd().env("HAWSER_TOKEN", &wrong));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("unauthorized"), "{stderr}");
    let (code, stderr) = run(hawser_cmd().env("HAWSER_TOKEN", "short"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("HAWSER_TOKEN"), "{stderr}");
    let token = std::fs::read_to_string(env.token_file()).unwrap();
    let (code, stderr) = run(hawser_cmd().env("HAWSER_TOKEN", token.trim()));
    assert_eq!(code, Some(0), "{stderr}");
    let file = env.token_file();
    let (code, stderr) = run(hawser_cmd()
        .env("HAWSER_TOKEN", &wrong)
        .arg("--token-file")
        .arg(&file));
    assert_eq!(code, Some(0), "--token-file wins: {stderr}");
}

/// `hawser cluster rotate-admin-token`: the new token is written (mode 0600) and works; with
/// no grace period the old one is refused at once; with one, both work.
#[test]
fn the_admin_token_rotates_without_an_outage() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::start();
    let old = std::fs::read_to_string(env.token_file()).unwrap();
    let new_file = env._dir.path().join("rotated.token");
    let with = |file: &std::path::Path, args: &[&str]| {
        hawser_cmd()
            .args(args)
            .env("HAWSER_CONTROLLER", &env.url)
            .env("HAWSER_TOKEN_FILE", file)
            .output()
            .unwrap()
    };
    // A grace period: both tokens work.
    let out = with(
        &env.token_file(),
        &[
            "cluster",
            "rotate-admin-token",
            "--write",
            &new_file.display().to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&new_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let new = std::fs::read_to_string(&new_file).unwrap();
    assert_ne!(new.trim(), old.trim());
    assert!(with(&new_file, &["volume", "list"]).status.success());
    assert!(with(&env.token_file(), &["volume", "list"])
        .status
        .success());
    // No grace: the token that asked is refused from then on, the newest works.
    let out = with(
        &new_file,
        &["cluster", "rotate-admin-token", "--grace-secs", "0"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let newest = String::from_utf8(out.stdout).unwrap();
    let newest_file = env._dir.path().join("newest.token");
    std::fs::write(&newest_file, &newest).unwrap();
    let refused = with(&new_file, &["volume", "list"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not valid"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(with(&newest_file, &["volume", "list"]).status.success());
}
