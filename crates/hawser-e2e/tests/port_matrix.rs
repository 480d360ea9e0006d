//! Issue 39, acceptance a: every port admits exactly who it should. A cluster of the real
//! binaries (a controller and two agents, TLS by default, as `make demo` runs them) is
//! probed on every port with every credential, from the one that brings nothing to each
//! token and certificate, and what each opened is compared with the table in
//! docs/security.md ("Who opens what"), cell by cell. A refusal changes nothing: the
//! volumes, replicas, epochs, nodes and data are the same afterwards.
//!
//! What a probe tries, per port. A cell lists what opened; `—` means the port served the
//! client (answered HTTP requests, NBD options or a Hello) but opened nothing; `no session`
//! means it served nothing at all (no TLS handshake, plaintext not spoken, the connection
//! closed); `n/a` means the credential cannot be brought to that port:
//! - controller API: `admin` (GET /v1/volumes), `agent` (POST /v1/nodes/n1/certificate: a
//!   node renewing its certificate), `join` (POST /v1/join as a new node n9);
//! - controller /metrics and agent /metrics: `scrape` (GET /metrics);
//! - agent admin API: `admin` (GET /v1/status of agent n1);
//! - replica port: `Hello` (a Hello with a valid grant for n1's engine, to n2's replica,
//!   answered Ok);
//! - NBD TCP (n1's): the exports `NBD_OPT_GO` opens, of `ma` and `mb`;
//! - NBD unix socket (n1's): the same, as root or as another local user.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hawser_e2e::probe::{self, Tls};
use hawser_e2e::{have, qemu_io, wait_until, Cluster};
use hawser_tls::{Credentials, Peer};
use hawser_wire::frame::Status;
use reqwest::Method;
use serde_json::json;

const PORTS: [&str; 7] = [
    "controller API",
    "controller /metrics",
    "agent admin API",
    "agent /metrics",
    "replica port",
    "NBD TCP",
    "NBD unix socket",
];

/// What a row brings.
enum Cred {
    /// Connects and sends nothing.
    Nothing,
    /// Each port's protocol in clear, with the admin token where a token goes.
    Plaintext,
    /// TLS with `creds` (none: no certificate) and `token` where a token goes.
    Tls {
        creds: Option<Credentials>,
        token: Option<String>,
    },
    /// A local user other than root, at the unix socket.
    OtherUser,
}

struct Row {
    label: &'static str,
    cred: Cred,
}

struct Probes {
    c: Cluster,
    ca_pem: String,
    replica_hello: Vec<u8>,
    replica_epoch: u64,
    public_key: String,
}

impl Probes {
    fn tls(&self, expect: Peer, creds: &Option<Credentials>) -> Tls {
        Tls::With {
            ca_pem: self.ca_pem.clone(),
            expect,
            creds: creds.clone(),
        }
    }

    /// What `cred` opens at each of [`PORTS`].
    fn row(&self, cred: &Cred) -> Vec<String> {
        let ctl = self.c.url.trim_start_matches("https://").to_string();
        let n1 = self.c.agent("n1");
        let n2 = self.c.agent("n2");
        match cred {
            Cred::Nothing => {
                let nothing = |addr: &str, greeting: usize| {
                    let got = probe::send_nothing(addr);
                    assert!(
                        got.len() <= greeting,
                        "{addr} answered nothing with {got:?}"
                    );
                    Seen::default().cell()
                };
                vec![
                    nothing(&ctl, 0),
                    nothing(&ctl, 0),
                    nothing(&n1.admin, 0),
                    nothing(&n1.admin, 0),
                    nothing(&n2.replica, 0),
                    nothing(&n1.nbd, 18),
                    self.unix_socket().cell(),
                ]
            }
            Cred::Plaintext => {
                let admin = self.admin_token();
                vec![
                    self.controller_api(&Tls::Plain, Some(&admin)).cell(),
                    self.scrape(&Tls::Plain, &ctl, Some(&admin)).cell(),
                    self.agent_admin(&Tls::Plain, Some(&admin)).cell(),
                    self.scrape(&Tls::Plain, &n1.admin, Some(&admin)).cell(),
                    self.hello(&Tls::Plain).cell(),
                    self.nbd_tcp(&Tls::Plain).cell(),
                    "n/a".into(),
                ]
            }
            Cred::Tls { creds, token } => {
                let token = token.as_deref();
                let to_ctl = self.tls(Peer::Controller, creds);
                let to_n1 = self.tls(Peer::Node("n1".into()), creds);
                let to_n2 = self.tls(Peer::Node("n2".into()), creds);
                vec![
                    self.controller_api(&to_ctl, token).cell(),
                    self.scrape(&to_ctl, &ctl, token).cell(),
                    self.agent_admin(&to_n1, token).cell(),
                    self.scrape(&to_n1, &n1.admin, token).cell(),
                    self.hello(&to_n2).cell(),
                    self.nbd_tcp(&to_n1).cell(),
                    "n/a".into(),
                ]
            }
            Cred::OtherUser => {
                let mut row = vec!["n/a".to_string(); PORTS.len() - 1];
                row.push(self.unix_socket_as_nobody().cell());
                row
            }
        }
    }

