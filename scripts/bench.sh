#!/usr/bin/env bash
# `make bench`: the 8 standard fio tests against, in one run,
#   baseline   a preallocated file with O_DIRECT
#   nbdkit     nbdkit serving a file (the NBD path without replication)
#   hawser-1r  a 1-replica Hawser volume
#   hawser-2r  a 2-replica Hawser volume (replicas on two agents), plain: no block checksums
#   hawser-2r-sums  the same with block checksums, as volumes are made by default
#                   (docs/checksums.md)
#   hawser-2r-enc  the same as hawser-2r, encrypted (docs/encryption.md)
# all on the same filesystem, NBD over unix sockets. Prints IOPS, MiB/s, latency and ratios
# (to the baseline; 1r to nbdkit; 2r to 1r, the cost of the second replica on this machine;
# 2r-sums and 2r-enc to 2r, the costs of checksums and of encryption), the rate of a scrub
# pass over the checksummed volume,
# agent RSS/CPU idle and under load, CPU time and context switches per request of the servers
# (both agents + nbdkit, summed: only the tested target's server is busy) and of fio, and
# writes bench-results.json with SVG charts beside it: bench-results.<test>.svg per test and
# bench-results.history.svg, every target's ratio to the baseline over the runs kept in
# docs/bench/history (this one included), where the JSON is then copied for the next run.
# Performance is reported, never asserted. Environment: BENCH_RUNTIME (s, default 10),
# BENCH_SIZE (default 1GiB), BENCH_HISTORY (default docs/bench/history).
set -euo pipefail
cd "$(dirname "$0")/.."
HAWSER="$PWD/target/release/hawser"
B="$PWD/.bench"
RUNTIME="${BENCH_RUNTIME:-10}"
# Extra flags for the volumes, e.g. BENCH_VOLUME_FLAGS=--thick; BENCH_TESTS=a,b for a subset.
VOLUME_FLAGS="${BENCH_VOLUME_FLAGS:-}"
TESTS="${BENCH_TESTS:-randwrite_fsync,randwrite_jobs4,randwrite,write,randread_fsync,randread_jobs4,randread,read}"
SIZE="${BENCH_SIZE:-1GiB}"
HISTORY="${BENCH_HISTORY:-$PWD/docs/bench/history}"
mkdir -p "$HISTORY"
export HAWSER_CONTROLLER="https://127.0.0.1:9410"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$B"
}
trap cleanup EXIT INT TERM
rm -rf "$B" && mkdir -p "$B/logs"

"$HAWSER" controller --listen 127.0.0.1:9410 --data-dir "$B/controller" >"$B/logs/controller.log" 2>&1 &
pids+=($!)
# Cluster init: the controller makes the cluster CA and the API tokens in its data dir at first
# start; the agents join with a join token and talk TLS, as a default cluster does.
export HAWSER_TOKEN_FILE="$B/controller/admin.token"
export HAWSER_CA_FILE="$B/controller/ca.pem"
for _ in $(seq 1 100); do "$HAWSER" node list >/dev/null 2>&1 && break; sleep 0.1; done
"$HAWSER" cluster join-token --uses 2 >"$B/join.token"
for i in 1 2; do
  "$HAWSER" agent --node "b$i" --data-dir "$B/b$i" --controller "$HAWSER_CONTROLLER" \
    --join-token-file "$B/join.token" \
    --admin-listen "127.0.0.1:952$i" --replica-listen "127.0.0.1:962$i" --nbd-listen none \
    >"$B/logs/b$i.log" 2>&1 &
  pids+=($!)
  eval "agent$i=$!"
done
for _ in $(seq 1 100); do
  n=$("$HAWSER" node list -o json 2>/dev/null | grep -o '"state": *"online"' | wc -l || true)
  [ "$n" -ge 2 ] && break
  sleep 0.1
done
"$HAWSER" volume create bench1 --size "$SIZE" --replicas 1 --checksums off $VOLUME_FLAGS >/dev/null
"$HAWSER" volume create bench2 --size "$SIZE" --replicas 2 --checksums off $VOLUME_FLAGS >/dev/null
"$HAWSER" volume attach bench1 --node b1 >/dev/null
"$HAWSER" volume attach bench2 --node b1 >/dev/null
"$HAWSER" volume create bench2s --size "$SIZE" --replicas 2 --checksums on $VOLUME_FLAGS >/dev/null
"$HAWSER" volume attach bench2s --node b1 >/dev/null
"$HAWSER" volume create bench2e --size "$SIZE" --replicas 2 --encrypted --checksums off $VOLUME_FLAGS >/dev/null
"$HAWSER" volume attach bench2e --node b1 >/dev/null

