#!/usr/bin/env bash
# `make bench`, the ublk settings part: how many queues and how deep, measured. The same
# 2-replica volume configuration is made a ublk device several times over, each with other
# queue settings (`hawser device attach --ublk-queues N --ublk-queue-depth D`), and all are
# measured in one `hawser bench` run inside one QEMU guest of 2 vCPUs (a ublk device has at
# most one queue per CPU), as ratios against the agent's default (1 queue, depth 64).
# The guest runs under software emulation (TCG): only the ratios mean anything.
# Environment: BENCH_RUNTIME (s, default 10), BENCH_SIZE (default 96MiB),
# BENCH_UBLK_SETTINGS (queues x depth, default "1x64 1x16 1x128 2x64 2x128"),
# BENCH_TESTS (default randread_fsync,randread,randread_jobs4,randwrite_jobs4).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--in-guest" ]; then
  [ -x target/release/hawser ] || { echo "no target/release/hawser: run make build" >&2; exit 1; }
  out="$PWD/bench-ublk-settings.out"
  HAWSER_KVM_MEM=${HAWSER_KVM_MEM:-4G} HAWSER_KVM_CPUS=${HAWSER_KVM_CPUS:-2} scripts/kvm/boot.sh \
    --env "BENCH_RUNTIME=${BENCH_RUNTIME:-10}" --env "BENCH_SIZE=${BENCH_SIZE:-96MiB}" \
    --env "BENCH_UBLK_SETTINGS=${BENCH_UBLK_SETTINGS:-}" --env "BENCH_TESTS=${BENCH_TESTS:-}" \
    -- "bash scripts/bench-ublk-settings.sh --in-guest" | tee "$out"
  exit "${PIPESTATUS[0]}"
fi

# --- in the guest ------------------------------------------------------------------------
B=/tmp/bench-ublk
RUNTIME=${BENCH_RUNTIME:-10}
SIZE=${BENCH_SIZE:-96MiB}
SETTINGS=${BENCH_UBLK_SETTINGS:-1x64 1x16 1x128 2x64 2x128}
TESTS=${BENCH_TESTS:-randread_fsync,randread,randread_jobs4,randwrite_jobs4}
# shellcheck source=kvm/bench-cluster.sh
source scripts/kvm/bench-cluster.sh
echo "guest: $(nproc) CPUs"
targets=()
for s in $SETTINGS; do
  q=${s%x*} d=${s#*x} v="q${s%x*}d${s#*x}"
  "$HAWSER" volume create "$v" --size "$SIZE" --replicas 2 --checksums off >/dev/null
  "$HAWSER" volume attach "$v" --node b1 >/dev/null
  dev=$("$HAWSER" device attach "$v" --frontend ublk --ublk-queues "$q" --ublk-queue-depth "$d" \
    --socket "$B/b1/device.sock")
  echo "$v: $dev, $(cat "/sys/block/${dev#/dev/}/mq/"*/nr_tags 2>/dev/null | head -1) tags, \
$(ls -d "/sys/block/${dev#/dev/}/mq/"* | wc -l) queues"
  # The first (the agent's default settings) is the baseline every ratio is against.
  targets+=(--target "$v=file:$dev")
done

"$HAWSER" bench --runtime "$RUNTIME" --size "$SIZE" --tests "$TESTS" --json "$B/bench.json" --no-charts \
  "${targets[@]}" \
  --monitor-pid "agent-b1=${agents[0]}" --monitor-pid "agent-b2=${agents[1]}"

for s in $SETTINGS; do
  "$HAWSER" device detach "q${s%x*}d${s#*x}" --socket "$B/b1/device.sock"
done
