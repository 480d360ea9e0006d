#!/usr/bin/env bash
# `make bench`, the frontends part: the same 2-replica volume configuration reached through
# each way a node can make it a block device, measured inside one QEMU guest in one run
# (scripts/kvm/boot.sh; this machine's own kernel has no nbd module):
#   baseline    a file on the guest's /tmp (where the replicas live too)
#   ublk        /dev/ublkbN, served by the agent itself over io_uring (--frontend ublk)
#   kernel-nbd  /dev/nbdN, served by the agent itself (hawser device attach --frontend nbd)
#   nbdfuse     nbdfuse + a loop device on the agent's NBD socket, as the CSI node's fallback
# The guest runs under software emulation (TCG), so only the ratios between targets mean
# anything, never the absolute figures; `hawser bench` prints both, with CPU time per request
# of the agents.
# Environment: BENCH_RUNTIME (s, default 10), BENCH_SIZE (default 160MiB: three volumes of two
# replicas each and the baseline file must fit the guest's /tmp), BENCH_TESTS (default all 8).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--in-guest" ]; then
  [ -x target/release/hawser ] || { echo "no target/release/hawser: run make build" >&2; exit 1; }
  out="$PWD/bench-frontends.out"
  HAWSER_KVM_MEM=${HAWSER_KVM_MEM:-4G} scripts/kvm/boot.sh \
    --env "BENCH_RUNTIME=${BENCH_RUNTIME:-10}" --env "BENCH_SIZE=${BENCH_SIZE:-160MiB}" \
    --env "BENCH_TESTS=${BENCH_TESTS:-}" -- "bash scripts/bench-frontends.sh --in-guest" | tee "$out"
  exit "${PIPESTATUS[0]}"
fi

# --- in the guest ------------------------------------------------------------------------
B=/tmp/bench-frontends
RUNTIME=${BENCH_RUNTIME:-10}
SIZE=${BENCH_SIZE:-160MiB}
TESTS=${BENCH_TESTS:-randwrite_fsync,randwrite_jobs4,randwrite,write,randread_fsync,randread_jobs4,randread,read}
# shellcheck source=kvm/bench-cluster.sh
source scripts/kvm/bench-cluster.sh
for v in vu vk vf; do
  "$HAWSER" volume create "$v" --size "$SIZE" --replicas 2 --checksums off >/dev/null
  "$HAWSER" volume attach "$v" --node b1 >/dev/null
done
ublk=$("$HAWSER" device attach vu --frontend ublk --socket "$B/b1/device.sock")
knbd=$("$HAWSER" device attach vk --frontend nbd --socket "$B/b1/device.sock")
mkdir -p "$B/fuse"
nbdfuse "$B/fuse/vf" "nbd+unix:///vf?socket=$B/b1/nbd.sock" &
fuse_pid=$!
for _ in $(seq 1 300); do [ -s "$B/fuse/vf" ] && break; sleep 0.1; done
loop=$(losetup --find --show "$B/fuse/vf")
losetup --direct-io=on "$loop" 2>/dev/null || echo "the nbdfuse loop device stays buffered"
echo "ublk: $ublk; kernel-nbd: $knbd; nbdfuse: $loop on $B/fuse/vf"

"$HAWSER" bench --runtime "$RUNTIME" --size "$SIZE" --tests "$TESTS" --json "$B/bench.json" --no-charts \
  --target "baseline=file:$B/baseline.img" \
  --target "ublk=file:$ublk" \
  --target "kernel-nbd=file:$knbd" \
  --target "nbdfuse=file:$loop" \
  --monitor-pid "agent-b1=${agents[0]}" --monitor-pid "agent-b2=${agents[1]}" --monitor-pid "nbdfuse=$fuse_pid" \
  --targets-ratio ublk:kernel-nbd --targets-ratio ublk:nbdfuse --targets-ratio kernel-nbd:nbdfuse

losetup -d "$loop"
fusermount3 -u "$B/fuse" 2>/dev/null || umount "$B/fuse/vf" 2>/dev/null || true
"$HAWSER" device detach vk --socket "$B/b1/device.sock"
"$HAWSER" device detach vu --socket "$B/b1/device.sock"
