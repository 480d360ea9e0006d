//! NBD over TCP in a TLS cluster, with real clients (issue 39, acceptance b). The listener
//! requires NBD TLS (STARTTLS) and a client certificate of the cluster's CA, and then opens
//! only the exports that certificate names: `hawser volume client-cert NAME --out DIR`
//! writes one in the layout libnbd and qemu read. qemu-io reads the volume it names and is
//! refused the other; nbdinfo lists only it; a node's certificate, a certificate limited to
//! another node, another CA's, none at all and plaintext open nothing; and the certificate
//! stops working when its TTL ends. Local users keep the unix socket (mode 0600). A
//! certificate names its volume by uid too: it opens nothing of a volume created later under
//! the same name (issue 61, acceptance e).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hawser_e2e::{have, qemu_io, wait_until, Cluster};
use hawser_tls::{Credentials, Peer};

/// A certificate directory as libnbd and qemu (GnuTLS) read it.
fn cert_dir(dir: &Path, ca_pem: &str, creds: &Credentials) {
    std::fs::create_dir_all(dir).expect("make the certificate dir");
    std::fs::write(dir.join("ca-cert.pem"), ca_pem).expect("ca-cert.pem");
    std::fs::write(dir.join("client-cert.pem"), &creds.chain_pem).expect("client-cert.pem");
    std::fs::write(dir.join("client-key.pem"), &creds.key_pem).expect("client-key.pem");
}

