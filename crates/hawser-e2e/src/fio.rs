//! fio with verification against a volume's NBD export: random 4k-64k writes, each block
//! read back and checked (crc32c) while writing goes on, and the run fails at the first
//! block that does not read back as written (or any I/O error).

use std::process::{Child, Command, Stdio};

/// Starts fio's NBD engine on `uri`, writing and verifying `[offset, offset+size)` for
/// `secs` (or until [`interrupted_passed`] stops it).
pub fn verify(name: &str, uri: &str, offset: &str, size: &str, secs: u32) -> Child {
    Command::new("fio")
        .args([
            &format!("--name={name}"),
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bsrange=4k-64k",
            &format!("--offset={offset}"),
            &format!("--size={size}"),
            "--iodepth=8",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_backlog=64",
            "--randrepeat=0",
            "--verify_state_save=0",
            "--time_based",
            &format!("--runtime={secs}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fio")
}

/// Waits for fio and requires a clean run: exit 0 and no error.
pub fn passed(fio: Child) {
    check(fio, &[0]);
}

/// Requires fio to be still running (it saw everything up to now), stops it with SIGINT
/// (fio then finishes its verification and reports), and requires a clean run. fio exits
/// with 128 when a signal ended it, even when nothing failed; its report says whether
/// anything did.
pub fn interrupted_passed(mut fio: Child) {
    if let Some(status) = fio.try_wait().expect("poll fio") {
        let out = fio.wait_with_output().expect("fio output");
        panic!(
            "fio ended ({status}) before the part of the test it was to run through:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    crate::cluster::signal(&fio, libc::SIGINT);
    check(fio, &[0, 128]);
}

/// Requires an exit code in `codes`, a report, and no job with an error.
fn check(fio: Child, codes: &[i32]) {
    let out = fio.wait_with_output().expect("wait for fio");
    let text = String::from_utf8_lossy(&out.stdout);
    let clean =
        text.contains("err= 0") && text.matches("err=").count() == text.matches("err= 0").count();
    assert!(
        out.status.code().is_some_and(|c| codes.contains(&c)) && clean,
        "fio verify failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let verified = text.lines().find(|l| l.contains("WRITE:")).unwrap_or("");
    eprintln!("fio verify passed: {}", verified.trim());
}
