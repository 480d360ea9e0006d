//! "Secure by default", acceptance a: a controller (TLS is its default) is the cluster's CA;
//! agents join with a join token and from then on every link between the processes is mutual
//! TLS (REST, admin API, replica port). A client without a certificate, with another node's,
//! or with one of another CA cannot call the controller's agent routes or an agent's admin
//! API, nor open a replica session (even with a valid grant for another node); no replica
//! changes; certificates renew while the volume serves I/O.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::time::Duration;

use hawser_e2e::cluster::{free_port, hawser_bin};
use hawser_e2e::{have, qemu_io, wait_until, TempDir, TokenFiles};
use hawser_tls::rustls;
use hawser_tls::{CertSlot, Credentials, Peer};
use hawser_wire::frame::{FrameHeader, Op, Status, HEADER_LEN};
use hawser_wire::grant::HelloRequest;
use serde_json::{json, Value};
use std::io::{Read, Write};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: plain libc call on a child we started.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}

fn spawn(dir: &Path, log: &str, args: &[String]) -> Proc {
    let err = std::fs::File::create(dir.join(format!("{log}.log"))).expect("log file");
    Proc(
        Command::new(hawser_bin())
            .args(args)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start hawser"),
    )
}

fn s(v: &str) -> String {
    v.to_string()
}

