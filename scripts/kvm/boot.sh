#!/usr/bin/env bash
# Runs a command in a throwaway QEMU guest that boots Debian trixie's packaged kernel (6.12),
# for the tests that need what this machine's own kernel lacks (the nbd and ublk_drv
# modules). The guest sees this machine's root filesystem, so the hawser binary, mkfs, fio and
# nbd-client run there unchanged. Learned from the company recipe in /work/shared/kvm.
#
#   scripts/kvm/boot.sh --prepare      fetch the kernel and build the initramfs (make kvm-kernel)
#   scripts/kvm/boot.sh --check        exit 0 when prepared, else say how (exit 3)
#   scripts/kvm/boot.sh [--env NAME=VALUE]... [--share PATH]... [--] 'COMMAND'
#                                      run COMMAND with bash in the guest; exit with its status
#   scripts/kvm/boot.sh [--share PATH]... -i
#                                      an interactive shell on the serial console (Ctrl-A X quits)
#
# COMMAND is a bash script: `boot.sh 'VAR=x cmd; other'` works, and `--env NAME=VALUE` exports
# NAME to all of it (the guest starts from an empty environment: HOME, TERM and PATH only). It
# starts in the caller's working directory. Its stdout and stderr are the guest's serial
# console, which is this script's stdout; kernel messages of KERN_ERR and worse show there too
# (loglevel=4, `nbd0: Connection timed out` is one), quieter ones do not. Exit status 125: the
# guest never reported one (timeout, kernel panic, qemu killed). Exit status 4: refused before
# the command, because the guest cannot show a path it needs (the message says which and why).
#
# In the guest: the host's root read-only over 9p under a tmpfs overlay (writes are thrown
# away); every module of the guest kernel for modprobe (the host's kmod); /job, a writable
# share of a host directory that carries the command in and its exit status out; the host's
# 127.0.0.1 is 10.0.2.2 (QEMU user networking). No udev: poll for device nodes. The 9p share
# caches (cache=loose): start a new guest after a rebuild.
#
# /tmp, /run and /dev/shm are fresh tmpfs: there the host has sockets, other tests' port
# claims (/tmp/hawser-test-ports-UID; the guest's ports are its own) and files that change
# while the guest runs (an overlay does not allow that of its lower layer), all at 9p's speed.
# What the command needs from under them is bound back at the same path (from the overlay:
# writable, writes thrown away), so a checkout or a build under /tmp runs too: the working
# directory, each --share PATH, and each --env VALUE that names a file or directory here.
# Refused at once (exit 4), naming it: a working directory or --share PATH that does not
# exist, or lies where the guest has its own (/proc, /sys, /dev but /dev/shm, /job, the whole
# of /tmp, /run or /dev/shm). An --env VALUE there is left to the guest's own.
#
# Settings: HAWSER_KVM_CACHE (~/.cache/hawser-kvm), HAWSER_KVM_MEM (2G), HAWSER_KVM_CPUS (1),
# HAWSER_KVM_TIMEOUT (900 s), HAWSER_KVM_APPEND (more kernel arguments), HAWSER_KVM_MIRROR (the
# Debian mirror; default the first of this machine's apt sources).
set -euo pipefail

CACHE=${HAWSER_KVM_CACHE:-$HOME/.cache/hawser-kvm}
MEM=${HAWSER_KVM_MEM:-2G}
# One vCPU. Two, on two host threads (multi-threaded TCG), ran two busy guest processes in
# 5-6.6 s instead of 8.8-10 s, but the kernel then sometimes dies early in boot with an
# "Oops: int3" in code it was patching (jump labels: text_poke_bp's int3 seen by the other
# vCPU after the patch was done; seen in one boot of the tests on 2026-11-28). A test must
# not fail on that, so one vCPU unless asked.
CPUS=${HAWSER_KVM_CPUS:-1}
TIMEOUT=${HAWSER_KVM_TIMEOUT:-900}
KERNEL=$CACHE/kernel
# The modules the initramfs loads to reach the host: the rest come from the shared tree.
INITRD_MODULES="9pnet_virtio 9p overlay virtio_net"

