//! Kernel NBD (`/dev/nbdN` over netlink, served by the agent itself) in a real kernel: an
//! application writing through ext4 sees a pause, never an error, while the agent serving the
//! device is `kill -9`ed and started again, or stopped and replaced by a second build (an
//! upgrade), and loses no acknowledged write; and a device whose volume moved to another
//! node while its agent was away is failed with EIO, never served stale; so is one whose volume
//! was deleted and replaced by a namesake (`kernel_devices/namesake.rs`).
//!
//! This machine's kernel has no `nbd` module, so the outer test boots Debian's kernel in QEMU
//! (`scripts/kvm/boot.sh`) and runs the inner one, this same binary, inside it: the whole
//! cluster (controller and two agents) runs in the guest, because the agent that serves a
//! kernel device must live in that kernel.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hawser_e2e::fs_app::{device_cli, verify, App};
use hawser_e2e::{Cluster, ClusterOptions};

#[path = "kernel_devices/namesake.rs"]
mod namesake;

/// The second build the upgrade test replaces the agent with (`make upgrade-build`).
const NEXT_BIN: &str = "HAWSER_NEXT_BIN";
/// Writes acknowledged before the fault, and after the agent is back. Each is a write and an
/// fdatasync through ext4 and two replicas, about 35 ms in the emulated guest: 100 are a
/// history of many blocks and keep writes in flight at the fault (the application never
/// stops writing); 300 cost each of the seven tests that use them up to 14 s more (7 s
/// for the two that stop counting at the fault).
const ACKS_BEFORE: u64 = 100;
const ACKS_AFTER: u64 = 100;

/// The second build of `hawser`, beside the first (`make upgrade-build`, a step of make test).
fn next_bin() -> String {
    let first = hawser_e2e::cluster::hawser_bin();
    let next = first.with_file_name("hawser-next");
    assert!(
        next.exists(),
        "no second build at {}: run `make upgrade-build` (make test does)",
        next.display()
    );
    next.display().to_string()
}

/// Which frontend an inner test drives (`nbd` or `ublk`).
const FRONTEND: &str = "HAWSER_E2E_FRONTEND";

fn in_guest(inner: &str) {
    in_guest_with(inner, "nbd");
}

fn in_guest_with(inner: &str, frontend: &str) {
    hawser_e2e::guest::run_inner_test(inner, &[(NEXT_BIN, &next_bin()), (FRONTEND, frontend)]);
}

/// The frontend under test, inside the guest.
#[derive(Clone, Copy)]
struct Front(&'static str);

impl Front {
    fn from_env() -> Front {
        match std::env::var(FRONTEND).as_deref() {
            Ok("ublk") => Front("ublk"),
            _ => Front("nbd"),
        }
    }
    fn prefix(self) -> &'static str {
        match self.0 {
            "ublk" => "/dev/ublkb",
            _ => "/dev/nbd",
        }
    }
    fn index(self, dev: &str) -> String {
        dev.trim().trim_start_matches(self.prefix()).to_owned()
    }
    /// Whether the kernel still has device `index` configured.
    fn exists(self, index: &str) -> bool {
        match self.0 {
            "ublk" => Path::new(&format!("/sys/class/ublk-char/ublkc{index}")).exists(),
            _ => Path::new(&format!("/sys/block/nbd{index}/pid")).exists(),
        }
    }
}

#[test]
fn ext4_on_kernel_nbd_survives_agent_kill_9() {
    in_guest("inner_agent_kill_9");
}

#[test]
fn ext4_on_kernel_nbd_survives_an_agent_upgrade() {
    in_guest("inner_agent_upgrade");
}

#[test]
fn ext4_on_kernel_nbd_rides_out_a_hung_agent() {
    in_guest("inner_agent_hang");
}

#[test]
fn a_device_whose_volume_moved_away_fails_with_eio_and_the_new_node_has_every_write() {
    in_guest("inner_failed_over");
}

#[test]
fn ext4_on_ublk_survives_agent_kill_9() {
    in_guest_with("inner_agent_kill_9", "ublk");
}

#[test]
fn ext4_on_ublk_survives_an_agent_upgrade() {
    in_guest_with("inner_agent_upgrade", "ublk");
}

#[test]
fn a_ublk_device_whose_volume_moved_away_fails_with_eio_and_the_new_node_has_every_write() {
    in_guest_with("inner_failed_over", "ublk");
}

#[test]
fn stale_ublk_devices_and_records_are_cleaned_at_agent_start() {
    in_guest_with("inner_stale", "ublk");
}

fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "runs inside a guest kernel: ext4_on_kernel_nbd_survives_agent_kill_9 starts it"]
fn inner_agent_kill_9() {
    survives("kill-9", |c| {
        c.kill_agent("n1");
        c.restart_agent_from("n1", &hawser_e2e::cluster::hawser_bin(), false);
    });
}