/// A blocking client trusting `ca_pem`, expecting `expect`, presenting `creds` if any.
fn client(ca_pem: &str, expect: Peer, creds: Option<&Credentials>) -> reqwest::blocking::Client {
    let slot = creds.map(|c| CertSlot::new(c).expect("credentials"));
    let config = hawser_tls::client_config(ca_pem, expect, slot).expect("client config");
    reqwest::blocking::Client::builder()
        .use_preconfigured_tls((*config).clone())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

fn node_creds(data_dir: &Path) -> Credentials {
    let read = |f: &str| std::fs::read_to_string(data_dir.join("tls").join(f)).expect("tls file");
    Credentials {
        chain_pem: read("node.pem"),
        key_pem: read("node.key"),
    }
}

/// (status, JSON body) of a call; `Err` when no HTTP answer came (TLS refused).
fn call(
    http: &reqwest::blocking::Client,
    method: reqwest::Method,
    url: &str,
    bearer: Option<&str>,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let mut req = http.request(method, url);
    if let Some(t) = bearer {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().map_err(|e| format!("{e:?}"))?;
    let status = resp.status().as_u16();
    let text = resp.text().unwrap_or_default();
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// The replica address node `node` registered.
fn replica_port(c: &TlsCluster, node: &str) -> String {
    let n = c.admin_call(reqwest::Method::GET, &format!("/v1/nodes/{node}"), None);
    n["replica_addr"]
        .as_str()
        .expect("replica_addr")
        .to_string()
}

fn hello_frame(epoch: u64, payload: &[u8]) -> Vec<u8> {
    let h = FrameHeader::request(Op::Hello, 1, epoch, 0, 0).with_payload(payload);
    let mut f = h.encode().to_vec();
    f.extend_from_slice(payload);
    f
}

/// A Hello in plaintext: the status of the answer, if any came.
fn plain_hello(addr: &str, epoch: u64, payload: &[u8]) -> Option<Status> {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let _ = s.write_all(&hello_frame(epoch, payload));
    let mut reply = [0u8; HEADER_LEN];
    s.read_exact(&mut reply).ok()?;
    FrameHeader::decode(&reply).ok().map(|h| h.status)
}

/// A Hello over TLS with `creds`: the status of the answer, or why none came.
fn tls_hello(
    addr: &str,
    ca_pem: &str,
    creds: &Credentials,
    epoch: u64,
    payload: &[u8],
) -> Result<Status, String> {
    let slot = CertSlot::new(creds).expect("credentials");
    let config = hawser_tls::client_config(ca_pem, Peer::Node("n2".into()), Some(slot))
        .expect("client config");
    let name = rustls::pki_types::ServerName::try_from("replica").expect("name");
    let conn = rustls::ClientConnection::new(config, name).expect("client connection");
    let tcp = std::net::TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(&hello_frame(epoch, payload))
        .map_err(|e| e.to_string())?;
    let mut reply = [0u8; HEADER_LEN];
    tls.read_exact(&mut reply).map_err(|e| e.to_string())?;
    FrameHeader::decode(&reply)
        .map(|h| h.status)
        .map_err(|e| e.to_string())
}

struct TlsCluster {
    dir: TempDir,
    url: String,
    ca_pem: String,
    admin: String,
    agents: Vec<(String, PathBuf, String)>, // (node, data dir, admin addr)
    procs: Vec<Proc>,
}

impl TlsCluster {
    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(hawser_bin())
            .args(["--controller", &self.url, "--ca-file"])
            .arg(self.dir.path().join("controller").join("ca.pem"))
            .arg("--token-file")
            .arg(self.dir.path().join("admin.token"))
            .args(args)
            .output()
            .expect("run the CLI");
        assert!(
            out.status.success(),
            "hawser {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn admin_call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let http = client(&self.ca_pem, Peer::Controller, None);
        let (status, v) = call(
            &http,
            method,
            &format!("{}{path}", self.url),
            Some(&self.admin),
            body,
        )
        .expect("the controller answers");
        assert!((200..300).contains(&status), "{path}: {status} {v}");
        v
    }
}

fn start(name: &str, nodes: usize, cert_lifetime_secs: u64) -> TlsCluster {
    let dir = TempDir::new(name);
    let tokens = TokenFiles::seed(dir.path());
    let port = free_port();
    let url = format!("https://127.0.0.1:{port}");
    let mut args = vec![
        s("controller"),
        s("--listen"),
        format!("127.0.0.1:{port}"),
        s("--data-dir"),
        dir.path().join("controller").display().to_string(),
        s("--cert-lifetime-secs"),
        cert_lifetime_secs.to_string(),
    ];
    args.extend(tokens.controller_args());
    let mut procs = vec![spawn(dir.path(), "controller", &args)];
    let ca_path = dir.path().join("controller").join("ca.pem");
    wait_until("the controller's CA", Duration::from_secs(20), || {
        ca_path.exists()
    });
    let ca_pem = std::fs::read_to_string(&ca_path).expect("ca.pem");
    let admin = std::fs::read_to_string(&tokens.admin)
        .expect("admin token")
        .trim()
        .to_string();
    let mut c = TlsCluster {
        dir,
        url,
        ca_pem,
        admin,
        agents: vec![],
        procs: vec![],
    };
    wait_until(
        "the controller to answer over TLS",
        Duration::from_secs(20),
        || {
            let http = client(&c.ca_pem, Peer::Controller, None);
            call(
                &http,
                reqwest::Method::GET,
                &format!("{}/v1/nodes", c.url),
                Some(&c.admin),
                None,
            )
            .is_ok_and(|(s, _)| s == 200)
        },
    );
    let token = c.cli(&["cluster", "join-token", "--uses", &nodes.to_string()]);
    let token_file = c.dir.path().join("join.token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write the join token");
    for i in 1..=nodes {
        let node = format!("n{i}");
        let data = c.dir.path().join(&node);
        let admin_addr = format!("127.0.0.1:{}", free_port());
        let args = vec![
            s("agent"),
            s("--node"),
            node.clone(),
            s("--controller"),
            c.url.clone(),
            s("--join-token-file"),
            token_file.display().to_string(),
            s("--data-dir"),
            data.display().to_string(),
            s("--admin-listen"),
            admin_addr.clone(),
            s("--replica-listen"),
            format!("127.0.0.1:{}", free_port()),
            s("--nbd-listen"),
            format!("127.0.0.1:{}", free_port()),
        ];
        procs.push(spawn(c.dir.path(), &node, &args));
        c.agents.push((node, data, admin_addr));
    }
    wait_until("every node online", Duration::from_secs(30), || {
        let v = c.admin_call(reqwest::Method::GET, "/v1/nodes", None);
        v.as_array()
            .is_some_and(|a| a.len() == nodes && a.iter().all(|n| n["state"] == json!("online")))
    });
    c.procs = procs;
    c
}

#[test]
fn only_the_clusters_certificates_open_the_apis_and_nothing_changes_otherwise() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing (make test installs it)");
        return;
    }
    let c = start("tls", 2, 3600);
    let v = c.admin_call(
        reqwest::Method::POST,
        "/v1/volumes",
        Some(json!({"name": "t", "size_bytes": 64u64 << 20, "replicas": 2})),
    );
    assert_eq!(v["replicas"].as_array().map(Vec::len), Some(2), "{v}");
    let a = c.admin_call(
        reqwest::Method::POST,
        "/v1/volumes/t/attach",
        Some(json!({"node": "n1"})),
    );
    let uri = a["nbd_unix_uri"].as_str().expect("an NBD URI").to_string();
    qemu_io(&uri, &["write -P 0x5c 0 4M", "flush"]);
    let before = c.admin_call(reqwest::Method::GET, "/v1/volumes/t", None);
    let replica = before["replicas"][1]["id"]
        .as_str()
        .expect("replica id")
        .to_string();

    let (n1, n2) = (&c.agents[0], &c.agents[1]);
    let n2_creds = node_creds(&n2.1);
    let other_ca = hawser_tls::Ca::generate("other").expect("another CA");
    let (issued, key_pem) = other_ca
        .issue_with_key(&Peer::Node("n1".into()), hawser_tls::NODE_CERT_LIFETIME)
        .expect("a foreign certificate");
    let foreign = Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    };
    let register = json!({"admin_addr": n1.2, "replica_addr": "127.0.0.1:1", "pools": []});
    let outdate = json!({"epoch": before["epoch"], "reason": "x"});
    let agent_token = std::fs::read_to_string(c.dir.path().join("agent.token")).expect("token");
    let agent_token = agent_token.trim();
    let put = reqwest::Method::PUT;
    let post = reqwest::Method::POST;

    // The controller: no certificate and the agent token (what every agent used to send)
    // is refused over TLS; node n2's certificate cannot act as n1 or report on n1's engine.
    let bare = client(&c.ca_pem, Peer::Controller, None);
    let as_n2 = client(&c.ca_pem, Peer::Controller, Some(&n2_creds));
    let node_url = format!("{}/v1/nodes/n1", c.url);
    let outdate_url = format!("{}/v1/volumes/t/replicas/{replica}/outdate", c.url);
    assert_eq!(
        call(&bare, put.clone(), &node_url, None, Some(register.clone())).map(|r| r.0),
        Ok(401)
    );
    assert_eq!(
        call(
            &bare,
            put.clone(),
            &node_url,
            Some(agent_token),
            Some(register.clone())
        )
        .map(|r| r.0),
        Ok(401)
    );
    let (status, e) =
        call(&as_n2, put.clone(), &node_url, None, Some(register.clone())).expect("answer");
    assert_eq!((status, &e["code"]), (403, &json!("forbidden")), "{e}");
    let (status, e) = call(
        &as_n2,
        post.clone(),
        &outdate_url,
        None,
        Some(outdate.clone()),
    )
    .expect("answer");
    assert_eq!((status, &e["code"]), (403, &json!("forbidden")), "{e}");
    let (status, _) = call(
        &as_n2,
        reqwest::Method::GET,
        &format!("{}/v1/volumes", c.url),
        None,
        None,
    )
    .expect("answer");
    assert_eq!(status, 403, "a node certificate is not the admin token");
    // A certificate of another CA does not even finish the handshake.
    let stranger = client(&c.ca_pem, Peer::Controller, Some(&foreign));
    assert!(call(
        &stranger,
        put.clone(),
        &node_url,
        None,
        Some(register.clone())
    )
    .is_err());
    // Join tokens: used up, garbage, or someone else's node name with a used-up token.
    let join = json!({"node": "n3", "token": std::fs::read_to_string(c.dir.path().join("join.token")).expect("token").trim(), "public_key": "AA=="});
    let (status, _) = call(
        &bare,
        post.clone(),
        &format!("{}/v1/join", c.url),
        None,
        Some(join),
    )
    .expect("answer");
    assert_eq!(status, 401, "a used-up join token");
    let garbage = json!({"node": "n3", "token": "hjt1.x", "public_key": "AA=="});
    let (status, _) = call(
        &bare,
        post.clone(),
        &format!("{}/v1/join", c.url),
        None,
        Some(garbage),
    )
    .expect("answer");
    assert_eq!(status, 401);

    // An agent's admin API: only the controller. A foreign certificate: no handshake; no
    // certificate (allowed at the handshake for Prometheus, which scrapes /metrics with the
    // metrics token) or node n2's: 403; plain HTTP: no answer.
    let admin_url = format!("https://{}/v1/replicas/{replica}", n2.2);
    let to_n2 = |creds: Option<&Credentials>| client(&c.ca_pem, Peer::Node("n2".into()), creds);
    let del = reqwest::Method::DELETE;
    let (status, e) = call(
        &to_n2(None),
        del.clone(),
        &admin_url,
        Some(agent_token),
        None,
    )
    .expect("answer");
    assert_eq!((status, &e["code"]), (403, &json!("forbidden")), "{e}");
    assert!(call(
        &to_n2(Some(&foreign)),
        del.clone(),
        &admin_url,
        Some(agent_token),
        None
    )
    .is_err());
    let n1_creds = node_creds(&n1.1);
    let (status, e) = call(
        &to_n2(Some(&n1_creds)),
        del.clone(),
        &admin_url,
        Some(agent_token),
        None,
    )
    .expect("answer");
    assert_eq!((status, &e["code"]), (403, &json!("forbidden")), "{e}");
    let plain = reqwest::blocking::Client::new();
    assert!(call(
        &plain,
        del,
        &format!("http://{}/v1/replicas/{replica}", n2.2),
        Some(agent_token),
        None
    )
    .is_err());

    // The replica port: plaintext, another CA's certificate, or node n1's grant presented
    // with node n2's certificate: no session.
    let replica_addr = replica_port(&c, "n2");
    let epoch = before["epoch"].as_u64().expect("epoch");
    let record = hawser_e2e::grants::embedded_cluster_record(&c.dir.path().join("controller"));
    let read = |f: &str| std::fs::read_to_string(c.dir.path().join("controller").join(f));
    let ca = hawser_tls::Ca::from_pem(
        &read("ca.pem").expect("ca.pem"),
        &read("ca.key").expect("ca.key"),
    )
    .expect("the cluster CA");
    let hello = HelloRequest {
        replica: replica.clone(),
        grant: Some(hawser_e2e::grants::sign_grant(
            &record,
            Some(&ca),
            "t",
            "n1",
            epoch,
        )),
    }
    .encode();
    assert_eq!(
        plain_hello(&replica_addr, epoch, &hello),
        None,
        "plaintext Hello answered"
    );
    assert!(
        tls_hello(&replica_addr, &c.ca_pem, &foreign, epoch, &hello).is_err(),
        "a certificate of another CA was accepted"
    );
    assert_eq!(
        tls_hello(&replica_addr, &c.ca_pem, &n2_creds, epoch, &hello),
        Ok(Status::Denied),
        "n1's grant with n2's certificate"
    );

    // Nothing changed: the same replicas, in sync, same epoch; the data reads back.
    let after = c.admin_call(reqwest::Method::GET, "/v1/volumes/t", None);
    assert_eq!(after["epoch"], before["epoch"]);
    let summary = |v: &Value| -> Vec<(Value, Value, Value)> {
        v["replicas"]
            .as_array()
            .expect("replicas")
            .iter()
            .map(|r| (r["id"].clone(), r["node"].clone(), r["state"].clone()))
            .collect()
    };
    assert_eq!(summary(&after), summary(&before));
    assert!(
        summary(&after).iter().all(|r| r.2 == json!("in_sync")),
        "{after}"
    );
    let out = qemu_io(&uri, &["read -P 0x5c 0 4M"]);
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

#[test]
fn certificates_renew_while_the_volume_serves() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing (make test installs it)");
        return;
    }
    // Certificates live 6 s: the agents renew at 4 s, several times during the test.
    let c = start("tls-renew", 2, 6);
    c.admin_call(
        reqwest::Method::POST,
        "/v1/volumes",
        Some(json!({"name": "r", "size_bytes": 64u64 << 20, "replicas": 2})),
    );
    let a = c.admin_call(
        reqwest::Method::POST,
        "/v1/volumes/r/attach",
        Some(json!({"node": "n1"})),
    );
    let uri = a["nbd_unix_uri"].as_str().expect("an NBD URI").to_string();
    let first: Vec<String> = c
        .agents
        .iter()
        .map(|(_, d, _)| node_creds(d).chain_pem)
        .collect();
    for round in 0..3u8 {
        let pattern = format!("write -P 0x{:02x} 0 1M", 0x30 + round);
        qemu_io(&uri, &[pattern.as_str(), "flush"]);
        // Each node's certificate file is replaced in time.
        let seen: Vec<String> = c
            .agents
            .iter()
            .map(|(_, d, _)| node_creds(d).chain_pem)
            .collect();
        wait_until(
            "every node renews its certificate",
            Duration::from_secs(20),
            || {
                c.agents
                    .iter()
                    .zip(&seen)
                    .all(|((_, d, _), old)| node_creds(d).chain_pem != *old)
            },
        );
    }
    let now: Vec<String> = c
        .agents
        .iter()
        .map(|(_, d, _)| node_creds(d).chain_pem)
        .collect();
    assert!(now.iter().zip(&first).all(|(a, b)| a != b));
    // Past two whole lifetimes of the first certificates, the nodes are online (heartbeats
    // and the controller's calls use the renewed ones) and the volume is whole.
    let nodes = c.admin_call(reqwest::Method::GET, "/v1/nodes", None);
    assert!(
        nodes
            .as_array()
            .is_some_and(|a| a.iter().all(|n| n["state"] == json!("online"))),
        "{nodes}"
    );
    let v = c.admin_call(reqwest::Method::GET, "/v1/volumes/r", None);
    assert!(
        v["replicas"]
            .as_array()
            .is_some_and(|r| r.iter().all(|x| x["state"] == json!("in_sync"))),
        "{v}"
    );
    let out = qemu_io(&uri, &["read -P 0x32 0 1M"]);
    assert!(!out.contains("Pattern verification failed"), "{out}");

    // The engine's report to the controller goes over TLS too: with n2 gone, a write is
    // acknowledged only after the engine has outdated n2's replica through the controller.
    let n2 = c.procs.len() - 1;
    // SAFETY: plain libc call on a child this test started.
    unsafe {
        libc::kill(c.procs[n2].0.id() as i32, libc::SIGKILL);
    }
    qemu_io(&uri, &["write -P 0x40 0 1M", "flush"]);
    let v = c.admin_call(reqwest::Method::GET, "/v1/volumes/r", None);
    let states: Vec<(Value, Value)> = v["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| (r["node"].clone(), r["state"].clone()))
        .collect();
    assert!(
        states.contains(&(json!("n1"), json!("in_sync")))
            && states.contains(&(json!("n2"), json!("outdated"))),
        "{v}"
    );
    let out = qemu_io(&uri, &["read -P 0x40 0 1M"]);
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

/// Waits until the process exits (it must, by itself) and returns its log.
fn exits_with_log(dir: &Path, log: &str, p: &mut Proc) -> String {
    wait_until(&format!("{log} to exit"), Duration::from_secs(30), || {
        matches!(p.0.try_wait(), Ok(Some(_)))
    });
    std::fs::read_to_string(dir.join(format!("{log}.log"))).unwrap_or_default()
}

/// The Helm chart's way in: every node gets the same Secret (the agent token and the CA's
/// certificate), joins with the agent token, and from then on holds its own certificate. A
/// node with another CA's certificate does not send the token to the controller; an agent
/// given a plaintext controller without `--insecure` refuses to start.
#[test]
fn a_node_joins_with_the_agent_token_and_the_ca_and_not_otherwise() {
    let c = start("tlsjoin", 1, 3600);
    let ca_file = c.dir.path().join("controller").join("ca.pem");
    let agent_token = c.dir.path().join("agent.token");
    let agent = |node: &str, ca: &Path, url: &str| -> Vec<String> {
        vec![
            s("--ca-file"),
            ca.display().to_string(),
            s("agent"),
            s("--node"),
            s(node),
            s("--controller"),
            s(url),
            s("--token-file"),
            agent_token.display().to_string(),
            s("--data-dir"),
            c.dir.path().join(node).display().to_string(),
            s("--admin-listen"),
            format!("127.0.0.1:{}", free_port()),
            s("--replica-listen"),
            format!("127.0.0.1:{}", free_port()),
            s("--nbd-listen"),
            s("none"),
        ]
    };
    let online = |node: &str| {
        wait_until(&format!("{node} online"), Duration::from_secs(30), || {
            let v = c.admin_call(reqwest::Method::GET, "/v1/nodes", None);
            v.as_array().is_some_and(|a| {
                a.iter()
                    .any(|n| n["name"] == json!(node) && n["state"] == json!("online"))
            })
        });
    };
    let n2 = spawn(c.dir.path(), "n2", &agent("n2", &ca_file, &c.url));
    online("n2");
    let creds = node_creds(&c.dir.path().join("n2"));
    assert_eq!(
        CertSlot::new(&creds).expect("n2's certificate").peer(),
        Peer::Node("n2".into())
    );

    // Another CA: the controller's certificate is not trusted, the token never sent.
    let other = hawser_tls::Ca::generate("other").expect("another CA");
    let other_file = c.dir.path().join("other-ca.pem");
    std::fs::write(&other_file, other.cert_pem()).expect("write the other CA");
    let mut n3 = spawn(c.dir.path(), "n3", &agent("n3", &other_file, &c.url));
    let log = exits_with_log(c.dir.path(), "n3", &mut n3);
    assert!(log.contains("join the cluster"), "{log}");
    assert!(!c.dir.path().join("n3/tls/node.pem").exists());

    // A plaintext controller URL without --insecure.
    let plain = c.url.replacen("https://", "http://", 1);
    let mut n4 = spawn(c.dir.path(), "n4", &agent("n4", &ca_file, &plain));
    let log = exits_with_log(c.dir.path(), "n4", &mut n4);
    assert!(log.contains("--insecure"), "{log}");
    let nodes = c.admin_call(reqwest::Method::GET, "/v1/nodes", None);
    let names: Vec<&str> = nodes
        .as_array()
        .expect("node list")
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["n1", "n2"], "only the nodes that joined are known");

    // The agent token rotates (no grace): the new token is written for the installer, the
    // old one no longer lets a node join, joined nodes keep working with their certificates.
    let new_token = c.dir.path().join("agent.token.new");
    c.cli(&[
        "cluster",
        "rotate-agent-token",
        "--grace-secs",
        "0",
        "--write",
        &new_token.display().to_string(),
    ]);
    let mut n5 = spawn(c.dir.path(), "n5", &agent("n5", &ca_file, &c.url));
    let log = exits_with_log(c.dir.path(), "n5", &mut n5);
    assert!(log.contains("join token is not valid"), "{log}");
    assert!(!c.dir.path().join("n5/tls/node.pem").exists());
    let with_new = |node: &str| {
        let mut a = agent(node, &ca_file, &c.url);
        let i = a
            .iter()
            .position(|x| x == "--token-file")
            .expect("token flag");
        a[i + 1] = new_token.display().to_string();
        a
    };
    let _n6 = spawn(c.dir.path(), "n6", &with_new("n6"));
    online("n6");
    drop(n2);
    let _n2 = spawn(c.dir.path(), "n2-again", &agent("n2", &ca_file, &c.url));
    let before = c.admin_call(reqwest::Method::GET, "/v1/nodes/n2", None)["last_seen_ms"].clone();
    wait_until("n2 registers again", Duration::from_secs(30), || {
        c.admin_call(reqwest::Method::GET, "/v1/nodes/n2", None)["last_seen_ms"] != before
    });
    assert_eq!(
        std::fs::read_to_string(c.dir.path().join("n2-again.log"))
            .unwrap_or_default()
            .matches("joined")
            .count(),
        0,
        "n2 did not join again"
    );
}

