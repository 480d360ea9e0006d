#!/usr/bin/env bash
# `make bench`, resync part (issue "Failures without losing an acknowledged write", g):
#   1. resync throughput: a 2-replica volume loses one replica (kill -9 of its agent), 2 GiB
#      are written sequentially, the agent comes back; the time until the replica is in sync
#      again gives the resync rate, printed as a ratio of the baseline's sequential write
#      bandwidth (a file with O_DIRECT, 4M QD16, same filesystem, same run). Unlimited rate
#      (HAWSER_RESYNC_RATE=0), so this is what the resync path can do. Here both replicas
#      share one disk, which the copy both reads and writes; so the run also measures that
#      disk's copy ceiling (sequential writes to one file while another is read, both 4M
#      QD16) and prints the resync as a ratio of it too.
#   2. foreground during resync: the same again at the default rate limit, with 4k QD32 random
#      writes running while the replica resyncs; their IOPS as a ratio of the same writes on
#      the healthy volume.
# Reported, never asserted. Environment: BENCH_RUNTIME (s, default 10), BENCH_RESYNC_GIB
# (GiB written while the replica is down, default 2), BENCH_RESYNC_R2_DIR (a directory on
# another disk for the agent of the replica that goes away and comes back, so the copy reads
# one disk and writes another, as between two nodes; default: with the rest, on one disk).
set -euo pipefail
cd "$(dirname "$0")/.."
HAWSER="$PWD/target/release/hawser"
B="$PWD/.bench-resync"
R2_DIR="${BENCH_RESYNC_R2_DIR:-$B}"
RUNTIME="${BENCH_RUNTIME:-10}"
GIB="${BENCH_RESYNC_GIB:-2}"
DIRTY="${GIB}GiB"
export HAWSER_CONTROLLER="https://127.0.0.1:9411"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$B" "$R2_DIR/t2" "$R2_DIR/f2"
}
trap cleanup EXIT INT TERM
rm -rf "$B" && mkdir -p "$B/logs"

# fio's terse output: field 48 is write KiB/s, 49 write IOPS.
fio_field() { fio --minimal "${@:2}" | tail -1 | cut -d';' -f"$1"; }
now_ms() { date +%s%3N; }

start_agent() { # name (a letter and 1 or 2), rate
  # An empty rate means the default: the variable is then not set (the agent refuses "").
  local dir="$B" port="${1:1}"
  [ "${1:1}" = 2 ] && dir="$R2_DIR"
  # Each phase's agents listen on ports of their own: the controller may still take the
  # previous phase's agents for online for a few seconds, and call their addresses.
  [ "${1:0:1}" = f ] && port=$((port + 2))
  env ${2:+HAWSER_RESYNC_RATE="$2"} "$HAWSER" agent --node "$1" --data-dir "$dir/$1" \
    --controller "$HAWSER_CONTROLLER" --admin-listen "127.0.0.1:953$port" \
    --token-file "$B/controller/agent.token" \
    --replica-listen "127.0.0.1:963$port" --nbd-listen none >>"$B/logs/$1.log" 2>&1 &
  pids+=($!)
  last_pid=$!
}

wait_for() { # description, command...
  local what="$1"; shift
  for _ in $(seq 1 1200); do "$@" && return 0; sleep 0.1; done
  echo "timed out waiting for $what" >&2; exit 1
}
online() { "$HAWSER" node show "$1" -o json 2>/dev/null | grep -q '"state": *"online"'; }
offline() { ! online "$1"; }
# The engine's view of that replica says it is being resynced.
engine_syncing() { "$HAWSER" volume show "$1" -o json | grep -A12 "\"node\": *\"$2\"" | grep -q '"state": *"syncing"'; }
# The store's state of the replica on r2 (two lines after its node in the JSON).
replica_state_is() { "$HAWSER" volume show "$1" -o json | grep -A2 "\"node\": *\"$2\"" | grep -q "\"state\": *\"$3\""; }

echo "baseline: sequential write to a file with O_DIRECT (4M QD16, ${RUNTIME}s)"
base_kib=$(fio_field 48 --name=seq --filename="$B/baseline.img" --size="$DIRTY" --rw=write \
  --bs=4M --iodepth=16 --ioengine=libaio --direct=1 --runtime="$RUNTIME" --time_based)
echo "  $((base_kib / 1024)) MiB/s"
echo "copy ceiling: the same writes while the same disk reads another file (4M QD16 each)"
fio --name=src --filename="$B/source.img" --size="$DIRTY" --rw=write --bs=4M --iodepth=16 \
  --ioengine=libaio --direct=1 >/dev/null
