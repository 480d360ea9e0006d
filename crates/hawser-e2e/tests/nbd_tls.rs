//! "Secure by default", acceptance a, NBD half: in a TLS cluster an agent's NBD TCP listener
//! requires NBD TLS (STARTTLS) with a certificate of the cluster's CA, on loopback too.
//! Real clients show it: without TLS `nbdinfo` gets neither an export nor the export list;
//! with another CA's certificate the TLS handshake fails (`nbdinfo`, `qemu-io`); with a
//! certificate of the cluster `qemu-io` reads the volume's data. Local users without a
//! certificate have the unix socket (mode 0600).

use std::path::Path;
use std::process::{Command, Output};

use hawser_e2e::{have, qemu_io, Cluster};
use hawser_tls::{Credentials, Peer};

/// A certificate directory as libnbd (GnuTLS) reads it.
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

#[test]
fn nbd_over_tcp_needs_a_certificate_of_the_cluster() {
    if !have("nbdinfo") || !have("qemu-io") {
        eprintln!("SKIP: nbdinfo or qemu-io missing (make test installs them)");
        return;
    }
    let c = Cluster::start("nbdtls", 2);
    let unix = c.attached_volume("secret", "8MiB", 2, "n1");
    qemu_io(&unix, &["write -P 0x6b 0 8M", "flush"]);
    let v = c.volume("secret");
    let tcp = c.agent("n1").nbd.clone();
    assert_eq!(
        v.nbd_uri.as_deref(),
        Some(format!("nbds://{tcp}/secret").as_str()),
        "a TLS listener's URI says so"
    );

    // No TLS: no export, and no list of them.
    let plain = run("nbdinfo", &[&format!("nbd://{tcp}/secret")]);
    assert!(
        !plain.status.success(),
        "plaintext opened: {}",
        text(&plain)
    );
    let list = run("nbdinfo", &["--list", &format!("nbd://{tcp}")]);
    assert!(!list.status.success(), "plaintext listed: {}", text(&list));
    assert!(!text(&list).contains("secret"), "{}", text(&list));

    // A certificate of another CA: no handshake.
    let other = hawser_tls::Ca::generate("other").expect("another CA");
    let (issued, key_pem) = other
        .issue_with_key(&Peer::Node("n1".into()), hawser_tls::NODE_CERT_LIFETIME)
        .expect("a foreign certificate");
    let foreign = c.dir.path().join("foreign-certs");
    cert_dir(
        &foreign,
        c.tokens.ca_pem(),
        &Credentials {
            chain_pem: issued.chain_pem,
            key_pem,
        },
    );
    let uri = |dir: &Path| {
        format!(
            "nbds://{tcp}/secret?tls-certificates={}&tls-verify-peer=false",
            dir.display()
        )
    };
    let refused = run("nbdinfo", &[&uri(&foreign)]);
    assert!(
        !refused.status.success(),
        "another CA's certificate opened: {}",
        text(&refused)
    );

    // A certificate of the cluster (here a controller's): the data, byte for byte. (qemu's
    // client, which can skip checking the server's name: the certificates name principals,
    // not addresses, and libnbd 1.14 checks the URI's host.)
    let ours = c.dir.path().join("cluster-certs");
    cert_dir(
        &ours,
        c.tokens.ca_pem(),
        &c.tokens.credentials(&Peer::Controller),
    );
    let (host, port) = tcp.rsplit_once(':').expect("host:port");
    let qemu = |dir: &Path, cmd: &str| {
        run(
            "qemu-io",
            &[
                "--object",
                &format!(
                    "tls-creds-x509,id=tls0,dir={},endpoint=client,verify-peer=off",
                    dir.display()
                ),
                "--image-opts",
                &format!(
                    "driver=nbd,server.type=inet,server.host={host},server.port={port},\
                     export=secret,tls-creds=tls0"
                ),
                "-c",
                cmd,
            ],
        )
    };
    let read = qemu(&ours, "read -P 0x6b 0 8M");
    assert!(read.status.success(), "{}", text(&read));
    assert!(
        !text(&read).contains("Pattern verification failed"),
        "{}",
        text(&read)
    );
    // The same client with the foreign certificate is refused.
    let refused = qemu(&foreign, "read 0 4k");
    assert!(!refused.status.success(), "{}", text(&refused));
}
