//! The agent's node-local device API (`<data-dir>/device.sock`), through the socket the real
//! agent binds: who may use it, and the clear errors of bad requests. What it makes (kernel
//! devices) is tested in a real kernel by `kernel_nbd.rs`; this machine's kernel has no
//! `nbd` module, which is itself a case here.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Output};

use hawser_e2e::cluster::hawser_bin;
use hawser_e2e::Cluster;

fn device(c: &Cluster, args: &[&str]) -> Output {
    let sock = c.agent("n1").data_dir.join("device.sock");
    Command::new(hawser_bin())
        .arg("device")
        .args(args)
        .arg("--socket")
        .arg(&sock)
        .output()
        .expect("run hawser device")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn device_api_is_local_to_the_agents_user_and_says_what_is_wrong() {
    let c = Cluster::start("devapi", 2);
    let sock = c.agent("n1").data_dir.join("device.sock");
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "device.sock mode {mode:o}");

    // Another user brings nothing the socket accepts: refused before any request.
    let other = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(hawser_bin())
        .args(["device", "list", "--socket"])
        .arg(&sock)
        .output()
        .expect("run setpriv");
    assert!(!other.status.success(), "another user listed devices");
    assert!(
        stderr(&other).contains("Permission denied"),
        "{}",
        stderr(&other)
    );

    // Nothing attached yet: an empty list.
    let list = device(&c, &["list", "-o", "json"]);
    assert!(list.status.success(), "{}", stderr(&list));
    assert_eq!(String::from_utf8_lossy(&list.stdout).trim(), "[]");

    // A volume whose engine does not run on this node.
    c.cli_ok(&[
        "volume",
        "create",
        "elsewhere",
        "--size",
        "64MiB",
        "--replicas",
        "2",
    ]);
    let o = device(&c, &["attach", "elsewhere"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("volume elsewhere has no engine on this node"),
        "{}",
        stderr(&o)
    );
    let o = device(&c, &["attach", "nosuch"]);
    assert!(
        stderr(&o).contains("volume nosuch has no engine"),
        "{}",
        stderr(&o)
    );
    // Bad names and frontends are refused with the reason.
    let o = device(&c, &["attach", "../etc"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("400"), "{}", stderr(&o));
    c.attached_volume("here", "64MiB", 2, "n1");
    let o = device(&c, &["attach", "here", "--frontend", "floppy"]);
    assert!(
        stderr(&o).contains("unknown frontend \"floppy\""),
        "{}",
        stderr(&o)
    );
    // This machine's kernel has no nbd module: a clear error, and no record left behind.
    let o = device(&c, &["attach", "here", "--frontend", "nbd"]);
    if !std::path::Path::new("/sys/module/nbd").exists() {
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("no kernel frontend on this node: the kernel has no nbd module"),
            "{}",
            stderr(&o)
        );
        let records = c.agent("n1").data_dir.join("devices");
        let left = std::fs::read_dir(&records).map(|d| d.count()).unwrap_or(0);
        assert_eq!(left, 0, "a record was left in {}", records.display());
    }
    let o = device(&c, &["detach", "here"]);
    assert!(
        stderr(&o).contains("volume here has no kernel device on this node"),
        "{}",
        stderr(&o)
    );

    // Garbage on the socket: an HTTP error or a closed connection, and the agent serves on.
    let mut s = UnixStream::connect(&sock).expect("connect");
    s.write_all(b"\x16\x03\x01\x00\xffnot http at all\r\n\r\n")
        .expect("send garbage");
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || text.starts_with("HTTP/1.1 400"),
        "answer to garbage: {text}"
    );
    let list = device(&c, &["list"]);
    assert!(list.status.success(), "after garbage: {}", stderr(&list));
}