    fn controller_api(&self, tls: &Tls, token: Option<&str>) -> Seen {
        let ctl = self.c.url.trim_start_matches("https://");
        let mut seen = Seen::default();
        let status = probe::http_status(tls, Method::GET, ctl, "/v1/volumes", token, &[], None);
        seen.http("admin", status);
        let renew = json!({"public_key": self.public_key});
        let path = "/v1/nodes/n1/certificate";
        let status = probe::http_status(tls, Method::POST, ctl, path, token, &[], Some(renew));
        seen.http("agent", status);
        let join = json!({"node": "n9", "token": token.unwrap_or("none"),
            "public_key": self.public_key});
        let status = probe::http_status(tls, Method::POST, ctl, "/v1/join", token, &[], Some(join));
        seen.http("join", status);
        seen
    }

    fn scrape(&self, tls: &Tls, addr: &str, token: Option<&str>) -> Seen {
        let mut seen = Seen::default();
        let status = probe::http_status(tls, Method::GET, addr, "/metrics", token, &[], None);
        seen.http("scrape", status);
        seen
    }

    fn agent_admin(&self, tls: &Tls, token: Option<&str>) -> Seen {
        let addr = &self.c.agent("n1").admin;
        let header = [("x-hawser-node", "n1")];
        let mut seen = Seen::default();
        let status = probe::http_status(tls, Method::GET, addr, "/v1/status", token, &header, None);
        seen.http("admin", status);
        seen
    }

    fn hello(&self, tls: &Tls) -> Seen {
        let addr = &self.c.agent("n2").replica;
        let answer = probe::replica_hello(addr, tls, self.replica_epoch, &self.replica_hello);
        Seen {
            session: answer.is_some(),
            opened: match answer {
                Some(Status::Ok) => vec!["Hello".into()],
                _ => vec![],
            },
        }
    }

    fn nbd_tcp(&self, tls: &Tls) -> Seen {
        let addr = &self.c.agent("n1").nbd;
        Seen {
            session: probe::nbd_tcp_session(addr, tls),
            opened: EXPORTS
                .into_iter()
                .filter(|e| probe::nbd_tcp_opens(addr, tls, e))
                .map(String::from)
                .collect(),
        }
    }

    fn unix_socket(&self) -> Seen {
        let sock = &self.c.agent("n1").socket;
        Seen {
            session: probe::nbd_unix_session(sock),
            opened: EXPORTS
                .into_iter()
                .filter(|e| probe::nbd_unix_opens(sock, e))
                .map(String::from)
                .collect(),
        }
    }

    /// The unix socket as user `nobody`: nbdinfo (run with setpriv) lists the exports, or
    /// is refused the connection.
    fn unix_socket_as_nobody(&self) -> Seen {
        let sock = &self.c.agent("n1").socket;
        let out = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "nbdinfo",
                "--list",
            ])
            .arg(format!("nbd+unix:///?socket={}", sock.display()))
            .output()
            .expect("run nbdinfo as nobody");
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || err.contains("Permission denied"),
            "nbdinfo as nobody failed for another reason than permissions: {err}"
        );
        Seen {
            session: out.status.success(),
            opened: EXPORTS
                .into_iter()
                .filter(|e| text.contains(&format!("export=\"{e}\"")))
                .map(String::from)
                .collect(),
        }
    }

    fn admin_token(&self) -> String {
        read_token(&self.c.tokens.admin)
    }
}

/// The exports the NBD probes try: both attached at n1; the client certificate names `ma`.
const EXPORTS: [&str; 2] = ["ma", "mb"];

/// What one credential got at one port: whether the port served it at all, and what opened.
#[derive(Default)]
struct Seen {
    session: bool,
    opened: Vec<String>,
}

impl Seen {
    /// An HTTP probe: any answer means the port served the client; 2xx opens `what`.
    fn http(&mut self, what: &str, status: Option<u16>) {
        self.session |= status.is_some();
        if status.is_some_and(|s| (200..300).contains(&s)) {
            self.opened.push(what.into());
        }
    }

