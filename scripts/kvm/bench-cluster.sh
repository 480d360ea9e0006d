# Sourced by the guest benches (bench-frontends.sh, bench-ublk-settings.sh), inside the guest:
# a controller and two agents (b1, b2) of target/release/hawser under $B, started and waited
# for until both nodes are online. Sets HAWSER (the binary), the client's environment
# (HAWSER_CONTROLLER, HAWSER_TOKEN_FILE, HAWSER_CA_FILE) and `agents` (the agents' PIDs).
HAWSER="$PWD/target/release/hawser"
export HAWSER_CONTROLLER="https://127.0.0.1:9410"
export HAWSER_TOKEN_FILE="$B/controller/admin.token" HAWSER_CA_FILE="$B/controller/ca.pem"
mkdir -p "$B/logs"
"$HAWSER" controller --listen 127.0.0.1:9410 --data-dir "$B/controller" >"$B/logs/controller.log" 2>&1 &
for _ in $(seq 1 300); do "$HAWSER" node list >/dev/null 2>&1 && break; sleep 0.2; done
"$HAWSER" cluster join-token --uses 2 >"$B/join.token"
agents=()
for i in 1 2; do
  "$HAWSER" agent --node "b$i" --data-dir "$B/b$i" --controller "$HAWSER_CONTROLLER" \
    --join-token-file "$B/join.token" \
    --admin-listen "127.0.0.1:952$i" --replica-listen "127.0.0.1:962$i" --nbd-listen none \
    >"$B/logs/b$i.log" 2>&1 &
  agents+=($!)
done
for _ in $(seq 1 300); do
  n=$("$HAWSER" node list -o json 2>/dev/null | grep -o '"state": *"online"' | wc -l || true)
  [ "$n" -ge 2 ] && break
  sleep 0.2
done
