#!/usr/bin/env bash
# `make bench`, snapshot part (issue 20), on a 2-replica volume of BENCH_SIZE attached to a
# local 2-agent cluster (TLS, join token), NBD over unix sockets, fio's nbd engine:
#   1. write pause: the volume written once (1M sequential), then 4k QD32 random writes run
#      while BENCH_SNAPSHOT_COUNT snapshots (default 20) are taken about a second apart (each
#      deleted once shown, so an ext4 pool holds one copy at a time); prints the median and
#      max of the time the engine held writes (`pause_micros`), how the copies were made
#      (reflink or copy), and the writes' IOPS as a ratio of the same job without snapshots,
#      same volume, same run.
#   2. clone time: `hawser volume create --from volume:V` of that fully written volume, and
#      `--from SNAPSHOT` of a snapshot of it, wall time of each command.
#   3. the standard fio tests (`hawser bench`, the definitions of scripts/bench.sh) on a volume
#      with 10 snapshots (taken after it was written in full) against one without, both
#      written in full, same pool, same run; no prefill after the snapshots, so the
#      snapshots still share or hold the data the tests overwrite.
# What a snapshot costs depends on the pool's filesystem: with reflinks (XFS, btrfs) a copy
# shares the data file's extents (milliseconds, no space until written); elsewhere (ext4) the
# allocated data is copied while writes wait (docs/snapshots.md). 1 and 2 run on a pool in
# this directory's filesystem and, when mkfs.xfs and loop devices are available (root), on an
# XFS pool on a loop device over a sparse file here (BENCH_SNAPSHOT_XFS=0 to skip it); 3 runs
# on the XFS pool when there is one, else here. On a copy filesystem 3 holds 10 full copies
# of the volume per replica (20 GiB at 1 GiB): lower BENCH_SIZE there.
# About 7 minutes on a 2-vCPU VM (the 20 ext4 copies are 2 of them); BENCH_SNAPSHOT_XFS=0, a
# shorter BENCH_SNAPSHOT_TESTS or fewer snapshots shorten it.
# Reported, never asserted. Environment: BENCH_RUNTIME (s per fio run, default 10), BENCH_SIZE
# (default 1GiB), BENCH_SNAPSHOT_COUNT (default 20), BENCH_SNAPSHOT_TESTS (tests of 3, comma
# separated, default all 8; "none" skips 3), BENCH_SNAPSHOT_XFS (0: no XFS pool).
set -euo pipefail
cd "$(dirname "$0")/.."
HAWSER="${HAWSER_BIN:-$PWD/target/release/hawser}"
B="$PWD/.bench-snapshots"
RUNTIME="${BENCH_RUNTIME:-10}"
SIZE="${BENCH_SIZE:-1GiB}"
COUNT="${BENCH_SNAPSHOT_COUNT:-20}"
TESTS="${BENCH_SNAPSHOT_TESTS:-randwrite_fsync,randwrite_jobs4,randwrite,write,randread_fsync,randread_jobs4,randread,read}"
XFS="${BENCH_SNAPSHOT_XFS:-1}"
export HAWSER_CONTROLLER="https://127.0.0.1:9412"
pids=()
fio_pid=""
loopdev=""
cleanup() {
  [ -n "$fio_pid" ] && { kill -TERM "$fio_pid" 2>/dev/null || true; wait "$fio_pid" 2>/dev/null || true; }
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
  if mountpoint -q "$B/xfs" 2>/dev/null; then umount "$B/xfs" || true; fi
  [ -n "$loopdev" ] && { losetup -d "$loopdev" || true; loopdev=""; }
  rm -rf "$B"
}
# On a signal, exit (which cleans up) rather than carry on without the cluster.
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$B" && mkdir -p "$B/logs"

# fio's terse output: field 48 is write KiB/s, 49 write IOPS.
fio_field() { fio --minimal "${@:2}" | tail -1 | cut -d';' -f"$1"; }
now_ms() { date +%s%3N; }
ratio() { awk "BEGIN{printf \"%.2f\", $1 / ($2 > 0 ? $2 : 1)}"; }
secs() { awk "BEGIN{printf \"%.2f\", $1 / 1000}"; }
uri_of() { echo "nbd+unix:///$1?socket=$B/s1/nbd.sock"; }
# Writes the whole volume once, 1M sequential (fio's random buffers: every block allocated).
fill() { fio --minimal --name=fill --ioengine=nbd --uri="$(uri_of "$1")" --rw=write --bs=1M \
  --iodepth=16 --size="$SIZE" --direct=1 >/dev/null; }