fn run(prog: &str, args: &[&str]) -> Output {
    Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {prog}: {e}"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// qemu-io on `export` at `tcp` with the certificates in `dir`, checking the server's
/// certificate and address as libnbd does.
fn qemu(tcp: &str, dir: &Path, export: &str, cmd: &str) -> Output {
    let (host, port) = tcp.rsplit_once(':').expect("host:port");
    run(
        "qemu-io",
        &[
            "--object",
            &format!(
                "tls-creds-x509,id=tls0,dir={},endpoint=client",
                dir.display()
            ),
            "--image-opts",
            &format!(
                "driver=nbd,server.type=inet,server.host={host},server.port={port},\
                 export={export},tls-creds=tls0"
            ),
            "-c",
            cmd,
        ],
    )
}

fn opened(o: &Output) -> bool {
    o.status.success() && !text(o).contains("Pattern verification failed")
}

/// nbdinfo's URI for `export` (empty: the server) with the certificates in `dir`. libnbd
/// checks the server's certificate against the CA in `dir` and the address it dials, which
/// an agent's certificate names (its listen addresses are in it).
fn nbds(tcp: &str, export: &str, dir: &Path) -> String {
    format!("nbds://{tcp}/{export}?tls-certificates={}", dir.display())
}

fn not_after(dir: &Path) -> u64 {
    let pem = std::fs::read_to_string(dir.join("client-cert.pem")).expect("client-cert.pem");
    hawser_tls::not_after_unix(&pem).expect("the certificate's validity")
}

#[test]
fn nbd_over_tcp_opens_only_the_volumes_a_client_certificate_names() {
    for tool in ["nbdinfo", "qemu-io"] {
        if !have(tool) {
            eprintln!("SKIP: {tool} missing (make test installs it)");
            return;
        }
    }
    let c = Cluster::start("nbdtls", 2);
    let secret = c.attached_volume("secret", "8MiB", 2, "n1");
    let other = c.attached_volume("other", "8MiB", 2, "n1");
    qemu_io(&secret, &["write -P 0x6b 0 8M", "flush"]);
    qemu_io(&other, &["write -P 0x4f 0 8M", "flush"]);
    let tcp = c.agent("n1").nbd.clone();
    assert_eq!(
        c.volume("secret").nbd_uri.as_deref(),
        Some(format!("nbds://{tcp}/secret").as_str()),
        "a TLS listener's URI says so"
    );
    let dir = |name: &str| c.dir.path().join(name);
    let arg = |name: &str| dir(name).display().to_string();

    // A client certificate for `secret`, as a user gets one.
    c.cli_ok(&[
        "volume",
        "client-cert",
        "secret",
        "--out",
        &arg("secret-cert"),
    ]);
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir("secret-cert").join("client-key.pem"))
            .expect("the key")
            .permissions(),
    );
    assert_eq!(key_mode & 0o777, 0o600, "the key is the user's only");
    let ok = qemu(&tcp, &dir("secret-cert"), "secret", "read -P 0x6b 0 8M");
    assert!(opened(&ok), "{}", text(&ok));
    let refused = qemu(&tcp, &dir("secret-cert"), "other", "read 0 4k");
    assert!(!refused.status.success(), "{}", text(&refused));
    // nbdinfo: the one export, listed and described; the other refused.
    let info = run("nbdinfo", &[&nbds(&tcp, "secret", &dir("secret-cert"))]);
    assert!(info.status.success(), "{}", text(&info));
    assert!(
        text(&info).contains("export-size: 8388608"),
        "{}",
        text(&info)
    );
    let list = run("nbdinfo", &["--list", &nbds(&tcp, "", &dir("secret-cert"))]);
    assert!(list.status.success(), "{}", text(&list));
    assert!(text(&list).contains("export=\"secret\""), "{}", text(&list));
    assert!(
        !text(&list).contains("other"),
        "listed another volume: {}",
        text(&list)
    );
    let info = run("nbdinfo", &[&nbds(&tcp, "other", &dir("secret-cert"))]);
    assert!(!info.status.success(), "{}", text(&info));

    // Other certificates open nothing: node n1's own (a node is no NBD client), one for
    // `secret` at node n2 only (the volume is at n1), one of another CA.
    let read = |dir: &Path, export: &str| qemu(&tcp, dir, export, "read 0 4k");
    let node_creds = Credentials {
        chain_pem: std::fs::read_to_string(c.agent("n1").data_dir.join("tls/node.pem"))
            .expect("node.pem"),
        key_pem: std::fs::read_to_string(c.agent("n1").data_dir.join("tls/node.key"))
            .expect("node.key"),
    };
    cert_dir(&dir("node-cert"), c.tokens.ca_pem(), &node_creds);
    c.cli_ok(&[
        "volume",
        "client-cert",
        "secret",
        "--node",
        "n2",
        "--out",
        &arg("n2-cert"),
    ]);
    let foreign_ca = hawser_tls::Ca::generate("other").expect("another CA");
    let (issued, key_pem) = foreign_ca
        .issue_with_key(&Peer::Node("n1".into()), hawser_tls::NODE_CERT_LIFETIME)
        .expect("a foreign certificate");
    let foreign = Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    };
    cert_dir(&dir("foreign-cert"), c.tokens.ca_pem(), &foreign);
    for (d, what) in [
        ("node-cert", "node n1's certificate"),
        ("n2-cert", "a certificate for secret at node n2"),
        ("foreign-cert", "another CA's certificate"),
    ] {
        for export in ["secret", "other"] {
            let o = read(&dir(d), export);
            assert!(!o.status.success(), "{what} opened {export}: {}", text(&o));
        }
    }
    let list = run("nbdinfo", &["--list", &nbds(&tcp, "", &dir("node-cert"))]);
    assert!(
        !text(&list).contains("secret"),
        "a node listed: {}",
        text(&list)
    );
    // No certificate, and no TLS: nothing, not even the list.
    let bare = run("nbdinfo", &[&format!("nbds://{tcp}/secret")]);
    assert!(
        !bare.status.success(),
        "no certificate opened: {}",
        text(&bare)
    );
    for uri in [format!("nbd://{tcp}/secret"), format!("nbd://{tcp}")] {
        let plain = run("nbdinfo", &["--list", &uri]);
        assert!(!plain.status.success(), "plaintext: {}", text(&plain));
        assert!(!text(&plain).contains("secret"), "{}", text(&plain));
    }

    // Expiry: a certificate with a 10 s TTL opens the volume, then stops at its end.
    c.cli_ok(&[
        "volume",
        "client-cert",
        "secret",
        "--ttl",
        "10s",
        "--out",
        &arg("short-cert"),
    ]);
    let until = not_after(&dir("short-cert"));
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
    };
    assert!(until <= now() + 10, "the TTL was not applied");
    let ok = qemu(&tcp, &dir("short-cert"), "secret", "read -P 0x6b 0 4k");
    assert!(opened(&ok), "a fresh certificate: {}", text(&ok));
    wait_until("the certificate's end", Duration::from_secs(30), || {
        now() > until + 1
    });
    let expired = qemu(&tcp, &dir("short-cert"), "secret", "read 0 4k");
    assert!(
        !expired.status.success(),
        "an expired certificate: {}",
        text(&expired)
    );

    // Bad requests get clear errors and write nothing.
    c.cli_fails(
        &["volume", "client-cert", "nosuch", "--out", &arg("x")],
        "nosuch",
    );
    c.cli_fails(
        &[
            "volume",
            "client-cert",
            "secret",
            "--node",
            "n9",
            "--out",
            &arg("x"),
        ],
        "n9",
    );
    c.cli_fails(
        &[
            "volume",
            "client-cert",
            "secret",
            "--ttl",
            "31d",
            "--out",
            &arg("x"),
        ],
        "ttl_secs",
    );
    c.cli_fails(
        &[
            "volume",
            "client-cert",
            "secret",
            "--ttl",
            "0",
            "--out",
            &arg("x"),
        ],
        "more than 0",
    );
    assert!(!dir("x").exists(), "a refused request wrote files");

    // Nothing above changed the volumes.
    qemu_io(&secret, &["read -P 0x6b 0 8M"]);
    qemu_io(&other, &["read -P 0x4f 0 8M"]);
}