# With two jobs, --minimal prints one line per job; the writer's is the second.
copy_kib=$(fio --minimal --ioengine=libaio --direct=1 --runtime="$RUNTIME" --time_based \
  --name=read --filename="$B/source.img" --size="$DIRTY" --rw=read --bs=4M --iodepth=16 \
  --name=write --filename="$B/baseline.img" --size="$DIRTY" --rw=write --bs=4M --iodepth=16 |
  tail -1 | cut -d';' -f48)
rm -f "$B/baseline.img" "$B/source.img"
echo "  $((copy_kib / 1024)) MiB/s written while reading"

"$HAWSER" controller --listen 127.0.0.1:9411 --data-dir "$B/controller" >"$B/logs/controller.log" 2>&1 &
pids+=($!)
# Cluster init: the controller makes the cluster CA and the API tokens in its data dir at first
# start. Agents (several per phase) join with the agent token and the CA, then talk TLS.
export HAWSER_TOKEN_FILE="$B/controller/admin.token"
export HAWSER_CA_FILE="$B/controller/ca.pem"
for _ in $(seq 1 100); do "$HAWSER" node list >/dev/null 2>&1 && break; sleep 0.1; done
"$HAWSER" node list >/dev/null || { echo "the controller does not answer; see its log" >&2; exit 1; }

phase() { # rate, label; writes "healthy-iops during-iops resync-ms" to $B/result
  local rate="$1" label="$2" p="${2:0:1}" v="rs-$2"
  start_agent "${p}1" "$rate"
  start_agent "${p}2" "$rate"; local r2pid=$last_pid
  wait_for "the agents" online "${p}1"
  wait_for "the agents" online "${p}2"
  "$HAWSER" volume create "$v" --size "$((GIB + 1))GiB" --replicas 2 >/dev/null
  "$HAWSER" volume attach "$v" --node "${p}1" >/dev/null
  local uri="nbd+unix:///$v?socket=$B/${p}1/nbd.sock"
  local rw=(--name=rw --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32
    --size=1GiB --direct=1 --randrepeat=0 --runtime="$RUNTIME" --time_based)
  local healthy=0
  [ "$label" = foreground ] && healthy=$(fio_field 49 "${rw[@]}")
  kill -9 "$r2pid"
  wait "$r2pid" 2>/dev/null || true
  wait_for "the lost replica to be outdated" replica_state_is "$v" "${p}2" outdated
  fio --minimal --name=dirty --ioengine=nbd --uri="$uri" --rw=write --bs=4M --iodepth=16 \
    --size="$DIRTY" >/dev/null
  start_agent "${p}2" "$rate"
  # The clock starts when the engine has the replica back and copies (not at the agent's
  # restart: reconnecting after a long absence waits for the backoff, up to 10 s).
  wait_for "the resync to start" engine_syncing "$v" "${p}2"
  local t0; t0=$(now_ms)
  local during=0
  [ "$label" = foreground ] && during=$(fio_field 49 "${rw[@]}")
  wait_for "the replica to be in sync again" replica_state_is "$v" "${p}2" in_sync
  local ms=$(( $(now_ms) - t0 ))
  echo "$healthy $during $ms" >"$B/result"
  "$HAWSER" volume detach "$v" >/dev/null
  "$HAWSER" volume delete "$v" >/dev/null
  for pid in "${pids[@]:1}"; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  pids=("${pids[0]}")
  # Until the controller sees them gone, it may place the next phase's replicas on them.
  wait_for "the agents to be seen offline" offline "${p}1"
  wait_for "the agents to be seen offline" offline "${p}2"
  rm -rf "$B/${p}1" "$R2_DIR/${p}2"
}

dirty_mib=$((GIB * 1024))

[ "$R2_DIR" != "$B" ] && echo "the returning replica's agent keeps its data in $R2_DIR"
echo "resync of $DIRTY written while a replica was down, unlimited rate"
phase 0 throughput
read -r _ _ ms <"$B/result"
mibs=$(( dirty_mib * 1000 / (ms > 0 ? ms : 1) ))
echo "  in sync again after ${ms} ms: ${mibs} MiB/s; ratio to baseline sequential write: $(awk "BEGIN{printf \"%.2f\", $mibs / ($base_kib / 1024)}") (target >= 0.5)"
echo "  ratio to the copy ceiling of this one disk: $(awk "BEGIN{printf \"%.2f\", $mibs / ($copy_kib > 0 ? $copy_kib / 1024 : 1)}")"

echo "foreground 4k QD32 random writes during a resync at the default rate limit"
phase "" foreground
read -r healthy during ms <"$B/result"
echo "  healthy volume ${healthy} IOPS; during resync ${during} IOPS; ratio $(awk "BEGIN{printf \"%.2f\", $during / ($healthy > 0 ? $healthy : 1)}") (target >= 0.5); resync took ${ms} ms"
