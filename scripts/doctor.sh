#!/usr/bin/env bash
# make doctor: what on this machine works for Hawser's tests, and what is missing with its fix.
# One line per check: OK, MISSING (and the fix) or SKIP (not needed here, or not checkable).
# Exit status 1 only when something is missing that make test cannot install itself (it
# installs the Debian packages, builds the Kubernetes tools, runs npm ci, installs cargo-fuzz).
# Creates only temporary files and a network namespace hawser-doctor-PID, all removed at exit.
#
# usage: scripts/doctor.sh [POOL_DIR]     (make doctor POOL=DIR)
#   POOL_DIR: where to try a reflink, as a replica pool there would (default: target/, or /tmp)
# shellcheck disable=SC2016 # make expressions and regexes below mean a literal $
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

# The Makefile's lists, passed by `make doctor`; asked of make when run by hand.
mkvar() { env -u MAKEFLAGS -u MAKELEVEL make -s --no-print-directory --eval 'print-var-%: ; @echo $($*)' "print-var-$1"; }
NEEDED_CMDS=${NEEDED_CMDS:-$(mkvar NEEDED_CMDS)}
HOST_CMDS=${HOST_CMDS:-$(mkvar HOST_CMDS)}
K8S_BIN=${HAWSER_K8S_BIN:-$HOME/.cache/hawser-k8s/bin}
KVM_CACHE=${HAWSER_KVM_CACHE:-$HOME/.cache/hawser-kvm}
# scripts/k8s/build.sh finds Go there too.
PATH="$PATH:/usr/local/go/bin"

tmp=$(mktemp -d)
ns=hawser-doctor-$$
pool_file=""
cleanup() {
  if ip netns list 2>/dev/null | grep -qw "$ns"; then ip netns del "$ns"; fi
  rm -rf "$tmp"
  if [ -n "$pool_file" ]; then rm -f "$pool_file" "$pool_file.clone"; fi
}
trap cleanup EXIT

declare -A count=([OK]=0 [MISSING]=0 [SKIP]=0)
blockers=()
# row STATUS CHECK DETAIL [blocker]: "blocker" when make test cannot install the missing thing.
row() {
  printf '%-13s %-8s %s\n' "$2" "$1" "$3"
  count[$1]=$((count[$1] + 1))
  if [ "${4:-}" = blocker ]; then blockers+=("$2"); fi
}
have() { command -v "$1" >/dev/null 2>&1; }
is_root() { [ "$(id -u)" = 0 ]; }
printf '%-13s %-8s %s\n' CHECK STATUS "DETAIL / FIX"

# --- The kernel and the machine: make test cannot change these -----------------------------
if is_root; then row OK root "the loop, mount and network-namespace tests need root"
else row MISSING root "run make test as root: the loop, mount and network-namespace tests need it" blocker; fi

# Replicas do their I/O through io_uring; a container's seccomp profile may forbid it even
# where the sysctl allows it, so fio tries it for real.
disabled=$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo absent)
if have fio && fio --name=doctor --ioengine=io_uring --filename="$tmp/uring" --size=64k --bs=4k \
  --rw=write >/dev/null 2>&1; then
  row OK io_uring "fio wrote through it (kernel.io_uring_disabled: $disabled)"
elif ! have fio && [[ $disabled == 0 || $disabled == absent ]]; then
  row OK io_uring "kernel.io_uring_disabled: $disabled (not tried: no fio yet)"
else
  row MISSING io_uring "unusable (kernel.io_uring_disabled: $disabled; or seccomp): sysctl -w kernel.io_uring_disabled=0, or a container allowing io_uring" blocker
fi

if [ ! -c /dev/fuse ]; then row MISSING fuse "no /dev/fuse: modprobe fuse, or give the container /dev/fuse (nbdfuse tests)" blocker
elif ! have fusermount3; then row MISSING fuse "/dev/fuse, but no fusermount3: make test installs it (fuse3)"
else row OK fuse "/dev/fuse and fusermount3"; fi

if [ -c /dev/loop-control ] && free=$(losetup -f 2>/dev/null); then
  row OK loop "/dev/loop-control; next free device $free"
else row MISSING loop "no loop devices: modprobe loop, or give the container /dev/loop-control (ext4 tests)" blocker; fi

# A throwaway namespace, as the network-fault tests make theirs; they skip when this fails.
if ! is_root; then row SKIP netns "not root: the network-fault tests skip"
elif ! have ip; then row MISSING netns "no ip: make test installs it (iproute2)"
elif ! ip netns add "$ns" 2>"$tmp/err"; then
  row MISSING netns "ip netns add fails ($(head -c 80 "$tmp/err")): the network-fault tests skip"
else
  row OK netns "ip netns add/del $ns"
  if ! have iptables; then row MISSING iptables "make test installs it (iptables)"
  elif ip netns exec "$ns" iptables -w -L -n >/dev/null 2>"$tmp/err"; then
    row OK iptables "iptables -L in a namespace"
  else row MISSING iptables "iptables fails in a namespace ($(head -c 80 "$tmp/err")): the network-fault tests skip"; fi
fi

# The kernel block frontends. Without them, their tests boot a kernel that has them in a QEMU
# guest (scripts/kvm/boot.sh; make kvm-kernel prepares it, make deps installs qemu).
for m in nbd ublk_drv; do
  if [ -d "/sys/module/$m" ] || modinfo "$m" >/dev/null 2>&1; then row OK "$m" "module available"
  else row SKIP "$m" "not in this kernel ($(uname -r)): kernel-frontend tests run in the KVM guest"; fi
done
if ! have qemu-system-x86_64; then
  row MISSING kvm-guest "no qemu-system-x86_64: make test installs it (make deps)"