/// Delete a volume and create another of the same name, attached at the same node: the
/// first volume's certificate opens nothing of it (not listed, not opened), while a
/// certificate issued for the new volume reads the new data.
#[test]
fn a_certificate_of_a_deleted_volume_opens_nothing_of_its_namesake() {
    for tool in ["nbdinfo", "qemu-io"] {
        if !have(tool) {
            eprintln!("SKIP: {tool} missing (make test installs it)");
            return;
        }
    }
    let c = Cluster::start("nbdreuse", 2);
    let first = c.attached_volume("reuse", "8MiB", 2, "n1");
    qemu_io(&first, &["write -P 0x6b 0 8M", "flush"]);
    let first_uid = c.volume("reuse").uid.expect("a new volume has a uid");
    let tcp = c.agent("n1").nbd.clone();
    let dir = |name: &str| c.dir.path().join(name);
    let arg = |name: &str| dir(name).display().to_string();
    c.cli_ok(&["volume", "client-cert", "reuse", "--out", &arg("old-cert")]);
    let ok = qemu(&tcp, &dir("old-cert"), "reuse", "read -P 0x6b 0 8M");
    assert!(opened(&ok), "its own volume: {}", text(&ok));

    c.cli_ok(&["volume", "detach", "reuse"]);
    c.cli_ok(&["volume", "delete", "reuse"]);
    let second = c.attached_volume("reuse", "8MiB", 2, "n1");
    qemu_io(&second, &["write -P 0x21 0 8M", "flush"]);
    let second_uid = c.volume("reuse").uid.expect("a uid");
    assert_ne!(first_uid, second_uid, "a namesake is another volume");

    for cmd in ["read 0 4k", "write -P 0x99 0 4k"] {
        let o = qemu(&tcp, &dir("old-cert"), "reuse", cmd);
        assert!(
            !o.status.success(),
            "the deleted volume's certificate opened its namesake ({cmd}): {}",
            text(&o)
        );
    }
    let list = run("nbdinfo", &["--list", &nbds(&tcp, "", &dir("old-cert"))]);
    assert!(
        !text(&list).contains("reuse"),
        "the deleted volume's certificate lists its namesake: {}",
        text(&list)
    );
    c.cli_ok(&["volume", "client-cert", "reuse", "--out", &arg("new-cert")]);
    let ok = qemu(&tcp, &dir("new-cert"), "reuse", "read -P 0x21 0 8M");
    assert!(opened(&ok), "the new volume's certificate: {}", text(&ok));
}
