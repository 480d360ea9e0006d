//! The real-kernel guest (`scripts/kvm/boot.sh`, prepared by `make kvm-kernel`) works: the
//! kernel frontends' modules load, a loop device takes an ext4 filesystem that keeps what was
//! written across a remount, the environment given reaches the command, and the command's
//! exit status comes back; a command under the host's /tmp runs there too.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use hawser_e2e::guest::{boot_script, run_in_guest, REFUSED};

#[test]
fn guest_loads_nbd_and_ublk_and_mounts_ext4() {
    // Unique per run, and the marker below is put together in the guest, so it can only come
    // from a command that ran to its end.
    let nonce = format!("{}-{}", std::process::id(), rand::random::<u32>());
    let script = r#"set -euo pipefail
trap 'echo "guest command failed: $BASH_COMMAND" >&2' ERR
modprobe nbd
modprobe ublk_drv
test -e /dev/nbd0
test -e /dev/ublk-control
truncate -s 64M /tmp/disk.img
dev=$(losetup --find --show /tmp/disk.img)
mkfs.ext4 -q "$dev"
mkdir -p /mnt/guest
mount "$dev" /mnt/guest
echo "$GUEST_NONCE" >/mnt/guest/file
umount /mnt/guest
# A remount reads the file back from the loop device, not from the page cache.
echo 3 >/proc/sys/vm/drop_caches
mount "$dev" /mnt/guest
test "$(cat /mnt/guest/file)" = "$GUEST_NONCE"
umount /mnt/guest
losetup -d "$dev"
echo "guest-kernel-$GUEST_NONCE-done"
"#;
    let run = run_in_guest("guest_kernel", script, &[("GUEST_NONCE", &nonce)]);
    assert!(
        run.success(),
        "the guest command failed (status {}):\n{}\n{}",
        run.status,
        run.output,
        run.log
    );
    let marker = format!("guest-kernel-{nonce}-done");
    assert!(
        run.output.lines().any(|l| l == marker),
        "no line {marker} in the guest's output:\n{}",
        run.output
    );

    // A failing command's status comes back as it is.
    let run = run_in_guest("guest_kernel_exit", "exit 7", &[]);
    assert_eq!(run.status, 7, "{}\n{}", run.output, run.log);
}

/// The guest's /tmp is a fresh tmpfs, so a checkout or a build under the host's /tmp (where
/// scripts/fresh-test.sh and many clones put it) was invisible there: the command was "No
/// such file or directory", exit 127. `run_in_guest` shares what the command names (here
/// through an environment variable), and the guest sees it at the same path, spaces and all.
#[test]
fn a_command_under_a_tmp_directory_whose_name_has_a_space_runs_in_the_guest() {
    // /tmp itself, not temp_dir(): the guest's /tmp is the case.
    let dir = PathBuf::from(format!("/tmp/hawser guest path {}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the directory");
    let script = dir.join("say it.sh");
    std::fs::write(
        &script,
        "#!/bin/bash\nset -euo pipefail\n\
         echo written >\"$(dirname \"$0\")/written in the guest\"\n\
         echo \"ran in $PWD with $1\"\n",
    )
    .expect("write the script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let nonce = format!("{}-{}", std::process::id(), rand::random::<u32>());
    let run = run_in_guest(
        "guest_path",
        &format!("cd \"$GUEST_DIR\" && \"./say it.sh\" {nonce}"),
        &[("GUEST_DIR", &dir.display().to_string())],
    );
    let written = dir.join("written in the guest").exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        run.success(),
        "the command under {} did not run (status {}):\n{}\n{}",
        dir.display(),
        run.status,
        run.output,
        run.log
    );
    let marker = format!("ran in {} with {nonce}", dir.display());
    assert!(
        run.output.lines().any(|l| l == marker),
        "no line {marker:?} in the guest's output:\n{}",
        run.output
    );
    // Writable in the guest, as the rest of the host's files are, and thrown away with it.
    assert!(
        !written,
        "the guest's write reached the host's {}",
        dir.display()
    );
}

/// A path the guest cannot show is refused before a boot, with the path and the reason, not
/// found missing by the command after one ("No such file or directory", exit 127).
#[test]
fn a_path_the_guest_cannot_show_is_refused_before_boot_naming_it() {
    let missing = format!("/tmp/hawser guest path missing {}", std::process::id());
    for (path, why) in [
        (missing.as_str(), "it does not exist on this machine"),
        ("/sys/kernel", "the guest mounts its own /sys there"),
    ] {
        let out = Command::new("bash")
            .arg(boot_script())
            .args(["--share", path, "--", "true"])
            .output()
            .expect("run boot.sh");
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(REFUSED), "--share {path}: {log}");
        let message = format!("cannot show {path} in the guest: {why}");
        assert!(
            log.contains(&message),
            "no {message:?} in boot.sh's log: {log}"
        );
        assert!(
            !log.contains("TCG"),
            "--share {path}: it booted a guest: {log}"
        );
    }
}
