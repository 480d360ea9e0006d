#!/bin/bash
# 4k QD1 latency of a 2-replica volume with and without TLS between the processes, side by
# side in one run (ratios in one run mean more than absolute numbers on a noisy machine).
#
#   scripts/bench-tls.sh [rounds] [seconds]      (default 2 rounds of 15 s per job)
#
# Each round starts a controller (plaintext with --insecure, then TLS, the default) and two agents on loopback, creates
# and attaches a 1 GiB volume with 2 replicas, and runs fio's nbd engine against it:
# randwrite with an fsync after every write, then randread (served by the local replica).
# Needs fio with the nbd engine (make deps) and target/release/hawser (make build).
set -euo pipefail
ROUNDS=${1:-2}
SECS=${2:-15}
B=${HAWSER_BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/hawser}
BASE=$(mktemp -d /tmp/hawser-bench-tls.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$BASE"
}
trap cleanup EXIT

one() { # mode round
    local mode=$1 d="$BASE/$1-$2" port=$((29400 + RANDOM % 500)) scheme=http cli auth
    mkdir -p "$d"
    local tls=()
    [ "$mode" = tls ] && scheme=https
    [ "$mode" = plain ] && tls=(--insecure)
    "$B" controller "${tls[@]}" --listen 127.0.0.1:$port --data-dir "$d/c" \
        --admin-token-file "$d/admin.token" --agent-token-file "$d/agent.token" 2>"$d/c.log" &
    PIDS+=($!)
    cli=("$B" --controller "$scheme://127.0.0.1:$port" --token-file "$d/admin.token")
    [ "$mode" = tls ] && cli+=(--ca-file "$d/c/ca.pem")
    for _ in $(seq 100); do "${cli[@]}" node list >/dev/null 2>&1 && break; sleep 0.1; done
    if [ "$mode" = tls ]; then
        "${cli[@]}" cluster join-token --uses 2 >"$d/join.token"
        auth=(--join-token-file "$d/join.token")
    else
        auth=(--insecure --token-file "$d/agent.token")
    fi
    for n in 1 2; do
        "$B" agent --node n$n --controller "$scheme://127.0.0.1:$port" "${auth[@]}" \
            --data-dir "$d/n$n" --admin-listen 127.0.0.1:$((port + 10 + n)) \
            --replica-listen 127.0.0.1:$((port + 20 + n)) \
            --nbd-listen 127.0.0.1:$((port + 30 + n)) 2>"$d/n$n.log" &
        PIDS+=($!)
    done
    for _ in $(seq 100); do
        [ "$("${cli[@]}" node list 2>/dev/null | grep -c online)" = 2 ] && break
        sleep 0.1
    done
    "${cli[@]}" volume create v --size 1GiB --replicas 2 >/dev/null
    "${cli[@]}" volume attach v --node n1 >/dev/null
    local uri
    uri=$("${cli[@]}" volume show v -o json | python3 -c 'import json,sys;print(json.load(sys.stdin)["nbd_unix_uri"])')
    for job in "randwrite --fsync=1" "randread"; do
        # shellcheck disable=SC2086
        set -- $job
        fio --name=t --ioengine=nbd --uri="$uri" --rw="$1" ${2:-} --bs=4k --iodepth=1 \
            --size=256m --time_based --runtime="$SECS" --output-format=json >"$d/fio.json" 2>/dev/null
        python3 - "$d/fio.json" "$mode" "$1" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]
for k in ("write", "read"):
    if j[k]["io_bytes"] > 0:
        c = j[k]["clat_ns"]
        print(f"{sys.argv[2]:5} {sys.argv[3]:9} iops {j[k]['iops']:8.0f}  clat mean {c['mean']/1000:7.1f} us"
              f"  p99 {c['percentile']['99.000000']/1000:7.1f} us")
PY
    done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    PIDS=()
}

for r in $(seq "$ROUNDS"); do
    one plain "$r"
    one tls "$r"
done