#[test]
#[ignore = "runs inside a guest kernel: ext4_on_kernel_nbd_survives_an_agent_upgrade starts it"]
fn inner_agent_upgrade() {
    let next = PathBuf::from(std::env::var_os(NEXT_BIN).expect("HAWSER_NEXT_BIN"));
    let version = sh(&next.display().to_string(), &["--version"]);
    assert!(
        version.contains("upgrade-test build"),
        "{next:?} is {version}"
    );
    survives("upgrade", |c| {
        // SIGTERM, as a DaemonSet's rolling update stops the old pod, then the new build.
        c.restart_agent_from("n1", &next, true);
        let pid = c.agent("n1").child.id();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the agent's binary");
        let next = next.canonicalize().expect("the second build's path");
        assert_eq!(exe, next, "n1 does not run the second build");
    });
}

/// The agent hangs (SIGSTOP) longer than the kernel's I/O timeout (5 s): the kernel gives up
/// on the live connection, shuts it down and requeues its requests; once the agent runs
/// again it sees the connection end, hands the kernel a new one, and the requests are served.
#[test]
#[ignore = "runs inside a guest kernel: ext4_on_kernel_nbd_rides_out_a_hung_agent starts it"]
fn inner_agent_hang() {
    survives("hang", |c| {
        c.pause_agent("n1");
        // The fault's length, not a wait for anything: longer than the 5 s I/O timeout.
        std::thread::sleep(Duration::from_secs(8));
        c.resume_agent("n1");
        // The path under test: the agent replaced the connection the kernel gave up on.
        hawser_e2e::wait_until(
            "n1 to replace the connection",
            Duration::from_secs(60),
            || c.log("n1").contains("kernel NBD connection replaced"),
        );
    });
}

/// An application writes through ext4 on n1's kernel device while `restart` takes n1's
/// agent away and brings one back: it sees a pause, no error, and loses nothing it saw
/// acknowledged.
fn survives(what: &str, restart: impl FnOnce(&mut Cluster)) {
    hawser_e2e::guest::assert_in_guest();
    let front = Front::from_env();
    let mut c = Cluster::start("knbd", 2);
    c.attached_volume("kv", "256MiB", 2, "n1");
    let dev = device_cli(&c, &["attach", "kv", "--frontend", front.0]);
    let dev = dev.trim().to_owned();
    assert!(dev.starts_with(front.prefix()), "{dev}");
    eprintln!("volume kv is {dev}");
    sh("mkfs.ext4", &["-q", "-F", &dev]);
    let mnt: PathBuf = c.agent("n1").data_dir.join("../mnt");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let mnt_s = mnt.display().to_string();
    sh("mount", &[&dev, &mnt_s]);
    let file = mnt.join("app.log");

    let app = App::start(&file);
    app.wait_acks(ACKS_BEFORE);
    let before = app.acked();
    let t = Instant::now();
    restart(&mut c);
    eprintln!("agent n1 back ({what}) in {:?}", t.elapsed());
    app.wait_acks(ACKS_AFTER);
    let back = t.elapsed();
    let seen = app.stop();
    eprintln!(
        "REPORT {} {what} pause: longest write+fdatasync {:?}; acknowledged {} before, {} in all; back to {} more within {back:?}",
        front.0, seen.longest, before, seen.acked, ACKS_AFTER
    );
    assert!(seen.errors.is_empty(), "I/O errors: {:?}", seen.errors);
    let listed = device_cli(&c, &["list", "-o", "json"]);
    assert!(
        listed.contains(&dev),
        "device list after the restart: {listed}"
    );

    // Read back through a fresh mount: nothing from the page cache.
    sh("umount", &[&mnt_s]);
    sh("mount", &[&dev, &mnt_s]);
    verify(&file, &seen);
    eprintln!(
        "{} blocks hold their last acknowledged write",
        seen.last.len()
    );
    sh("umount", &[&mnt_s]);

    device_cli(&c, &["detach", "kv"]);
    assert!(
        !front.exists(&front.index(&dev)),
        "{dev} is still configured after detach"
    );
    let listed = device_cli(&c, &["list", "-o", "json"]);
    assert!(!listed.contains(&dev), "device list after detach: {listed}");
}