    fn cell(&self) -> String {
        match (self.session, self.opened.is_empty()) {
            (false, true) => "no session".into(),
            (true, true) => "—".into(),
            (_, false) => self.opened.join(", "),
        }
    }
}

fn read_token(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_string()
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The table between the markers in docs/security.md: row label -> cells.
fn documented() -> BTreeMap<String, Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/security.md");
    let text = std::fs::read_to_string(path).expect("read docs/security.md");
    let start = text
        .find("<!-- port-matrix:begin -->")
        .expect("docs/security.md has the port-matrix markers");
    let end = text
        .find("<!-- port-matrix:end -->")
        .expect("the end marker");
    let mut rows = BTreeMap::new();
    let mut lines = text[start..end].lines().filter(|l| l.starts_with('|'));
    let header: Vec<String> = split_row(lines.next().expect("a header row"));
    assert_eq!(
        header[1..],
        PORTS,
        "the table's columns are the ports, in this order"
    );
    for line in lines.skip(1) {
        let mut cells = split_row(line);
        let label = cells.remove(0);
        rows.insert(label, cells);
    }
    rows
}

fn split_row(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().trim_matches('`').to_string())
        .collect()
}

fn markdown(rows: &[(String, Vec<String>)]) -> String {
    let mut out = format!("| credential | {} |\n|---|", PORTS.join(" | "));
    out.push_str(&"---|".repeat(PORTS.len()));
    out.push('\n');
    for (label, cells) in rows {
        out.push_str(&format!("| {label} | {} |\n", cells.join(" | ")));
    }
    out
}

