//! Running commands and waiting for conditions, always with a deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Whether a command is on PATH.
pub fn have(bin: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {bin}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Run a shell command line; returns its output whatever the exit status.
pub fn sh(cmd: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("spawn sh")
}

/// Run a program and require success; returns stdout. Panics with both streams otherwise.
pub fn run_ok(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{prog} {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `qemu-io -f raw URI -c CMD...` (each of `cmds` a qemu-io command, e.g. `write -P 0x42 0
/// 4M`); requires success and returns stdout.
/// Panics unless `fsck.ext4 -n -f` finds `dev` clean (`what` names it in the message).
pub fn assert_fsck_clean(dev: &str, what: &str) {
    let fsck = Command::new("fsck.ext4")
        .args(["-n", "-f", dev])
        .output()
        .expect("run fsck.ext4");
    assert!(
        fsck.status.success(),
        "{what}: fsck -n not clean:\n{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}

pub fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut args = vec!["-f", "raw", uri];
    for c in cmds {
        args.extend(["-c", c]);
    }
    run_ok("qemu-io", &args)
}

/// Poll `cond` every 20 ms until it holds or `timeout` passes (then panic with `what`).
/// Polling a real condition, not sleeping a guessed time, is how these tests synchronise.
pub fn wait_until(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(
        within(timeout, cond),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// Poll `cond` every 20 ms until it holds (true) or `timeout` passes (false): for a state
/// that may rightly never come, where the caller decides what that means.
pub fn within(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// CPU time of process `pid` so far, user and system, in clock ticks (`getconf CLK_TCK`,
/// 100 on Linux); 0 if it is gone.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may hold spaces: utime and stime are 14 and 15.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// Resident memory of process `pid`, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Where test directories go: `HAWSER_TEST_DIR`, else the system temp dir.
pub(crate) fn test_base_dir() -> PathBuf {
    std::env::var_os("HAWSER_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let p = test_base_dir().join(format!("hawser-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create test dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // HAWSER_E2E_KEEP=1 keeps a failed test's directory (every log in full) for a look.
        if std::thread::panicking() && std::env::var_os("HAWSER_E2E_KEEP").is_some() {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
