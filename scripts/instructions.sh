#!/usr/bin/env bash
# `make instructions`: instructions the agents execute per request, counted by
# `valgrind --tool=callgrind` over a fixed fio workload. Unlike `make bench`'s CPU time this
# does not depend on how noisy the machine is: the same binary and workload give nearly the
# same count (thread interleaving, and so how many requests one wake-up handles, still moves
# it a little), so it shows a change in CPU per request that a timed run would drown.
#
# Both agents run under callgrind with instrumentation off until the volumes are attached;
# then, for each workload, the counters are zeroed, fio runs, and the counters are dumped.
# Workloads (NBD over a unix socket, fio's nbd engine, fixed seed, INSTR_IOS requests each):
# 4k random writes and reads at queue depth 1 and 16, on a 1-replica and a 2-replica volume
# (the 2-replica volume's replicas on both agents, the engine on b1).
# Prints Ir (instructions) per request for each agent and both together, and writes
# instructions-results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
HAWSER="$PWD/target/release/hawser"
D="$PWD/.instructions"
IOS="${INSTR_IOS:-2000}"
OUT="$PWD/instructions-results.json"
export HAWSER_CONTROLLER="https://127.0.0.1:9440"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  # INSTR_KEEP=DIR keeps the callgrind dumps (one per workload and agent) for callgrind_annotate.
  if [ -n "${INSTR_KEEP:-}" ]; then mkdir -p "$INSTR_KEEP" && cp "$D"/cg/* "$D"/logs/* "$INSTR_KEEP"/ 2>/dev/null || true; fi
  rm -rf "$D"
}
trap cleanup EXIT INT TERM
rm -rf "$D" && mkdir -p "$D/logs" "$D/cg"

"$HAWSER" controller --listen 127.0.0.1:9440 --data-dir "$D/controller" >"$D/logs/controller.log" 2>&1 &
pids+=($!)
export HAWSER_TOKEN_FILE="$D/controller/admin.token"
export HAWSER_CA_FILE="$D/controller/ca.pem"
for _ in $(seq 1 100); do "$HAWSER" node list >/dev/null 2>&1 && break; sleep 0.1; done
"$HAWSER" cluster join-token --uses 2 >"$D/join.token"
for i in 1 2; do
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$D/cg/b$i.%p" \
    "$HAWSER" agent --node "i$i" --data-dir "$D/i$i" --controller "$HAWSER_CONTROLLER" \
    --join-token-file "$D/join.token" \
    --admin-listen "127.0.0.1:954$i" --replica-listen "127.0.0.1:964$i" --nbd-listen none \
    >"$D/logs/i$i.log" 2>&1 &
  pids+=($!)
  eval "agent$i=$!"
done
# Under valgrind an agent starts in seconds, not milliseconds.
for _ in $(seq 1 600); do
  n=$("$HAWSER" node list -o json 2>/dev/null | grep -o '"state": *"online"' | wc -l || true)
  [ "$n" -ge 2 ] && break
  sleep 0.1
done
[ "$n" -ge 2 ] || { echo "agents did not come online; logs in $D/logs" >&2; tail -20 "$D"/logs/*.log >&2; exit 1; }
"$HAWSER" volume create instr1 --size 256MiB --replicas 1 >/dev/null
"$HAWSER" volume create instr2 --size 256MiB --replicas 2 >/dev/null
"$HAWSER" volume attach instr1 --node i1 >/dev/null
"$HAWSER" volume attach instr2 --node i1 >/dev/null
sock="$D/i1/nbd.sock"
for _ in $(seq 1 600); do [ -S "$sock" ] && break; sleep 0.1; done

# The regions the reads hit are written first, so reads never find holes.
fill() {
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///$1?socket=$sock" --rw=write --bs=1M \
    --iodepth=4 --size=64MiB --output=/dev/null
}
fill instr1
fill instr2

# Every replica of volume $1 in sync and connected, by the store and by its engine, with
# nothing left to copy: a session dropped under valgrind is resynced before the next workload.
whole() {
  "$HAWSER" volume show "$1" -o json 2>/dev/null | python3 -c '
import json, sys
v = json.load(sys.stdin)
ok = all(r["state"] == "in_sync" and (r.get("engine") or {}).get("state") == "in_sync"
         and (r.get("engine") or {}).get("connected") and (r.get("engine") or {}).get("dirty_bytes") == 0
         for r in v["replicas"])
sys.exit(0 if ok else 1)'
}
wait_whole() {
  for _ in $(seq 1 1200); do whole "$1" && return 0; sleep 0.5; done
  echo "volume $1 did not get whole again; logs in $D/logs" >&2
  exit 1
}

callgrind_control -i on "$agent1" "$agent2" >/dev/null 2>&1
results=()
for vol in instr1 instr2; do
  for rw in randwrite randread; do
    for qd in 1 16; do
      name="$vol-$rw-qd$qd"
      # Under valgrind a replica can miss its watchdog and be reconnected and resynced, whose
      # cost would land on the workload: such a workload runs again (up to 3 times in all)
      # once the volume is whole, and a row that never ran clean is flagged.
      for attempt in 1 2 3; do
        wait_whole "$vol"
        before=$(ls "$D"/cg | wc -l)
        drops_before=$(cat "$D"/logs/i*.log | grep -c "replica connection lost" || true)
        callgrind_control -z "$agent1" "$agent2" >/dev/null 2>&1
        fio --name="$name" --ioengine=nbd --uri="nbd+unix:///$vol?socket=$sock" --rw="$rw" \
          --bs=4k --iodepth="$qd" --size=64MiB --number_ios="$IOS" --randrepeat=1 --randseed=7 \
          --output-format=json --output="$D/$name.json"
        callgrind_control --dump="$name" "$agent1" "$agent2" >/dev/null 2>&1
        # callgrind_control returns once both dumps are written: exactly two new files.
        after=$(ls "$D"/cg | wc -l)
        [ "$after" -eq $((before + 2)) ] || { echo "expected 2 new callgrind dumps for $name, got $((after - before))" >&2; exit 1; }
        drops_after=$(cat "$D"/logs/i*.log | grep -c "replica connection lost" || true)
        [ "$drops_after" -eq "$drops_before" ] && break
        echo "$name: a replica session dropped (attempt $attempt); running it again" >&2
      done
      done_ios=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]; print(j['read']['total_ios']+j['write']['total_ios'])" "$D/$name.json")
      ir=()
      for i in 1 2; do
        # The newest dump of agent i; its summary line is the total over all threads.
        f=$(ls -t "$D"/cg/b$i.*.* 2>/dev/null | head -1)
        ir+=("$(awk '/^summary:/ {print $2}' "$f" 2>/dev/null || echo 0)")
      done
      results+=("$name $done_ios ${ir[0]} ${ir[1]} $((drops_after - drops_before))")
    done
  done
done

python3 - "$OUT" "${results[@]}" <<'EOF'
import json, sys
out, rows = sys.argv[1], [r.split() for r in sys.argv[2:]]
print(f"{'workload':<22} {'requests':>8} {'i1 Ir/req':>11} {'i2 Ir/req':>11} {'total Ir/req':>13}")
doc = []
for name, ios, a, b, drops in rows:
    ios, a, b, drops = int(ios), int(a), int(b), int(drops)
    per = lambda x: x / ios if ios else float("nan")
    note = f"  (a replica session dropped {drops}x in the last of 3 attempts: resync included)" if drops else ""
    print(f"{name:<22} {ios:>8} {per(a):>11.0f} {per(b):>11.0f} {per(a + b):>13.0f}{note}")
    doc.append({"workload": name, "requests": ios, "agent_i1_ir": a, "agent_i2_ir": b,
                "ir_per_request": per(a + b), "session_drops": drops})
json.dump({"tool": "valgrind --tool=callgrind", "results": doc}, open(out, "w"), indent=2)
print(f"results: {out}")
EOF