#[test]
fn every_port_admits_exactly_the_credentials_docs_security_md_lists() {
    for tool in ["qemu-io", "nbdinfo", "setpriv"] {
        if !have(tool) {
            eprintln!("SKIP: {tool} missing (make test installs it)");
            return;
        }
    }
    // An expired certificate of the cluster: one second of life, issued before the cluster
    // starts, so it has long run out when it is tried.
    let c = Cluster::start("ports", 2);
    let ca = c.tokens.ca();
    let (issued, key_pem) = ca
        .issue_with_key(&Peer::Node("n1".into()), Duration::from_secs(1))
        .expect("a short-lived certificate");
    let expired_after = issued.not_after_unix;
    let expired = Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    };
    let ma = c.attached_volume("ma", "16MiB", 2, "n1");
    c.attached_volume("mb", "16MiB", 2, "n1");
    qemu_io(&ma, &["write -P 0x3d 0 1M", "flush"]);
    // A detached volume whose replica on n2 takes the probes' Hellos (n1's engine's grant).
    c.cli_ok(&[
        "volume",
        "create",
        "rv",
        "--size",
        "16MiB",
        "--replicas",
        "2",
    ]);
    c.cli_ok(&["volume", "attach", "rv", "--node", "n1"]);
    c.cli_ok(&["volume", "detach", "rv"]);
    let rv_replica = c.replica_on("rv", "n2").id;
    let replica_epoch = c
        .agent_status("n2")
        .replicas
        .into_iter()
        .find(|r| r.replica_id == rv_replica)
        .expect("rv's replica on n2")
        .epoch;
    let replica_hello = c.granted_hello(&rv_replica, "rv", "n1", replica_epoch);

    // Tokens: the current ones, a join token, and the admin and metrics tokens they replace
    // (rotated with no grace: the old ones must be refused at once).
    let ctl_dir = c.dir.path().join("controller");
    let old_admin = read_token(&c.tokens.admin);
    let admin_file = c.tokens.admin.display().to_string();
    c.cli_ok(&[
        "cluster",
        "rotate-admin-token",
        "--grace-secs",
        "0",
        "--write",
        &admin_file,
    ]);
    let old_metrics = read_token(&ctl_dir.join("metrics.token"));
    let metrics_file = ctl_dir.join("metrics.token").display().to_string();
    c.cli_ok(&[
        "cluster",
        "rotate-metrics-token",
        "--grace-secs",
        "0",
        "--write",
        &metrics_file,
    ]);
    let metrics = read_token(&ctl_dir.join("metrics.token"));
    let join = c.cli_ok(&["cluster", "join-token"]).trim().to_string();
    let agent = read_token(&c.tokens.agent);
    let admin = read_token(&c.tokens.admin);
    assert_ne!(admin, old_admin, "the admin token was rotated");

    // Certificates: n1's own, the controller's, a client certificate for volume ma (written
    // by the CLI, as a user gets one), another CA's.
    let n1_creds = hawser_e2e::tokens::read_credentials(
        &c.agent("n1").data_dir.join("tls"),
        "node.pem",
        "node.key",
    );
    let client_dir: PathBuf = c.dir.path().join("client-ma");
    let client_dir_arg = client_dir.display().to_string();
    c.cli_ok(&["volume", "client-cert", "ma", "--out", &client_dir_arg]);
    let client =
        hawser_e2e::tokens::read_credentials(&client_dir, "client-cert.pem", "client-key.pem");
    let other = hawser_tls::Ca::generate("other").expect("another CA");
    let (issued, key_pem) = other
        .issue_with_key(&Peer::Node("n1".into()), hawser_tls::NODE_CERT_LIFETIME)
        .expect("a foreign certificate");
    let foreign = Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    };
    let (_, spki) = hawser_tls::new_key().expect("a key");
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    };
    wait_until(
        "the short certificate to expire",
        Duration::from_secs(10),
        || now().as_secs() > expired_after + 1,
    );
    // Agents learn the metrics token with their next heartbeat answer.
    let n1_admin = c.agent("n1").admin.clone();
    let to_n1 = Tls::With {
        ca_pem: c.tokens.ca_pem().to_string(),
        expect: Peer::Node("n1".into()),
        creds: None,
    };
    wait_until(
        "n1 to take the new metrics token",
        Duration::from_secs(30),
        || {
            probe::http_status(
                &to_n1,
                Method::GET,
                &n1_admin,
                "/metrics",
                Some(&metrics),
                &[],
                None,
            ) == Some(200)
        },
    );

    let tls = |creds: Option<Credentials>, token: Option<&str>| Cred::Tls {
        creds,
        token: token.map(str::to_string),
    };
    let rows = vec![
        Row {
            label: "nothing (connect, send nothing; root at the socket)",
            cred: Cred::Nothing,
        },
        Row {
            label: "plaintext (with the admin token)",
            cred: Cred::Plaintext,
        },
        Row {
            label: "TLS, no certificate, no token",
            cred: tls(None, None),
        },
        Row {
            label: "another CA's certificate",
            cred: tls(Some(foreign), None),
        },
        Row {
            label: "an expired certificate of the cluster",
            cred: tls(Some(expired), None),
        },
        Row {
            label: "node n1's certificate",
            cred: tls(Some(n1_creds), None),
        },
        Row {
            label: "the controller's certificate",
            cred: tls(Some(c.tokens.credentials(&Peer::Controller)), None),
        },
        Row {
            label: "a client certificate for volume ma",
            cred: tls(Some(client), None),
        },
        Row {
            label: "admin token",
            cred: tls(None, Some(&admin)),
        },
        Row {
            label: "metrics token",
            cred: tls(None, Some(&metrics)),
        },
        Row {
            label: "agent token",
            cred: tls(None, Some(&agent)),
        },
        Row {
            label: "join token",
            cred: tls(None, Some(&join)),
        },
        Row {
            label: "the admin token before rotation",
            cred: tls(None, Some(&old_admin)),
        },
        Row {
            label: "the metrics token before rotation",
            cred: tls(None, Some(&old_metrics)),
        },
        Row {
            label: "a local user other than root",
            cred: Cred::OtherUser,
        },
    ];
    let before = c.state_summary();
    let probes = Probes {
        ca_pem: c.tokens.ca_pem().to_string(),
        replica_hello,
        replica_epoch,
        public_key: b64(&spki),
        c,
    };
    let observed: Vec<(String, Vec<String>)> = rows
        .iter()
        .map(|r| (r.label.to_string(), probes.row(&r.cred)))
        .collect();
    let table = markdown(&observed);
    eprintln!("observed:\n{table}");
    let doc = documented();
    for (label, cells) in &observed {
        assert_eq!(
            doc.get(label),
            Some(cells),
            "row {label:?}: docs/security.md and the cluster disagree; observed:\n{table}"
        );
    }
    assert_eq!(
        doc.len(),
        observed.len(),
        "docs/security.md has rows no probe tried"
    );

    // Nothing was changed by what was refused: the same volumes, epochs, replicas and
    // nodes (no n9 registered), and ma's data.
    let c = &probes.c;
    assert_eq!(c.state_summary(), before, "a probe changed the cluster");
    assert!(c.nodes().iter().all(|n| n.name != "n9"));
    qemu_io(&ma, &["read -P 0x3d 0 1M"]);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&c.agent("n1").socket)
            .expect("the socket")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the NBD socket is the owner's only");
}
