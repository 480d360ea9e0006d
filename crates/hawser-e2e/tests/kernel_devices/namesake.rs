//! A kernel device of a deleted volume is never served to its namesake (issue 61, acceptance
//! e). The agent serving a ublk device dies; meanwhile the volume is detached and deleted
//! and another created under its name and attached to the same node, while the restarted
//! agent could not ask the controller (it was down). The old device's record names the old
//! volume's uid, so when the agent gets its answer it fails the device with EIO: the write
//! the application had queued on it never reaches the namesake, which reads as new.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hawser_e2e::fs_app::device_cli;
use hawser_e2e::{Cluster, ClusterOptions};

use super::{sh, Front};

/// How often the restarted agent asks the controller about the device it found: long enough
/// that the test deletes the volume and attaches its namesake before the first answer it can
/// get, which is the order that tells a device taken back by name from one judged by uid.
const CONFIRM_RETRY_SECS: u64 = 60;

/// The old volume's bytes at offset 0, and what the application writes there while the
/// agent is away.
const OLD: u8 = 0x6b;
const QUEUED: u8 = 0x5e;

#[test]
fn a_device_of_a_deleted_volume_is_never_served_to_its_namesake() {
    super::in_guest_with("namesake::inner_namesake", "ublk");
}

#[test]
#[ignore = "runs inside a guest kernel: a_device_of_a_deleted_volume_is_never_served_to_its_namesake starts it"]
fn inner_namesake() {
    hawser_e2e::guest::assert_in_guest();
    let front = Front::from_env();
    let opts = ClusterOptions {
        controller_args: vec!["--node-timeout-secs".into(), "3".into()],
        agent_args: vec![
            "--device-confirm-retry".into(),
            CONFIRM_RETRY_SECS.to_string(),
        ],
        ..ClusterOptions::default()
    };
    let mut c = Cluster::start_with("knbdns", 2, opts);
    c.attached_volume("ns", "64MiB", 2, "n1");
    let old_uid = c.volume("ns").uid.expect("a uid");
    let dev = device_cli(&c, &["attach", "ns", "--frontend", front.0])
        .trim()
        .to_owned();
    fill(&dev, OLD);

    c.kill_agent("n1");
    // The application writes on: the write waits in the kernel for the next agent.
    let mut writer = queued_write(&dev, QUEUED);
    hawser_e2e::wait_until("n1 offline", Duration::from_secs(60), || {
        c.nodes()
            .iter()
            .any(|n| n.name == "n1" && n.state == hawser_api::controller::NodeState::Offline)
    });
    c.cli_ok(&["volume", "detach", "ns"]);
    // The agent comes back while no controller answers: its device waits.
    c.kill_controller(0);
    c.relaunch_agent("n1", &hawser_e2e::cluster::hawser_bin(), false);
    // Its first question found no controller; the next comes CONFIRM_RETRY_SECS later.
    hawser_e2e::wait_until(
        "the agent's first question",
        Duration::from_secs(60),
        || {
            c.log("n1")
                .contains("cannot ask the controller about a device left by the last agent")
        },
    );
    let relaunched = Instant::now();
    c.restart_controller(0);
    c.wait_nodes_online(2);
    c.cli_ok(&["volume", "delete", "ns"]);
    c.attached_volume("ns", "64MiB", 2, "n1");
    let new_uid = c.volume("ns").uid.expect("a uid");
    assert_ne!(old_uid, new_uid);
    let namesake_at = relaunched.elapsed();
    eprintln!("the namesake was attached at n1 {namesake_at:?} after the agent's first question");
    assert!(
        namesake_at < Duration::from_secs(CONFIRM_RETRY_SECS),
        "the namesake was attached after the agent's second question: raise CONFIRM_RETRY_SECS"
    );
    assert!(
        writer.try_wait().expect("the writer").is_none(),
        "the queued write ended before the agent judged its device"
    );

    let mut ended = None;
    hawser_e2e::wait_until(
        "the queued write to end",
        Duration::from_secs(CONFIRM_RETRY_SECS + 120),
        || {
            ended = writer.try_wait().expect("the writer");
            ended.is_some()
        },
    );
    assert!(
        !ended.is_some_and(|s| s.success()),
        "the old device took the write"
    );
    let log = c.log("n1");
    assert!(
        log.contains("is now another volume of the same name"),
        "the agent's reason: {log}"
    );
    let listed = device_cli(&c, &["list", "-o", "json"]);
    assert_eq!(listed.trim(), "[]", "n1 still lists a device");

    // The namesake, through a device of its own: new, holding neither old byte.
    let fresh = device_cli(&c, &["attach", "ns", "--frontend", front.0])
        .trim()
        .to_owned();
    let first = read_mib(&fresh);
    assert!(
        first.iter().all(|&b| b == 0),
        "the namesake holds bytes it was never written: {:?}",
        &first[..16]
    );
    fill(&fresh, OLD);

    // A live device whose volume is detached and deleted under it (no agent restart): the
    // next namesake's attach gets a device of its own, and the old one ends.
    c.cli_ok(&["volume", "detach", "ns"]);
    c.cli_ok(&["volume", "delete", "ns"]);
    c.attached_volume("ns", "64MiB", 2, "n1");
    let third = device_cli(&c, &["attach", "ns", "--frontend", front.0])
        .trim()
        .to_owned();
    // The old device held OLD; the kernel may give the new one the same index.
    assert!(
        read_mib(&third).iter().all(|&b| b == 0),
        "the deleted volume's live device was handed out ({third}, was {fresh})"
    );
    assert!(
        c.log("n1")
            .contains("a device of a deleted volume of the same name: ending it"),
        "the agent did not end the old device"
    );
    device_cli(&c, &["detach", "ns"]);
    eprintln!(
        "REPORT {} namesake: the old device failed with EIO, the namesake reads as new",
        front.0
    );
}

/// Writes 1 MiB of `byte` at offset 0 of `dev`, past the page cache.
fn fill(dev: &str, byte: u8) {
    let done = queued_write(dev, byte).wait().expect("dd");
    assert!(done.success(), "dd to {dev}: {done}");
}

/// [`fill`] in the background: it waits for as long as the device holds its I/O.
fn queued_write(dev: &str, byte: u8) -> Child {
    let path = std::env::temp_dir().join(format!("fill-{byte:02x}"));
    std::fs::write(&path, vec![byte; 1 << 20]).expect("pattern file");
    Command::new("dd")
        .args([
            &format!("if={}", path.display()),
            &format!("of={dev}"),
            "bs=1M",
            "count=1",
            "oflag=direct",
            "status=none",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dd")
}

/// The first MiB of `dev`, past the page cache.
fn read_mib(dev: &str) -> Vec<u8> {
    let path = std::env::temp_dir().join("read-mib");
    sh(
        "dd",
        &[
            &format!("if={dev}"),
            &format!("of={}", path.display()),
            "bs=1M",
            "count=1",
            "iflag=direct",
            "status=none",
        ],
    );
    std::fs::read(&path).expect("read back")
}