elif scripts/kvm/boot.sh --check 2>/dev/null; then
  row OK kvm-guest "qemu-system-x86_64 and a prepared guest kernel in $KVM_CACHE"
else
  row MISSING kvm-guest "no prepared guest kernel in $KVM_CACHE: make test prepares it (make kvm-kernel, about 15 s)"
fi

# Snapshots and clones share extents where the pool's filesystem has reflinks, else copy.
pool=${1:-}
if [ -z "$pool" ]; then if [ -d target ]; then pool=$repo/target; else pool=/tmp; fi; fi
if [ -d "$pool" ] && pool_file=$(mktemp -p "$pool" .hawser-doctor.XXXXXX 2>/dev/null); then
  fs=$(stat -f -c %T "$pool")
  head -c 65536 /dev/zero >"$pool_file"
  if cp --reflink=always "$pool_file" "$pool_file.clone" 2>/dev/null; then
    row OK reflink "$pool ($fs)"
  else row MISSING reflink "not on $pool ($fs): snapshots and clones copy there; XFS (reflink=1) and btrfs have them (make doctor POOL=DIR tries another)"; fi
else row SKIP reflink "cannot write in $pool"; fi

# --- What make test needs and cannot install (HOST_CMDS) ------------------------------------
channel=$(sed -nE 's/^channel *= *"([^"]+)".*/\1/p' rust-toolchain.toml)
if ! have cargo; then row MISSING rust "no cargo: install rustup, then make test uses Rust $channel" blocker
elif rustup toolchain list 2>/dev/null | grep -q "^$channel"; then row OK rust "$channel (rust-toolchain.toml)"
else row MISSING rust "no $channel: rustup toolchain install $channel --component rustfmt,clippy (rustup may on first use)"; fi

# scripts/k8s/build.sh needs Go 1.24 or newer ("go not found: install Go 1.24 or newer").
go_min=$(sed -nE 's/.*install Go 1\.([0-9]+) or newer.*/\1/p' scripts/k8s/build.sh | head -1)
if ! have go; then row MISSING go "no go: install Go 1.${go_min:-24}+ (Debian's is older): scripts/k8s/build.sh needs it" blocker
else
  v=$(go env GOVERSION); minor=${v#go1.}; minor=${minor%%.*}
  if [ "$minor" -ge "${go_min:-24}" ]; then row OK go "$v"
  else row MISSING go "$v: scripts/k8s/build.sh needs Go 1.${go_min:-24} or newer" blocker; fi
fi

# The newest Node.js that a package of ui/package-lock.json asks for (playwright-core: 20).
node_min=$(grep -oE '"node": ">=[0-9]+' ui/package-lock.json | grep -oE '[0-9]+$' | sort -n | tail -1)
if ! have node || ! have npm; then row MISSING node "no node/npm: install Node.js ${node_min:-20}+ with npm (Debian's is older)" blocker
else
  v=$(node --version); major=${v#v}; major=${major%%.*}
  if [ "$major" -ge "${node_min:-20}" ]; then row OK node "node $v, npm $(npm --version)"
  else row MISSING node "node $v: ui/package-lock.json needs ${node_min}+" blocker; fi
fi

# Anything else in HOST_CMDS that the rows above do not cover.
for c in $HOST_CMDS; do
  case $c in cargo | go | node | npm) ;;
    *) if have "$c"; then row OK "$c" "$(command -v "$c")"; else row MISSING "$c" "make test needs it and cannot install it" blocker; fi ;;
  esac
done

# --- What make test installs or builds by itself -------------------------------------------
absent=()
for c in $NEEDED_CMDS; do type -P "$c" >/dev/null || absent+=("$c"); done
n=$(wc -w <<<"$NEEDED_CMDS")
if [ ${#absent[@]} -eq 0 ]; then row OK debian "all $n commands of NEEDED_CMDS"
else row MISSING debian "${#absent[@]} of $n missing (${absent[*]}): make test installs them (make deps)"; fi

if have etcd; then row OK etcd "$(etcd --version 2>/dev/null | head -1)"
else row MISSING etcd "make test installs it (etcd-server)"; fi

# What scripts/k8s/build.sh builds (as check-tools.sh reads it) against the cache.
built=$( { grep -oE 'k8s\.io/kubernetes/cmd/[a-z-]+' scripts/k8s/build.sh | sed 's|.*/||'
  sed -nE 's/^gobin ([a-z-]+) .*/\1/p; s|.*"\$bin/([a-z][a-z-]*).*|\1|p' scripts/k8s/build.sh; } | sort -u)
absent=()
for t in $built; do [ -e "$K8S_BIN/$t" ] || absent+=("$t"); done
if [ ${#absent[@]} -eq 0 ]; then row OK k8s-tools "all $(wc -w <<<"$built") in $K8S_BIN"
else row MISSING k8s-tools "${#absent[@]} of $(wc -w <<<"$built") not in $K8S_BIN (${absent[*]}): make test builds them (scripts/k8s/build.sh, minutes when cold)"; fi

if [ -e ui/node_modules/.package-lock.json ]; then row OK ui-modules "ui/node_modules"
else row MISSING ui-modules "no ui/node_modules: make test runs npm ci"; fi

if have cargo && cargo fuzz --version >/dev/null 2>&1; then row OK cargo-fuzz "$(cargo fuzz --version)"
else row MISSING cargo-fuzz "scripts/fuzz.sh (make test) installs it"; fi

summary="doctor: ${count[OK]} OK, ${count[MISSING]} MISSING, ${count[SKIP]} SKIP"
if [ ${#blockers[@]} -gt 0 ]; then
  echo "$summary; make test cannot fix: ${blockers[*]} (see above)"
  exit 1
fi
echo "$summary; make test installs or builds whatever else is missing"