/// The volume moves to n2 while n1's agent is dead (as an operator, or Kubernetes' failover,
/// would move it). The restarted n1 agent must not serve its old device: the controller says
/// the volume is elsewhere, so the device fails with EIO and the application stops there.
/// n2 has every write the application saw acknowledged.
#[test]
#[ignore = "runs inside a guest kernel: a_device_whose_volume_moved_away_... starts it"]
fn inner_failed_over() {
    hawser_e2e::guest::assert_in_guest();
    let front = Front::from_env();
    let opts = ClusterOptions {
        controller_args: vec!["--node-timeout-secs".into(), "3".into()],
        ..ClusterOptions::default()
    };
    let mut c = Cluster::start_with("knbdfo", 2, opts);
    c.attached_volume("fo", "256MiB", 2, "n1");
    let dev = device_cli(&c, &["attach", "fo", "--frontend", front.0]);
    let dev = dev.trim().to_owned();
    sh("mkfs.ext4", &["-q", "-F", &dev]);
    let mnt: PathBuf = c.agent("n1").data_dir.join("../mnt1");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let mnt_s = mnt.display().to_string();
    sh("mount", &[&dev, &mnt_s]);
    let app = App::start(&mnt.join("app.log"));
    app.wait_acks(ACKS_BEFORE);

    c.kill_agent("n1");
    let t = Instant::now();
    hawser_e2e::wait_until("n1 offline", Duration::from_secs(60), || {
        c.nodes()
            .iter()
            .any(|n| n.name == "n1" && n.state == hawser_api::controller::NodeState::Offline)
    });
    c.cli_ok(&["volume", "detach", "fo"]);
    c.cli_ok(&["volume", "attach", "fo", "--node", "n2"]);
    eprintln!(
        "volume fo moved to n2 {:?} after n1's agent died",
        t.elapsed()
    );
    c.restart_agent_from("n1", &hawser_e2e::cluster::hawser_bin(), false);
    // The old device fails: the application's held write ends with EIO.
    hawser_e2e::wait_until(
        "the application to see EIO",
        Duration::from_secs(120),
        || app.has_errors(),
    );
    let seen = app.stop();
    // The first failure is the device's EIO; ext4 may then turn read-only (EROFS).
    assert!(
        seen.errors
            .first()
            .is_some_and(|e| e.contains("os error 5")),
        "not EIO: {:?}",
        seen.errors
    );
    let listed = device_cli(&c, &["list", "-o", "json"]);
    assert_eq!(listed.trim(), "[]", "n1 still lists a device");
    // The kernel frees the disconnected device once its filesystem is unmounted.
    sh("umount", &[&mnt_s]);
    let index = front.index(&dev);
    let freed = |index: &str| match front.0 {
        "ublk" => !front.exists(index),
        _ => !Path::new(&format!("/sys/block/nbd{index}/backend")).exists(),
    };
    hawser_e2e::wait_until(
        "n1's old device to be freed",
        Duration::from_secs(30),
        || freed(&index),
    );

    // On n2, through a kernel device of its own agent: every acknowledged write.
    let sock2 = c
        .agent("n2")
        .data_dir
        .join("device.sock")
        .display()
        .to_string();
    let bin = hawser_e2e::cluster::hawser_bin().display().to_string();
    let dev2 = sh(
        &bin,
        &[
            "device",
            "attach",
            "fo",
            "--frontend",
            front.0,
            "--socket",
            &sock2,
        ],
    );
    let dev2 = dev2.trim().to_owned();
    let mnt2 = c.agent("n2").data_dir.join("../mnt2");
    std::fs::create_dir_all(&mnt2).expect("mount point");
    let mnt2_s = mnt2.display().to_string();
    sh("mount", &[&dev2, &mnt2_s]);
    verify(&mnt2.join("app.log"), &seen);
    eprintln!(
        "REPORT {} failover: the old device failed with EIO ({} errors), {} acknowledged writes all on n2 ({dev2})",
        front.0,
        seen.errors.len(),
        seen.acked
    );
    sh("umount", &[&mnt2_s]);
    sh(&bin, &["device", "detach", "fo", "--socket", &sock2]);
}

#[test]
fn stale_devices_and_records_are_cleaned_at_agent_start() {
    in_guest("inner_stale");
}

