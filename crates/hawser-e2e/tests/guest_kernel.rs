//! The real-kernel guest (`scripts/kvm/boot.sh`, prepared by `make kvm-kernel`) works: the
//! kernel frontends' modules load, a loop device takes an ext4 filesystem that keeps what was
//! written across a remount, the environment given reaches the command, and the command's
//! exit status comes back.

use hawser_e2e::guest::run_in_guest;

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