# A pool's directory on s1, and the number of extents of files (filefrag, e2fsprogs).
pool_dir() { if [ "$1" = xfs ]; then echo "$B/xfs/s1"; else echo "$B/s1/pool-ext4"; fi; }
extents() { filefrag "$@" 2>/dev/null | awk '{ printf "%s%s", sep, $(NF - 2); sep = " and " }'; }
json_num() { sed -n "s/.*\"$1\": *\([0-9][0-9]*\).*/\1/p" | head -1; }
json_str() { sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p" | head -1; }

# The XFS pool: a sparse file here, XFS with reflinks on a loop device (direct I/O to the file).
pools=(ext4)
fs_here=$(findmnt -n -o FSTYPE -T "$PWD" 2>/dev/null || stat -f -c %T "$PWD")
if [ "$XFS" != 0 ] && [ "$(id -u)" = 0 ] && command -v mkfs.xfs >/dev/null && command -v losetup >/dev/null; then
  truncate -s 16G "$B/xfs.img"
  if mkfs.xfs -q -f -m reflink=1 "$B/xfs.img" >"$B/logs/xfs.log" 2>&1 &&
    loopdev=$(losetup --find --show --direct-io=on "$B/xfs.img" 2>>"$B/logs/xfs.log") &&
    mkdir -p "$B/xfs" && mount "$loopdev" "$B/xfs" >>"$B/logs/xfs.log" 2>&1; then
    pools+=(xfs)
  else
    echo "snapshots: no XFS pool: $(tail -1 "$B/logs/xfs.log")"
  fi
fi
echo "snapshots: pools: ext4 = a directory on this checkout's filesystem ($fs_here: reflinks where it has them, else copies)$([ "${pools[-1]}" = xfs ] && echo ", xfs = XFS (reflink=1) on $loopdev over a sparse file there")"

"$HAWSER" controller --listen 127.0.0.1:9412 --data-dir "$B/controller" >"$B/logs/controller.log" 2>&1 &
pids+=($!)
# Cluster init: the controller makes the cluster CA and the API tokens in its data dir at first
# start; the agents join with a join token and talk TLS.
export HAWSER_TOKEN_FILE="$B/controller/admin.token"
export HAWSER_CA_FILE="$B/controller/ca.pem"
for _ in $(seq 1 100); do "$HAWSER" node list >/dev/null 2>&1 && break; sleep 0.1; done
"$HAWSER" cluster join-token --uses 2 >"$B/join.token"
for i in 1 2; do
  # The pool named "ext4" is whatever this directory's filesystem is (named for this machine).
  pool_args=(--pool "ext4=$B/s$i/pool-ext4")
  [ "${pools[-1]}" = xfs ] && pool_args+=(--pool "xfs=$B/xfs/s$i")
  "$HAWSER" agent --node "s$i" --data-dir "$B/s$i" --controller "$HAWSER_CONTROLLER" \
    --join-token-file "$B/join.token" "${pool_args[@]}" \
    --admin-listen "127.0.0.1:953$i" --replica-listen "127.0.0.1:963$i" --nbd-listen none \
    >"$B/logs/s$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 100); do
  n=$("$HAWSER" node list -o json 2>/dev/null | grep -o '"state": *"online"' | wc -l || true)
  [ "$n" -ge 2 ] && break
  sleep 0.1
done

new_volume() { # name, pool: 2 replicas, attached to s1
  "$HAWSER" volume create "$1" --size "$SIZE" --replicas 2 --pool "$2" >/dev/null
  "$HAWSER" volume attach "$1" --node s1 >/dev/null
}

pause_and_clone() { # pool
  local p="$1" v="pause-$1"
  new_volume "$v" "$p"
  fill "$v"
  local rw=(--name=rw --ioengine=nbd --uri="$(uri_of "$v")" --rw=randwrite --bs=4k --iodepth=32
    --size="$SIZE" --direct=1 --randrepeat=0 --time_based)
  local healthy; healthy=$(fio_field 49 "${rw[@]}" --runtime="$RUNTIME")
  # The same job again, stopped (SIGINT: fio still prints its numbers) after the snapshots.
  fio --minimal "${rw[@]}" --runtime=3600 >"$B/fio-$p.out" 2>"$B/logs/fio-$p.log" &
  fio_pid=$!
  sleep 1
  local t0 i out how="" failed=0; t0=$(now_ms)
  : >"$B/pauses-$p"
  for i in $(seq 1 "$COUNT"); do
    if ! out=$("$HAWSER" snapshot create "$v-$i" --volume "$v" 2>&1); then
      failed=$((failed + 1))
      echo "  snapshot $i failed: $out" >&2
    else
      out=$("$HAWSER" snapshot show "$v-$i" -o json)
      json_num pause_micros <<<"$out" >>"$B/pauses-$p"
      how=$(json_str how <<<"$out")
      "$HAWSER" snapshot delete "$v-$i" >/dev/null
    fi
    sleep 1
  done
  kill -INT "$fio_pid"
  wait "$fio_pid" || true
  fio_pid=""
  local ms=$(($(now_ms) - t0 + 1000))
  local during; during=$(tail -1 "$B/fio-$p.out" | cut -d';' -f49)
  sort -n "$B/pauses-$p" | awk -v p="$p" -v n="$COUNT" -v how="${how:--}" -v f="$failed" '
    { v[NR] = $1 }
    END {
      if (NR == 0) { printf "snapshots: %s: no snapshot of %s taken\n", p, n; exit }
      med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "snapshots: %s: write pause over %d snapshots (%d failed) under 4k QD32 random writes: median %.1f ms, max %.1f ms (how: %s)\n", p, NR, f, med / 1000, v[NR] / 1000, how
    }'
  echo "snapshots: $p: 4k QD32 random write IOPS: ${healthy} without snapshots (${RUNTIME} s), ${during} while snapshotting ($(secs "$ms") s); ratio $(ratio "$during" "$healthy")"
  # A copy's time grows with the data, a reflink's with the extents to share: every 4k write
  # after a reflink snapshot unshares its block (copy on write), so the data file ends up in
  # many small extents.
  echo "snapshots: $p: pauses in order (ms): $(awk '{ printf "%s%d", (NR > 1 ? " " : ""), $1 / 1000 }' "$B/pauses-$p"); s1's data file has $(extents "$(pool_dir "$p")/replicas/$v"-r*.data) extents now"

  # Clones of the fully written volume (still attached, no writes now), then of a snapshot.
  t0=$(now_ms)
  "$HAWSER" volume create "clone-$p" --from "volume:$v" >/dev/null
  local from_volume=$(($(now_ms) - t0))
  "$HAWSER" snapshot create "base-$p" --volume "$v" >/dev/null
  t0=$(now_ms)
  "$HAWSER" volume create "sclone-$p" --from "base-$p" >/dev/null
  local from_snapshot=$(($(now_ms) - t0))
  local in_sync; in_sync=$("$HAWSER" volume show "sclone-$p" -o json | grep -c '"state": *"in_sync"' || true)
  echo "snapshots: $p: clone of the written $SIZE volume (--from volume:, snapshot included) $(secs "$from_volume") s; clone of a snapshot $(secs "$from_snapshot") s (its replicas in sync: $in_sync)"
  "$HAWSER" volume delete "clone-$p" >/dev/null
  "$HAWSER" volume delete "sclone-$p" >/dev/null
  "$HAWSER" volume detach "$v" >/dev/null
  "$HAWSER" volume delete "$v" --with-snapshots >/dev/null
}

for p in "${pools[@]}"; do pause_and_clone "$p"; done

if [ "$TESTS" != none ]; then
  p="${pools[-1]}"
  for v in none snap10; do new_volume "t-$v" "$p"; fill "t-$v"; done
  t0=$(now_ms)
  for i in $(seq 1 10); do "$HAWSER" snapshot create "t-snap10-$i" --volume t-snap10 >/dev/null; done
  echo "snapshots: $p: 10 snapshots of the written volume taken in $(secs $(($(now_ms) - t0))) s; the fio tests on it (snap10) and on one without (none):"
  "$HAWSER" bench --runtime "$RUNTIME" --size "$SIZE" --tests "$TESTS" --no-prefill --no-charts \
    --json "$B/tests.json" --target "none=nbd:$(uri_of t-none)" --target "snap10=nbd:$(uri_of t-snap10)" \
    >"$B/tests.txt" 2>"$B/logs/bench.log"
  # The first table: a test's first row names it, the next ones only the target; columns
  # IOPS, MiB/s, ..., and last the ratio to the baseline (none: IOPS; MiB/s for 4M tests).
  awk -v p="$p" -v ts="$TESTS" '
    BEGIN { n = split(ts, t, ","); for (i = 1; i <= n; i++) test[t[i]] = 1 }
    $1 == "test" && $2 == "target" { table = 1; next }
    !table { next }
    NF == 0 { exit }
    ($1 in test) { cur = $1; $1 = ""; $0 = $0 }
    $1 == "none" { none = $2 " IOPS " $3 " MiB/s" }
    $1 == "snap10" {
      printf "snapshots: %s: %-15s with 10 snapshots / without: %s (%s IOPS %s MiB/s, without %s)\n", p, cur, $NF, $2, $3, none
    }' "$B/tests.txt"
  echo "snapshots: $p: extents of the data files on s1 after the tests: $(extents "$(pool_dir "$p")/replicas/t-none"-r*.data) without snapshots, $(extents "$(pool_dir "$p")/replicas/t-snap10"-r*.data) with 10"
fi
