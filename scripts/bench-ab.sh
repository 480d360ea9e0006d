#!/usr/bin/env bash
# A/B benchmark of two commits in one run: `scripts/bench-ab.sh OLD [NEW]` (NEW defaults to
# the work tree). Builds `hawser` of each (OLD in a git worktree under .bench-ab; build
# artifacts share target/, so only the workspace crates are compiled again), starts a cluster
# of one controller and two agents per build (TLS, as a default cluster), makes a 2-replica
# volume attached on the first agent of each, and runs the 8 standard fio tests against
#   baseline   a preallocated file with O_DIRECT
#   old-2r     the OLD build's volume
#   new-2r     the NEW build's volume
# all on the same filesystem, NBD over unix sockets, printing new-2r's ratio to old-2r on every
# test and each agent's RSS/CPU. Reported, never asserted: these machines are noisy, so only
# ratios within one run mean much. Environment: BENCH_RUNTIME (s, default 10), BENCH_SIZE
# (default 1GiB), BENCH_TESTS (a subset, comma separated), BENCH_AB_NEW_FIRST=1 (measure the
# new build before the old one on every test: run both orders to see what order costs).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD="${1:?usage: scripts/bench-ab.sh OLD-COMMIT [NEW-COMMIT]}"
NEW="${2:-}"
B="$PWD/.bench-ab"
RUNTIME="${BENCH_RUNTIME:-10}"
SIZE="${BENCH_SIZE:-1GiB}"
TESTS="${BENCH_TESTS:-randwrite_fsync,randwrite_jobs4,randwrite,write,randread_fsync,randread_jobs4,randread,read}"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$B/run"
  for w in old new; do
    [ -d "$B/$w" ] && git worktree remove --force "$B/$w" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT INT TERM
mkdir -p "$B"
rm -rf "$B/run" && mkdir -p "$B/run/logs"

build() { # name, commit ("" for the work tree)
  if [ -z "$2" ]; then
    cargo build --release -p hawser --quiet
  else
    git worktree remove --force "$B/$1" >/dev/null 2>&1 || true
    git worktree add --detach "$B/$1" "$2" >/dev/null
    # Its workspace crates get another version, so their artifacts in the shared target dir
    # do not take the place of this tree's (cargo names a path crate's artifacts by its path
    # relative to the workspace, the same in both); registry crates are built once for both.
    sed -i '0,/^version = "/s/^version = "\([^"]*\)"/version = "\1-ab.old"/' "$B/$1/Cargo.toml"
    CARGO_TARGET_DIR="$PWD/target" cargo build --release -p hawser --quiet \
      --manifest-path "$B/$1/Cargo.toml"
  fi
  cp target/release/hawser "$B/run/hawser-$1"
  echo "$1: $("$B/run/hawser-$1" --version) from ${2:-the work tree}"
}
build old "$OLD"
build new "$NEW"

start_cluster() { # name, port digit
  local name="$1" n="$2" bin="$B/run/hawser-$1" d="$B/run/$1"
  local ctl="https://127.0.0.1:944$n"
  "$bin" controller --listen "127.0.0.1:944$n" --data-dir "$d/controller" \
    >"$B/run/logs/$name-controller.log" 2>&1 &
  pids+=($!)
  c() { HAWSER_CONTROLLER="$ctl" HAWSER_TOKEN_FILE="$d/controller/admin.token" \
    HAWSER_CA_FILE="$d/controller/ca.pem" "$bin" "$@"; }
  for _ in $(seq 1 100); do c node list >/dev/null 2>&1 && break; sleep 0.1; done
  c cluster join-token --uses 2 >"$d/join.token"
  for i in 1 2; do
    "$bin" agent --node "$name$i" --data-dir "$d/a$i" --controller "$ctl" \
      --join-token-file "$d/join.token" \
      --admin-listen "127.0.0.1:95$n$i" --replica-listen "127.0.0.1:96$n$i" --nbd-listen none \
      >"$B/run/logs/$name-a$i.log" 2>&1 &
    pids+=($!)
    eval "${name}_agent$i=$!"
  done
  for _ in $(seq 1 100); do
    local on
    on=$(c node list -o json 2>/dev/null | grep -o '"state": *"online"' | wc -l || true)
    [ "$on" -ge 2 ] && break
    sleep 0.1
  done
  c volume create ab --size "$SIZE" --replicas 2 >/dev/null
  c volume attach ab --node "${name}1" >/dev/null
}
start_cluster old 1
start_cluster new 2

ab_targets=(--target "old-2r=nbd:nbd+unix:///ab?socket=$B/run/old/a1/nbd.sock"
  --target "new-2r=nbd:nbd+unix:///ab?socket=$B/run/new/a1/nbd.sock")
if [ "${BENCH_AB_NEW_FIRST:-0}" = 1 ]; then
  ab_targets=("${ab_targets[@]:2:2}" "${ab_targets[@]:0:2}")
fi
# shellcheck disable=SC2154 # set by start_cluster's eval
"$B/run/hawser-new" bench --runtime "$RUNTIME" --size "$SIZE" --tests "$TESTS" \
  --json "$B/bench-ab-results.json" \
  --target "baseline=file:$B/run/baseline.img" \
  "${ab_targets[@]}" \
  --monitor-pid "old-a1=$old_agent1" --monitor-pid "old-a2=$old_agent2" \
  --monitor-pid "new-a1=$new_agent1" --monitor-pid "new-a2=$new_agent2" \
  --targets-ratio new-2r:old-2r
echo "results: $B/bench-ab-results.json"
