#!/usr/bin/env bash
# `make bench`, backup part (issue 43 acceptance e): how fast a node backs a volume up and
# restores it, as a ratio to this disk's sequential write, and the CPU each MiB costs.
# A local cluster (controller, one agent, TLS), a volume of BENCH_SIZE (default 1GiB), one
# replica, written in full with fio's random buffers (incompressible: zstd's worst case),
# and two targets: a real S3 server on loopback (SeaweedFS, built by make k8s-tools) and a
# directory on this filesystem. For each target:
#   1. a full backup (`hawser backup create --wait`; the agent's job time from its stats);
#   2. a second backup with nothing changed (every block hashed, none sent);
#   3. a restore into a new volume (`hawser volume create --from-backup`, until it is no
#      longer restoring).
# The baseline is fio's 4M sequential direct write of the same size to a file in the agent's
# pool directory, in the same run. CPU is the agent's (and the S3 server's) user+system time
# over the step, per MiB of the volume. `--backup-rate 0`: no rate limit, so this measures
# what a node can do, not the default limit of 200 MiB/s. Reported, never asserted.
# About 2 minutes at 1 GiB on a 2-vCPU VM.
set -euo pipefail
cd "$(dirname "$0")/.."
HAWSER="${HAWSER_BIN:-$PWD/target/release/hawser}"
WEED="${HAWSER_K8S_CACHE:-$HOME/.cache/hawser-k8s}/bin/weed"
B="$PWD/.bench-backup"
SIZE="${BENCH_SIZE:-1GiB}"
export HAWSER_CONTROLLER="https://127.0.0.1:9442"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
  rm -rf "$B"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$B" && mkdir -p "$B/logs" "$B/dir-target" "$B/s3/data"
[ -x "$WEED" ] || { echo "backup: no S3 server at $WEED: run make k8s-tools"; exit 1; }

