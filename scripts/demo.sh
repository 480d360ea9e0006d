#!/usr/bin/env bash
# `make demo`: a 3-node Hawser cluster on this machine (loopback only), with a 2-replica 1 GiB
# volume "demo" attached on node n1 and served over NBD. Ctrl-C stops everything cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
HAWSER="$PWD/target/release/hawser"
DEMO="$PWD/.demo"
export HAWSER_CONTROLLER="https://127.0.0.1:9400"
pids=()

cleanup() {
  trap - INT TERM EXIT
  echo
  echo "stopping the demo cluster..."
  # Agents first (n1, which runs the engine, flushes to the others while they are still up),
  # then the controller: the reverse of the start order.
  for pid in "${pids[@]:1}" "${pids[0]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "stopped. Data is kept in $DEMO (rm -rf it to start afresh)."
}
trap cleanup INT TERM EXIT

for port in 9400 9501 9502 9503 9601 9602 9603 10809 10810 10811; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is in use (another demo running?); stop it first" >&2
    exit 1
  fi
done

mkdir -p "$DEMO/logs"
# setsid: Ctrl-C reaches only this script, which then stops the daemons in order.
setsid "$HAWSER" controller --listen 127.0.0.1:9400 --data-dir "$DEMO/controller" \
  >"$DEMO/logs/controller.log" 2>&1 &
pids+=($!)
# Cluster init: at its first start the controller makes the cluster CA (ca.pem, ca.key) and
# the API tokens in its data dir (keys and tokens mode 0600); it serves mutual TLS only.
export HAWSER_TOKEN_FILE="$DEMO/controller/admin.token"
export HAWSER_CA_FILE="$DEMO/controller/ca.pem"
for _ in $(seq 1 100); do "$HAWSER" node list >/dev/null 2>&1 && break; sleep 0.1; done
"$HAWSER" node list >/dev/null || { echo "the controller does not answer; see $DEMO/logs/controller.log" >&2; exit 1; }
# Each node joins once with a join token (one-time by default; here one for all three) and
# keeps its own certificate in <data-dir>/tls/; a restarted demo needs none.
"$HAWSER" cluster join-token --uses 3 --ttl-secs 600 >"$DEMO/join.token"
chmod 600 "$DEMO/join.token"
for i in 1 2 3; do
  setsid "$HAWSER" agent --node "n$i" --data-dir "$DEMO/n$i" \
    --join-token-file "$DEMO/join.token" \
    --admin-listen "127.0.0.1:950$i" --replica-listen "127.0.0.1:960$i" \
    --nbd-listen "127.0.0.1:$((10808 + i))" >"$DEMO/logs/n$i.log" 2>&1 &
  pids+=($!)
done

# Wait (bounded) until all three nodes have registered.
for _ in $(seq 1 100); do
  n=$("$HAWSER" node list -o json 2>/dev/null | grep -o '"state": *"online"' | wc -l || true)
  [ "$n" -ge 3 ] && break
  sleep 0.1
done
"$HAWSER" node list

if ! "$HAWSER" volume show demo >/dev/null 2>&1; then
  "$HAWSER" volume create demo --size 1GiB --replicas 2
fi
"$HAWSER" volume attach demo --node n1 >/dev/null
"$HAWSER" volume show demo
# The node's unix socket (mode 0600): local clients need no certificate. Over TCP the
# volume is nbds://127.0.0.1:10809/demo, which opens only to a client certificate that names
# it (`hawser volume client-cert demo --out DIR`).
uri="nbd+unix:///demo?socket=$DEMO/n1/nbd.sock"
cat <<MSG

Hawser is serving the replicated volume "demo" at:

    $uri

Try it (in another terminal):

    qemu-io -f raw $uri -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M'
    nbdinfo $uri
    fio --name=try --ioengine=nbd --uri=$uri --rw=randwrite --bs=4k --size=256M \\
        --iodepth=32 --verify=crc32c
    $HAWSER volume list        # with HAWSER_CONTROLLER=$HAWSER_CONTROLLER,
                               # HAWSER_TOKEN_FILE=$HAWSER_TOKEN_FILE
                               # and HAWSER_CA_FILE=$HAWSER_CA_FILE

The processes talk mutual TLS with certificates of the cluster's CA, made at cluster init
($DEMO/controller/ca.pem; its key beside it): each agent holds its own node certificate
in its data dir. The CLI sends the admin token ($DEMO/controller/admin.token) and trusts
only that CA. NBD over TCP needs a certificate of that CA too (STARTTLS); the unix socket
above is for the node's own users.

Logs: $DEMO/logs/. Press Ctrl-C to stop the cluster.
MSG
wait