truncate -s "$SIZE" "$B/nbdkit.img"
nbdkit -f -U "$B/nbdkit.sock" file "$B/nbdkit.img" cache=none >"$B/logs/nbdkit.log" 2>&1 &
pids+=($!)
nbdkit_pid=$!
for _ in $(seq 1 100); do [ -S "$B/nbdkit.sock" ] && break; sleep 0.1; done

sock="$B/b1/nbd.sock"
"$HAWSER" bench --runtime "$RUNTIME" --size "$SIZE" --tests "$TESTS" --json "$PWD/bench-results.json" \
  --target "baseline=file:$B/baseline.img" \
  --target "nbdkit=nbd:nbd+unix:///?socket=$B/nbdkit.sock" \
  --target "hawser-1r=nbd:nbd+unix:///bench1?socket=$sock" \
  --target "hawser-2r=nbd:nbd+unix:///bench2?socket=$sock" \
  --target "hawser-2r-sums=nbd:nbd+unix:///bench2s?socket=$sock" \
  --target "hawser-2r-enc=nbd:nbd+unix:///bench2e?socket=$sock" \
  --monitor-pid "agent-b1=$agent1" --monitor-pid "agent-b2=$agent2" --monitor-pid "nbdkit=$nbdkit_pid" \
  --targets-ratio hawser-1r:nbdkit --targets-ratio hawser-2r:hawser-1r \
  --targets-ratio hawser-2r-sums:hawser-2r --targets-ratio hawser-2r-enc:hawser-2r \
  --expect hawser-2r:randwrite_fsync\>=0.65 --expect hawser-2r:randread_fsync\>=0.6 \
  --expect hawser-2r:randwrite\>=0.2 --expect hawser-2r:randwrite_jobs4\>=0.2 \
  --expect hawser-2r:randread\>=0.4 --expect hawser-2r:randread_jobs4\>=0.4 \
  --expect hawser-2r:write\>=0.4 --expect hawser-2r:read\>=0.8 \
  --expect hawser-1r/nbdkit:randwrite_fsync\>=0.95 --expect hawser-1r/nbdkit:randwrite\>=0.95 \
  --expect hawser-1r/nbdkit:randwrite_jobs4\>=0.95 --expect hawser-1r/nbdkit:write\>=0.95 \
  --expect hawser-1r/nbdkit:randread_fsync\>=0.95 --expect hawser-1r/nbdkit:randread\>=0.95 \
  --expect hawser-1r/nbdkit:randread_jobs4\>=0.95 --expect hawser-1r/nbdkit:read\>=0.95 \
  --history "$HISTORY"
echo "results: $PWD/bench-results.json, charts: $PWD/bench-results.*.svg"

# Scrub rate: one pass over the checksummed volume the tests wrote (every block of both
# replicas read and checked), under the agents' default resync rate limit.
t0=$(date +%s%N)
"$HAWSER" volume scrub bench2s >/dev/null
until "$HAWSER" volume show bench2s -o json | tr -d ' \n' | grep -q '"scrub":{"running":false'; do
  sleep 0.1
done
t1=$(date +%s%N)
bytes=$("$HAWSER" volume show bench2s -o json | tr -d ' \n' | sed -n 's/.*"size_bytes":\([0-9]*\).*/\1/p' | head -n 1)
awk -v b="$bytes" -v ns="$((t1 - t0))" 'BEGIN {
  s = ns / 1e9; printf "scrub: %.0f MiB of 2 replicas in %.2f s: %.0f MiB/s of volume\n", b / 1048576, s, b / 1048576 / s }'
# Keep this run for the next run's history chart, named after its start (colons dropped).
ts=$(sed -n 's/^  "timestamp": "\([^"]*\)",$/\1/p' bench-results.json | head -n 1)
ts="${ts:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}"
cp bench-results.json "$HISTORY/bench-${ts//:/}.json"
echo "kept in $HISTORY/bench-${ts//:/}.json"