now_ms() { date +%s%3N; }
json_num() { sed -n "s/.*\"$1\": *\([0-9][0-9]*\).*/\1/p" | head -1; }
json_str() { sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p" | head -1; }
# A process's user+system CPU time in milliseconds (/proc/PID/stat fields 14 and 15).
tick_ms=$((1000 / $(getconf CLK_TCK)))
cpu_ms() { awk -v t="$tick_ms" '{ print ($14 + $15) * t }' "/proc/$1/stat"; }
mib_s() { awk "BEGIN{printf \"%.0f\", $1 / 1048576 / ($2 > 0 ? $2 : 1) * 1000}"; }
per_mib() { awk "BEGIN{printf \"%.1f\", $1 / ($2 / 1048576)}"; }
ratio() { awk "BEGIN{printf \"%.2f\", $1 / ($2 > 0 ? $2 : 1)}"; }

# The S3 server: one SeaweedFS process (master, volume, filer and S3 gateway), an access key.
cat >"$B/s3/identities.json" <<'EOF'
{"identities": [{"name": "bench", "credentials": [{"accessKey": "AKBENCH", "secretKey": "benchsecret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
printf 'access_key_id = AKBENCH\nsecret_access_key = benchsecret\n' >"$B/s3/credentials"
chmod 600 "$B/s3/credentials"
"$WEED" server -dir="$B/s3/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false \
  -master.port=9443 -master.port.grpc=19443 -volume.port=9444 -volume.port.grpc=19444 \
  -filer.port=9445 -filer.port.grpc=19445 -s3 -s3.port=9446 -s3.port.grpc=19446 \
  -s3.port.iceberg=0 -s3.port.lance=0 -s3.config="$B/s3/identities.json" \
  >"$B/logs/weed.log" 2>&1 &
weed_pid=$!
pids+=("$weed_pid")
# The bucket, made by the filer once it answers (an unsigned POST of a folder; bash's own
# /dev/tcp, so no HTTP client is needed).
make_bucket() {
  exec 3<>/dev/tcp/127.0.0.1/9445 || return 1
  printf 'POST /buckets/backups/ HTTP/1.0\r\nContent-Length: 0\r\n\r\n' >&3
  local status; read -r _ status _ <&3 || true
  exec 3<&-
  [ "${status:-}" = 201 ] || [ "${status:-}" = 200 ]
}
for _ in $(seq 1 600); do make_bucket 2>/dev/null && break; sleep 0.1; done

"$HAWSER" controller --listen 127.0.0.1:9442 --data-dir "$B/controller" --backup-rate 0 \
  >"$B/logs/controller.log" 2>&1 &
pids+=($!)
export HAWSER_TOKEN_FILE="$B/controller/admin.token"
export HAWSER_CA_FILE="$B/controller/ca.pem"
for _ in $(seq 1 100); do "$HAWSER" node list >/dev/null 2>&1 && break; sleep 0.1; done
"$HAWSER" cluster join-token --uses 1 >"$B/join.token"
"$HAWSER" agent --node s1 --data-dir "$B/s1" --controller "$HAWSER_CONTROLLER" \
  --join-token-file "$B/join.token" --pool "default=$B/s1/pool" \
  --admin-listen 127.0.0.1:9447 --replica-listen 127.0.0.1:9448 --nbd-listen none \
  >"$B/logs/s1.log" 2>&1 &
agent_pid=$!
pids+=("$agent_pid")
for _ in $(seq 1 100); do
  nodes=$("$HAWSER" node list -o json 2>/dev/null || true)
  grep -q '"state": *"online"' <<<"$nodes" && break
  sleep 0.1
done
for _ in $(seq 1 600); do
  "$HAWSER" backup target add s3 --s3 http://127.0.0.1:9446 --bucket backups \
    --credentials-file "$B/s3/credentials" >"$B/logs/target.log" 2>&1 && break
  sleep 0.2
done
"$HAWSER" backup target add dir --dir "$B/dir-target" >/dev/null

"$HAWSER" volume create v --size "$SIZE" --replicas 1 >/dev/null
"$HAWSER" volume attach v --node s1 >/dev/null
bytes=$("$HAWSER" volume show v -o json | json_num size_bytes)
fio --minimal --name=fill --ioengine=nbd --uri="nbd+unix:///v?socket=$B/s1/nbd.sock" \
  --rw=write --bs=1M --iodepth=16 --size="$bytes" --direct=1 >/dev/null
"$HAWSER" volume detach v >/dev/null

# The baseline: this disk's sequential write, same size, same directory as the pool.
disk_kib=$(fio --minimal --name=disk --filename="$B/s1/pool/baseline" --rw=write --bs=4M \
  --size="$bytes" --direct=1 --ioengine=psync | tail -1 | cut -d';' -f48)
rm -f "$B/s1/pool/baseline"
disk=$((disk_kib / 1024))
echo "backup: the disk's sequential write (fio 4M, direct, in the pool's directory): $disk MiB/s; volume $SIZE of random data, 1 replica, no backup rate limit"

# One backup to target $1: prints its line; $2 names it (full or unchanged).
backup() {
  local t="$1" what="$2" a0 w0 a1 w1 out micros name sent
  a0=$(cpu_ms "$agent_pid"); w0=$(cpu_ms "$weed_pid")
  out=$("$HAWSER" backup create v --target "$t" --wait -o json)
  a1=$(cpu_ms "$agent_pid"); w1=$(cpu_ms "$weed_pid")
  micros=$(json_num micros <<<"$out")
  name=$(json_str name <<<"$out")
  sent=$(json_num stored_bytes <<<"$out")
  local ms=$((micros / 1000)) rate
  rate=$(mib_s "$bytes" "$ms")
  echo "backup: $what backup to $t: $(awk "BEGIN{printf \"%.1f\", $ms / 1000}") s, $rate MiB/s = $(ratio "$rate" "$disk") x the disk's sequential write; stored $((sent / 1048576)) MiB; CPU per MiB: agent $(per_mib $((a1 - a0)) "$bytes") ms$([ "$t" = s3 ] && echo ", S3 server $(per_mib $((w1 - w0)) "$bytes") ms")"
  last_backup=$name
}

restore() {
  local t="$1" r="r-$1" a0 w0 a1 w1 t0 t1
  a0=$(cpu_ms "$agent_pid"); w0=$(cpu_ms "$weed_pid"); t0=$(now_ms)
  "$HAWSER" volume create "$r" --from-backup "$t/$last_backup" --replicas 1 >/dev/null
  local shown
  while shown=$("$HAWSER" volume show "$r" -o json) && grep -q '"restoring"' <<<"$shown"; do
    sleep 0.1
  done
  t1=$(now_ms); a1=$(cpu_ms "$agent_pid"); w1=$(cpu_ms "$weed_pid")
  local rate; rate=$(mib_s "$bytes" $((t1 - t0)))
  echo "backup: restore from $t into a new volume: $(awk "BEGIN{printf \"%.1f\", ($t1 - $t0) / 1000}") s, $rate MiB/s = $(ratio "$rate" "$disk") x the disk's sequential write; CPU per MiB: agent $(per_mib $((a1 - a0)) "$bytes") ms$([ "$t" = s3 ] && echo ", S3 server $(per_mib $((w1 - w0)) "$bytes") ms")"
  "$HAWSER" volume delete "$r" >/dev/null
}

for t in s3 dir; do
  backup "$t" full
  backup "$t" unchanged
  restore "$t"
done
