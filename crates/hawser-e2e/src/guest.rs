//! Commands in a real Linux kernel: Debian trixie's 6.12 booted in QEMU (TCG) by
//! `scripts/kvm/boot.sh`, for what this machine's own kernel lacks (the `nbd` and `ublk_drv`
//! modules). The guest sees this machine's root filesystem (read-only, under a tmpfs
//! overlay), so the hawser binary and the Debian tools run there unchanged; the host's
//! 127.0.0.1 is 10.0.2.2 in it. `make kvm-kernel` (a step of `make test`) prepares the kernel.
//! Its /tmp is its own: what a command needs from under the host's /tmp (a checkout, a build,
//! a file an environment variable names) `boot.sh` shares back at the same path.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// What `boot.sh` exits with when the guest never reported the command's status (timeout,
/// kernel panic, qemu killed).
pub const NO_REPORT: i32 = 125;

/// What `boot.sh` exits with when the guest cannot show a path the command needs (its log
/// says which and why): the command did not run.
pub const REFUSED: i32 = 4;

/// One command's run in a guest.
#[derive(Debug)]
pub struct GuestRun {
    /// The command's exit status in the guest, or [`NO_REPORT`].
    pub status: i32,
    /// The guest's serial console, without carriage returns: the command's stdout and
    /// stderr, and kernel messages of KERN_ERR and worse (e.g. `nbd0: Connection timed out`).
    pub output: String,
    /// `boot.sh`'s own messages (its stderr).
    pub log: String,
    /// From the start of `boot.sh` to its end: boot, command and power-off.
    pub elapsed: Duration,
}

impl GuestRun {
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// This checkout: the guest sees it at the same path, wherever it is (`boot.sh --share`).
fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `scripts/kvm/boot.sh` in this checkout.
pub fn boot_script() -> PathBuf {
    checkout().join("scripts/kvm").join("boot.sh")
}

/// `s` as one word of a bash command, whatever it holds (spaces, quotes, `$`).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `command` with bash in a new guest, with `env` exported to it (the guest starts
/// from an empty environment: HOME, TERM and PATH only), in this process's working
/// directory. The guest sees this checkout, the working directory and each file or directory
/// an `env` value names at the same paths as here, even under /tmp (`boot.sh` shares them;
/// it refuses, [`REFUSED`], a working directory the guest cannot show). Prints the guest's
/// output as it comes, each line prefixed with `[name]`, and returns it with the exit status.
/// `HAWSER_KVM_TIMEOUT` (900 s), `HAWSER_KVM_MEM` (2G) and `HAWSER_KVM_CPUS` (1) reach
/// `boot.sh`. Panics when the guest kernel is not prepared.
pub fn run_in_guest(name: &str, command: &str, env: &[(&str, &str)]) -> GuestRun {
    run_sharing(name, command, env, &[])
}

/// [`run_in_guest`], with the guest shown `shares` too.
fn run_sharing(name: &str, command: &str, env: &[(&str, &str)], shares: &[&Path]) -> GuestRun {
    let script = boot_script();
    // boot.sh never prepares the kernel (that downloads): say at once which step does.
    let check = Command::new("bash")
        .arg(&script)
        .arg("--check")
        .output()
        .unwrap_or_else(|e| panic!("run {} --check: {e}", script.display()));
    assert!(
        check.status.success(),
        "no prepared guest kernel: run `make kvm-kernel` (make test does). {}",
        String::from_utf8_lossy(&check.stderr).trim()
    );

    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    // Every guest test ends within a minute or two; a hung one (an application in D state on
    // a device nobody serves) is cut at 5 minutes, not boot.sh's 15.
    if std::env::var_os("HAWSER_KVM_TIMEOUT").is_none() {
        cmd.env("HAWSER_KVM_TIMEOUT", "300");
    }
    for (k, v) in env {
        cmd.arg("--env").arg(format!("{k}={v}"));
    }
    for path in [checkout().as_path()].iter().chain(shares) {
        cmd.arg("--share").arg(path);
    }
    cmd.arg("--")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", script.display()));
    let out = echo_lines(name, child.stdout.take().expect("stdout"));
    let log = echo_lines(name, child.stderr.take().expect("stderr"));
    let status = child.wait().expect("wait for boot.sh");
    let elapsed = start.elapsed();
    let output = out.join().expect("stdout reader");
    let log = log.join().expect("stderr reader");
    // boot.sh exits with the guest's status; a signal (no code) counts as no report.
    let status = status.code().unwrap_or(NO_REPORT);
    println!("[{name}] guest exit status {status} after {elapsed:.1?}");
    GuestRun {
        status,
        output,
        log,
        elapsed,
    }
}

/// Prints each line of `stream` as it comes, prefixed with `[name]`, and returns them all.
fn echo_lines(name: &str, stream: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    let name = name.to_string();
    thread::spawn(move || {
        let mut all = String::new();
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // The serial console ends lines with \r\n; the kernel's and the command's bytes
            // need not be UTF-8.
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']).replace('\r', "");
            println!("[{name}] {line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    })
}

/// Set by [`run_inner_test`] in the guest; an inner test refuses to run without it (it loads
/// modules and makes block devices: [`assert_in_guest`]).
pub const IN_GUEST: &str = "HAWSER_E2E_IN_GUEST";

/// Runs `inner`, an ignored test of the calling test binary, in a new guest (`--exact`,
/// `--include-ignored`), with [`IN_GUEST`], `HAWSER_BIN` (this process's
/// [`hawser_bin`](crate::cluster::hawser_bin)) and `env` set, and asserts that it passed.
/// The guest sees the test binary and `HAWSER_BIN` at their paths here, wherever they are.
/// Its lines with `REPORT ` (what it measured) go to the real stderr, past the test
/// harness's capture, so `make test`'s log shows them on success too.
pub fn run_inner_test(inner: &str, env: &[(&str, &str)]) -> GuestRun {
    let exe = std::env::current_exe().expect("the test binary");
    let bin = std::path::absolute(crate::cluster::hawser_bin()).expect("HAWSER_BIN's path");
    let bin = bin.display().to_string();
    let mut all = vec![(IN_GUEST, "1"), ("HAWSER_BIN", bin.as_str())];
    all.extend_from_slice(env);
    let command = format!(
        "{} --exact {inner} --include-ignored --nocapture --test-threads=1",
        shell_quote(&exe.display().to_string())
    );
    let run = run_sharing(inner, &command, &all, &[&exe]);
    assert!(
        run.output.contains("test result: ok. 1 passed") && run.output.contains("REPORT "),
        "{inner} did not pass in the guest (exit {}): {}",
        run.status,
        run.log.trim()
    );
    assert_eq!(run.status, 0, "{inner}: the guest's exit status");
    use std::io::Write as _;
    for line in run.output.lines().filter(|l| l.contains("REPORT ")) {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
    run
}

/// Panics unless this process runs in a guest started by [`run_inner_test`].
pub fn assert_in_guest() {
    assert!(
        std::env::var_os(IN_GUEST).is_some(),
        "this test loads kernel modules and makes block devices: its outer test runs it in a guest"
    );
}

#[cfg(test)]
mod tests {
    use super::shell_quote;

    #[test]
    fn a_quoted_word_reaches_bash_unchanged() {
        let word = "/tmp/a b/it's \"$HOME\" `x` \\ \n*";
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("printf %s {}", shell_quote(word)))
            .output()
            .expect("run bash");
        assert_eq!(String::from_utf8_lossy(&out.stdout), word);
    }
}