/// What an agent that died at the wrong moment leaves: a device of this node's with no record
/// (it died between CONNECT and writing the record), and a record whose device the kernel no
/// longer has (a reboot). The next agent disconnects the first and drops the second; nothing
/// is leaked, and the next attach works.
#[test]
#[ignore = "runs inside a guest kernel: stale_devices_and_records_are_cleaned_at_agent_start starts it"]
fn inner_stale() {
    hawser_e2e::guest::assert_in_guest();
    let front = Front::from_env();
    let mut c = Cluster::start("knbdstale", 2);
    c.attached_volume("sv", "64MiB", 2, "n1");
    let dev = device_cli(&c, &["attach", "sv", "--frontend", front.0]);
    let index = front.index(&dev);
    assert!(front.exists(&index), "{dev} is not configured");
    let records = c.agent("n1").data_dir.join("devices");
    c.kill_agent("n1");
    std::fs::remove_file(records.join("sv.json")).expect("remove the device's record");
    // A record of a device the kernel does not have.
    std::fs::write(
        records.join("gone.json"),
        format!(
            r#"{{"volume":"gone","frontend":"{}","index":15,"connections":1,"size_bytes":4096}}"#,
            front.0
        ),
    )
    .expect("write a stale record");
    c.restart_agent_from("n1", &hawser_e2e::cluster::hawser_bin(), false);
    hawser_e2e::wait_until(
        "the unrecorded device to be ended",
        Duration::from_secs(60),
        || !front.exists(&index),
    );
    hawser_e2e::wait_until("the stale record to go", Duration::from_secs(60), || {
        !records.join("gone.json").exists()
    });
    let listed = device_cli(&c, &["list", "-o", "json"]);
    assert_eq!(listed.trim(), "[]", "devices after the restart");
    let log = c.log("n1");
    assert!(
        log.contains("a Hawser device without a record; ending it"),
        "{log}"
    );
    // The volume's engine is back (the controller restarts it), and a device can be made again.
    hawser_e2e::wait_until("sv's engine on n1", Duration::from_secs(60), || {
        c.agent_status("n1")
            .engines
            .iter()
            .any(|e| e.volume == "sv")
    });
    let again = device_cli(&c, &["attach", "sv", "--frontend", front.0]);
    assert!(again.trim().starts_with(front.prefix()), "{again}");
    device_cli(&c, &["detach", "sv"]);
    eprintln!("REPORT {} stale: an unrecorded device was ended and a record without a device dropped at agent start", front.0);
}

#[test]
fn auto_falls_back_to_kernel_nbd_when_ublk_is_missing() {
    in_guest("inner_fallback");
}

/// `sh` for a command that must fail: its stderr.
fn sh_fails(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(!out.status.success(), "{cmd} {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `ublk_drv` module missing: asking for ublk by name is a clear error, and `auto` falls
/// back to kernel NBD, saying why in the agent's log and in a warning event of the volume
/// (a Kubernetes Event on its PVC, where there is one). No device is left behind.
/// (The other refusal, the kernel's ublk device limit, cannot be reached here: on Linux 6.12
/// `ublks_max` counts only unprivileged devices, and the agent's are privileged.)
#[test]
#[ignore = "runs inside a guest kernel: auto_falls_back_to_kernel_nbd_when_ublk_is_missing starts it"]
fn inner_fallback() {
    hawser_e2e::guest::assert_in_guest();
    let c = Cluster::start("kfb", 2);
    c.attached_volume("fb", "64MiB", 2, "n1");
    let sock = c
        .agent("n1")
        .data_dir
        .join("device.sock")
        .display()
        .to_string();
    let bin = hawser_e2e::cluster::hawser_bin().display().to_string();
    let attach = |frontend: &str| -> Vec<String> {
        [
            "device",
            "attach",
            "fb",
            "--frontend",
            frontend,
            "--socket",
            &sock,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let args = |v: &[String]| -> Vec<String> { v.to_vec() };
    let run_ok = |v: Vec<String>| sh(&bin, &v.iter().map(String::as_str).collect::<Vec<_>>());
    let run_fail =
        |v: Vec<String>| sh_fails(&bin, &v.iter().map(String::as_str).collect::<Vec<_>>());
    let no_ublk_left = || {
        let left: Vec<_> = std::fs::read_dir("/sys/class/ublk-char")
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "ublk devices left: {left:?}");
    };

    // The module missing: not loaded, and its file unreadable as a module.
    let _ = Command::new("rmmod").arg("ublk_drv").status();
    let ko = sh("modinfo", &["-n", "ublk_drv"]).trim().to_owned();
    sh("mount", &["--bind", "/dev/null", &ko]);
    let err = run_fail(args(&attach("ublk")));
    assert!(err.contains("the kernel has no ublk_drv module"), "{err}");
    no_ublk_left();
    let dev = run_ok(args(&attach("auto")));
    assert!(dev.trim().starts_with("/dev/nbd"), "auto gave {dev}");
    assert!(
        c.log("n1")
            .contains("kernel frontend unavailable; trying the next"),
        "no fallback warning in n1's log"
    );
    // The fallback is a warning event of the volume (on its PVC, on Kubernetes).
    hawser_e2e::wait_until(
        "the FrontendFallback event",
        Duration::from_secs(30),
        || {
            c.cli_ok(&["events", "--volume", "fb", "--warnings"])
                .contains("FrontendFallback")
        },
    );
    sh(&bin, &["device", "detach", "fb", "--socket", &sock]);
    sh("umount", &[&ko]);
    eprintln!(
        "REPORT fallback: without ublk_drv, ublk is refused ({}) and auto gives {}",
        err.trim(),
        dev.trim()
    );
    let listed = device_cli(&c, &["list", "-o", "json"]);
    assert_eq!(listed.trim(), "[]", "devices left");
}