log() { echo "boot.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# The host commands this script runs that are not in Debian's required packages come from
# make deps (APT_PACKAGES); a missing one means deps did not run.
need_commands() {
  local c missing=""
  for c in qemu-system-x86_64 busybox cpio xz gzip depmod modprobe apt-get dpkg-deb; do command -v "$c" >/dev/null || missing="$missing $c"; done
  [ -z "$missing" ] || die "missing:$missing: run \`make deps\` (make kvm-kernel and make test do)"
}

# PID 1 of the guest, a busybox sh script. The initramfs's name carries a hash of it, so a
# changed script is never booted with an old initramfs.
init_script() {
  cat <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in $(cat /mods/order); do insmod "/mods/$m" || echo "hawser-kvm: insmod $m failed"; done
KVER=$(uname -r)
O=trans=virtio,version=9p2000.L,msize=262144
# The host's root, read-only and cached (loose: it does not change under a test), under a
# tmpfs, so the guest can write anywhere and the host sees none of it.
mount -t 9p -o $O,ro,cache=loose hostroot /lower
mount -t tmpfs -o mode=755 tmpfs /upper; mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot
R=/newroot
# Not cached: the exit status written here must reach the host.
mkdir -p $R/job; mount -t 9p -o $O job $R/job
# What the command cannot be run without; boot.sh says so and exits 4 (REFUSED).
refuse() { echo "hawser-kvm: cannot show $1 in the guest: $2"; echo "$1: $2" >>$R/job/refused; }
# boot.sh's shares: host paths under the fresh mounts below, in NUL-separated pairs SOURCE
# DEST (no name is split, and none goes through the kernel's command line). Each SOURCE is
# bound from the overlay now, before those mounts hide it, and at DEST after them.
mkdir /shares; n=0
while IFS= read -r -d '' src && IFS= read -r -d '' dst; do
  n=$((n + 1))
  if [ -d "$R$src" ]; then mkdir /shares/$n; else : >/shares/$n; fi
  mount -o bind "$R$src" /shares/$n || refuse "$dst" "no $src in the host's root over 9p"
done <$R/job/shares
mount -t proc proc $R/proc; mount -t sysfs sysfs $R/sys; mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm $R/usr/lib/modules/$KVER
ln -sf /proc/self/fd $R/dev/fd; ln -sf fd/0 $R/dev/stdin; ln -sf fd/1 $R/dev/stdout; ln -sf fd/2 $R/dev/stderr
mount -t devpts devpts $R/dev/pts
# Fresh and in guest memory: not the host's files (the top of boot.sh says which), and not
# 9p's speed. Then the shares, back at their paths.
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm; mount -t tmpfs -o mode=755 tmpfs $R/run
mount -t tmpfs -o mode=1777 tmpfs $R/tmp
n=0
while IFS= read -r -d '' src && IFS= read -r -d '' dst; do
  n=$((n + 1))
  if [ -d /shares/$n ]; then
    mkdir -p "$R$dst"
  else
    # Created only if missing: opening one that is there would copy it up into the overlay.
    mkdir -p "$R$(dirname "$dst")"; [ -e "$R$dst" ] || : >"$R$dst"
  fi
  mount -o bind /shares/$n "$R$dst" || refuse "$dst" "its bind mount failed"
done <$R/job/shares
mount -t configfs configfs $R/sys/kernel/config 2>/dev/null
# The guest kernel's modules (unpacked from Debian's package on the host) where modprobe looks.
mount -t 9p -o $O,ro,cache=loose modules $R/usr/lib/modules/$KVER
# The device nodes whose opening loads their module (loop-control, net/tun, mapper/control...),
# which systemd would make from modules.devname: without them `losetup -f` finds no device.
grep -v '^#' $R/usr/lib/modules/$KVER/modules.devname | while read -r mod name dev; do
  mm=${dev#?}; mkdir -p "$(dirname $R/dev/$name)"
  mknod -m 0600 $R/dev/$name ${dev%%[0-9]*} ${mm%:*} ${mm#*:} 2>/dev/null
done
# The kernel's own module loading (ext4 or xfs on mount) goes through the host's modprobe too.
printf '#!/bin/sh\nexec chroot /newroot /sbin/modprobe "$@"\n' >/bin/guest-modprobe
chmod +x /bin/guest-modprobe; echo /bin/guest-modprobe >/proc/sys/kernel/modprobe
ip link set lo up; ip link set eth0 up; ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
# The host's may be a symlink into its /run; QEMU's DNS is 10.0.2.3.
rm -f $R/etc/resolv.conf; echo "nameserver 10.0.2.3" >$R/etc/resolv.conf
hostname hawser-guest
echo "hawser-kvm: command starts at $(cut -d' ' -f1 /proc/uptime) s of guest uptime"
ENV="HOME=/root TERM=linux PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
if [ -e $R/job/refused ]; then
  rc=4
elif [ -e $R/job/interactive ]; then
  # setsid -c: the console becomes the shell's terminal, so Ctrl-C and job control work.
  chroot $R /usr/bin/env -i $ENV setsid -c /bin/bash -i </dev/console >/dev/console 2>&1
  rc=$?
else
  chroot $R /usr/bin/env -i $ENV /bin/bash /job/cmd.sh </dev/null >/dev/console 2>&1
  rc=$?
fi
echo "$rc" >$R/job/rc; sync
echo "hawser-kvm: exit status $rc at $(cut -d' ' -f1 /proc/uptime) s"
umount $R/job 2>/dev/null
poweroff -f
INIT
}

kernel_version() { ls "$KERNEL/usr/lib/modules"; }
initrd_path() {
  local hash
  hash=$( { init_script; echo "$INITRD_MODULES"; } | sha256sum | cut -c1-12)
  echo "$CACHE/initrd-$1-$hash.cpio.gz"
}

# --- Prepare (make kvm-kernel): the kernel once, the initramfs when this script changed ---
prepare() {
  need_commands
  mkdir -p "$CACHE"
  # One prepare at a time; a second waits and then finds everything done.
  exec 9>"$CACHE/.prepare.lock"
  flock 9
  if [ ! -e "$KERNEL/.done" ]; then fetch_kernel; fi
  local kver initrd
  kver=$(kernel_version)
  initrd=$(initrd_path "$kver")
  if [ ! -e "$initrd" ]; then build_initrd "$kver" "$initrd"; fi
  log "prepared: kernel $kver, $initrd"
}

# Debian's packaged kernel, downloaded with a private apt configuration: this machine's apt
# state and sources stay as they are, nothing is installed, and apt still checks the package
# against the signed archive.
fetch_kernel() {
  local apt mirror pkg deb
  apt=$CACHE/apt
  local opts=(-o "Dir::State=$apt/state" -o "Dir::Cache=$apt/cache"
    -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
    -o Dir::Etc::Preferences=/dev/null -o "Dir::Etc::PreferencesParts=$apt/parts"
    -o Dir::State::status=/var/lib/dpkg/status -o APT::Sandbox::User=root)
  mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$CACHE/debs"
  # This machine's Debian mirror (deb822 or one-line sources), with the suite trixie: its
  # kernel has ublk_drv.
  mirror=${HAWSER_KVM_MIRROR:-$(grep -hoE '^(URIs: *|deb +(\[[^]]*\] +)?)[a-z]+://[^ ]+/debian/?( |$)' \
    /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    grep -oE '[a-z]+://[^ ]+' | head -1 || true)}
  [ -n "$mirror" ] || die "no Debian mirror in /etc/apt's sources: set HAWSER_KVM_MIRROR"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$apt/sources.list"
  apt-get "${opts[@]}" update -qq
  # linux-image-amd64 is a metapackage: the kernel is the package it depends on.
  pkg=$(apt-cache "${opts[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')
  [ -n "$pkg" ] || die "trixie's linux-image-amd64 names no kernel package"
  log "downloading $pkg from $mirror"
  (cd "$CACHE/debs" && apt-get "${opts[@]}" -qq download "$pkg")
  local debs=("$CACHE/debs/${pkg}"_*.deb)
  deb=${debs[-1]}
  rm -rf "$KERNEL" "$KERNEL.tmp"; mkdir -p "$KERNEL.tmp"
  dpkg-deb -x "$deb" "$KERNEL.tmp"
  # modprobe -d looks in DIR/lib/modules; the package has usr/lib/modules.
  [ -e "$KERNEL.tmp/lib" ] || ln -s usr/lib "$KERNEL.tmp/lib"
  depmod -b "$KERNEL.tmp" "$(ls "$KERNEL.tmp/usr/lib/modules")"
  touch "$KERNEL.tmp/.done"
  # Unpacked, the package is of no more use: 100 MB less in the cache.
  rm -f "$deb"
  mv "$KERNEL.tmp" "$KERNEL"
}

# Static busybox, the init script, and the modules (decompressed, for busybox's insmod) that
# reach the host root: 9p over virtio, overlay, and the network card.
build_initrd() {
  local kver=$1 initrd=$2 t m b
  t=$(mktemp -d)
  mkdir -p "$t"/{bin,dev,proc,sys,mods,lower,upper,newroot}
  cp "$(command -v busybox)" "$t/bin/busybox"
  : >"$t/mods/order"
  # shellcheck disable=SC2086 # a list of module names
  for m in $(for b in $INITRD_MODULES; do modprobe -d "$KERNEL" -S "$kver" --show-depends "$b"; done |
    awk '$1 == "insmod" { print $2 }'); do
    b=$(basename "$m" .xz)
    grep -qx "$b" "$t/mods/order" && continue
    case $m in *.xz) xz -dc "$m" >"$t/mods/$b" ;; *) cp "$m" "$t/mods/$b" ;; esac
    echo "$b" >>"$t/mods/order"
  done
  init_script >"$t/init"
  chmod +x "$t/init"
  (cd "$t" && find . | cpio -o -H newc --quiet | gzip -1) >"$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$t"
  # This script's initramfs files of an older init (named with a hash; not another tool's
  # initrd-KVER.cpio.gz: /work/shared/kvm/boot.sh defaults to this cache too).
  local h='[0-9a-f]' old=()
  mapfile -t old < <(find "$CACHE" -maxdepth 1 -name "initrd-*-$h$h$h$h$h$h$h$h$h$h$h$h.cpio.gz" ! -path "$initrd")
  if [ ${#old[@]} -gt 0 ]; then rm -f "${old[@]}"; fi
  log "built $initrd ($(du -h "$initrd" | cut -f1))"
}

# --- Boot --------------------------------------------------------------------------------
# Never prepares (that would install and download in the middle of a test): fails at once.
check_prepared() {
  local initrd
  if [ -e "$KERNEL/.done" ]; then initrd=$(initrd_path "$(kernel_version)"); fi
  if [ ! -e "$KERNEL/.done" ] || [ ! -e "$initrd" ]; then
    log "no prepared guest kernel in $CACHE (or one for an older boot.sh): run \`make kvm-kernel\` (make test does)"
    exit 3
  fi
}

QEMU_PID=""
JOB=""
cleanup() {
  # qemu runs under timeout, which passes the TERM on: no qemu outlives this script.
  if [ -n "$QEMU_PID" ]; then
    kill "$QEMU_PID" 2>/dev/null || true
    wait "$QEMU_PID" 2>/dev/null || true
  fi
  if [ -n "$JOB" ]; then rm -rf "$JOB"; fi
}

# --- Shares: what the command needs from under the guest's fresh /tmp, /run and /dev/shm ---
# Exit status when the guest cannot show a path the command needs (the init's is the same).
REFUSED=4
FRESH_DIRS=(/tmp /run /dev/shm)
SHARE_SRC=()
SHARE_DST=()

refuse() { log "cannot show $1 in the guest: $2"; exit "$REFUSED"; }
under() { [[ $1 == "$2" || $1 == "$2"/* ]]; }

# Why the guest cannot show the host's absolute path $1 (none: it is visible, or shared).
hidden_reason() {
  local d=$1 f o
  for f in "${FRESH_DIRS[@]}"; do
    if [ "$d" = "$f" ]; then
      echo "the guest's $f is a fresh tmpfs of its own (see the top of $0): share a path under it"
      return
    fi
    if under "$d" "$f"; then return; fi
  done
  for o in /proc /sys /dev /job "/usr/lib/modules/$KVER"; do
    if under "$d" "$o"; then echo "the guest mounts its own $o there"; return; fi
  done
}

# Whether the host's absolute path $1 is under a fresh mount of the guest's, so needs a bind.
hidden() {
  local f
  for f in "${FRESH_DIRS[@]}"; do if under "$1" "$f" && [ "$1" != "$f" ]; then return 0; fi; done
  return 1
}

# Adds host path $1 to the shares. Strict ($2 = strict): refuses a path the guest cannot show;
# else (an --env value) leaves such a path to the guest's own.
add_share() {
  local p=$1 strict=$2 abs real why i
  if [ ! -e "$p" ]; then
    [ "$strict" != strict ] || refuse "$p" "it does not exist on this machine"
    return 0
  fi
  # NUL-terminated, so that no name loses a trailing newline. abs: as given (its symlinks
  # kept, as the command will name it); real: what it is.
  IFS= read -r -d '' abs < <(realpath -zs -- "$p")
  IFS= read -r -d '' real < <(realpath -ze -- "$p")
  for i in "$abs" "$real"; do
    why=$(hidden_reason "$i")
    if [ -n "$why" ]; then
      [ "$strict" != strict ] || refuse "$p" "$why"
      return 0
    fi
  done
  # The guest binds the real path, which has no symlink the guest could resolve otherwise,
  # at each of the two names that its fresh mounts would hide.
  for i in "$real" "$abs"; do
    if ! hidden "$i" || shown "$i"; then continue; fi
    SHARE_SRC+=("$real")
    SHARE_DST+=("$i")
  done
}

# Whether a share shows $1 already: it is a DEST, or under a DEST bound from itself (what
# the checkout's share shows of its build needs no bind of its own).
shown() {
  local k
  for k in "${!SHARE_DST[@]}"; do
    if [ "${SHARE_DST[$k]}" = "$1" ]; then return 0; fi
    if [ "${SHARE_SRC[$k]}" = "${SHARE_DST[$k]}" ] && under "$1" "${SHARE_DST[$k]}"; then return 0; fi
  done
  return 1
}

# --- Boot --------------------------------------------------------------------------------
ENVS=()
SHARES=()
KVER=""

boot() {
  local interactive=$1 command=$2 kv
  check_prepared
  need_commands
  local initrd
  KVER=$(kernel_version)
  initrd=$(initrd_path "$KVER")
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # The command starts in the working directory, so the guest must show it.
  add_share "$PWD" strict
  for kv in "${SHARES[@]}"; do add_share "$kv" strict; done
  for kv in "${ENVS[@]}"; do [[ ${kv#*=} != /* ]] || add_share "${kv#*=}" env; done
  JOB=$(mktemp -d "$CACHE/job.XXXXXX")
  : >"$JOB/shares"
  for kv in "${!SHARE_DST[@]}"; do
    printf '%s\0%s\0' "${SHARE_SRC[$kv]}" "${SHARE_DST[$kv]}" >>"$JOB/shares"
  done
  {
    for kv in "${ENVS[@]}"; do printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"; done
    # Shared above: a cd that fails here is a guest that could not show it (REFUSED).
    printf 'cd %q || exit %d\n' "$PWD" "$REFUSED"
    printf '%s\n' "$command"
  } >"$JOB/cmd.sh"
  local serial=stdio
  if [ "$interactive" = 1 ]; then touch "$JOB/interactive"; serial=mon:stdio; fi
  local qemu=(qemu-system-x86_64 -nodefaults -no-user-config -machine q35 -accel "tcg,thread=multi"
    -cpu max -smp "$CPUS" -m "$MEM" -display none -serial "$serial" -no-reboot
    -kernel "$KERNEL/boot/vmlinuz-$KVER" -initrd "$initrd"
    -append "console=ttyS0 quiet loglevel=4 panic=-1 ${HAWSER_KVM_APPEND:-}"
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=$KERNEL/usr/lib/modules/$KVER,mount_tag=modules,security_model=none,readonly=on"
    -virtfs "local,path=$JOB,mount_tag=job,security_model=none"
    -netdev "user,id=n0" -device "virtio-net-pci,netdev=n0")
  log "kernel $KVER, TCG, $CPUS CPUs, $MEM"
  if [ "$interactive" = 1 ]; then
    "${qemu[@]}" || true
  else
    # In the background, so that the INT and TERM traps run while it does.
    timeout "$TIMEOUT" "${qemu[@]}" </dev/null &
    QEMU_PID=$!
    wait "$QEMU_PID" || true
    QEMU_PID=""
  fi
  report "$(cat "$JOB/rc" 2>/dev/null || true)"
}

# Exits with the guest's status $1 (empty: none came), saying what it means when unusual.
report() {
  local rc=$1
  if [ -s "$JOB/refused" ]; then
    log "the guest could not show what the command needs: $(cat "$JOB/refused")"
    exit "$REFUSED"
  fi
  if [ -z "$rc" ]; then
    log "the guest reported no exit status (timeout after ${TIMEOUT} s, kernel panic, or qemu killed)"
    exit 125
  fi
  # The usual cause in this guest: a program under a host path its fresh mounts hide.
  if [ "$rc" = 127 ]; then
    log "exit status 127, a command not found: the guest's /tmp, /run and /dev/shm are its own;" \
      "a host path under them that the command names needs --share PATH"
  fi
  exit "$rc"
}

case ${1:-} in
  --prepare) prepare ;;
  --check) check_prepared ;;
  *)
    interactive=0
    while [ $# -gt 0 ]; do
      case $1 in
        --env)
          [[ ${2:-} == [A-Za-z_]*=* ]] || die "--env takes NAME=VALUE"
          ENVS+=("$2"); shift 2 ;;
        --share)
          [ -n "${2:-}" ] || die "--share takes a PATH"
          SHARES+=("$2"); shift 2 ;;
        -i) interactive=1; shift ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see the comment at the top of $0)" ;;
        *) break ;;
      esac
    done
    if [ "$interactive" = 1 ]; then
      [ $# -eq 0 ] || die "-i takes no command"
      boot 1 ""
    fi
    [ $# -gt 0 ] || die "no command (see the comment at the top of $0)"
    boot 0 "$*" ;;
esac