/// Issue 61: an older agent's renewal cut between its two renames left the new key in
/// `node.key`, the old certificate in `node.pem` and the new certificate in `node.new`; that
/// agent refused to start and the node could only join again. The real agent starts with
/// the pair that matches, without joining (its join token is spent), and keeps it whole.
#[test]
fn an_agent_restarted_after_a_renewal_cut_between_key_and_certificate_keeps_the_matching_pair() {
    let mut c = start("tls-cut", 1, 3600);
    let (node, data, _) = c.agents[0].clone();
    let old = node_creds(&data);
    c.procs.truncate(1); // the agent stops (SIGTERM, waited for); the controller stays
    let ctl = c.dir.path().join("controller");
    let read = |f: &str| std::fs::read_to_string(ctl.join(f)).expect("the CA's file");
    let ca = hawser_tls::Ca::from_pem(&read("ca.pem"), &read("ca.key")).expect("the CA");
    let (new, new_key) = ca
        .issue_with_key(&Peer::Node(node.clone()), Duration::from_secs(7200))
        .expect("a renewed certificate");
    // The older build's directory: plain files, the cut's halves.
    let tls = data.join("tls");
    for entry in std::fs::read_dir(&tls).expect("the TLS directory") {
        let path = entry.expect("entry").path();
        if path.file_name() == Some("ca.pem".as_ref()) {
            continue;
        }
        if path.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir_all(&path).expect("remove");
        } else {
            std::fs::remove_file(&path).expect("remove");
        }
    }
    std::fs::write(tls.join("node.key"), &new_key).expect("key");
    std::fs::write(tls.join("node.pem"), &old.chain_pem).expect("old certificate");
    std::fs::write(tls.join("node.new"), &new.chain_pem).expect("new certificate");

    let seen = || c.admin_call(reqwest::Method::GET, "/v1/nodes/n1", None)["last_seen_ms"].clone();
    let before = seen();
    let args = vec![
        s("agent"),
        s("--node"),
        node.clone(),
        s("--controller"),
        c.url.clone(),
        s("--join-token-file"),
        c.dir.path().join("join.token").display().to_string(),
        s("--data-dir"),
        data.display().to_string(),
        s("--admin-listen"),
        format!("127.0.0.1:{}", free_port()),
        s("--replica-listen"),
        format!("127.0.0.1:{}", free_port()),
        s("--nbd-listen"),
        s("none"),
    ];
    let again = spawn(c.dir.path(), "n1-again", &args);
    wait_until("n1 heartbeats again", Duration::from_secs(30), || {
        seen() != before
    });
    let log = std::fs::read_to_string(c.dir.path().join("n1-again.log")).unwrap_or_default();
    assert!(!log.contains("joined"), "it did not join again: {log}");
    assert!(
        log.contains("belong together") && log.contains("node.new"),
        "it says what it kept: {log}"
    );
    // A pair that belongs together is in place: the one kept, or its renewal at once (the
    // certificate made here lacks the names the node is dialled by), which the controller
    // granted to a caller presenting the pair kept. The renewal saves its pair before it
    // logs "renewed", so a pair that is neither the one kept nor logged yet is waited out.
    let agent_log =
        || std::fs::read_to_string(c.dir.path().join("n1-again.log")).unwrap_or_default();
    let load = || {
        hawser_tls::NODE_IDENTITY
            .load(&tls)
            .expect("a pair")
            .expect("a pair")
    };
    wait_until(
        "the kept pair, or its renewal logged",
        Duration::from_secs(30),
        || {
            load().creds.chain_pem == new.chain_pem
                || agent_log().contains("renewed the node's certificate")
        },
    );
    let kept = load();
    let slot = CertSlot::new(&kept.creds).expect("a key that is the certificate's");
    assert_eq!(slot.peer(), Peer::Node(node.clone()));
    assert_eq!(
        std::fs::read_link(tls.join("node.pem")).expect("node.pem is a link now"),
        Path::new("identity/node.pem")
    );
    assert!(!tls.join("node.new").exists(), "the cut's leftover is gone");
    c.procs.push(again);
}
