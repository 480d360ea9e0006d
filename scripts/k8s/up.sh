#!/usr/bin/env bash
# Starts a real single-node Kubernetes on this machine, on loopback only, for Hawser's CSI
# tests: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (v1.33, built by
# build.sh), containerd with its own root and socket, and one kubelet whose --root-dir is
# STATE_DIR/kubelet (so CSI plugin paths are STATE_DIR/kubelet/plugins_registry and
# STATE_DIR/kubelet/plugins/<driver>/csi.sock). Writes STATE_DIR/env and
# STATE_DIR/admin.kubeconfig. On failure it prints the relevant log, tears down and exits 1.
#
# usage: scripts/k8s/up.sh STATE_DIR        (scripts/k8s/down.sh STATE_DIR undoes it)
#
# With HAWSER_K8S_NODES=2 a second node runs in the network namespace hawser-k8s-2 (its own
# containerd, kubelet and cgroup root; address 10.98.2.2, reaching the API server through a
# veth pair), so a test can cut it off or kill everything on it like a power loss. Its
# paths are under STATE_DIR/node2 (env: K8S_NODE2, NODE2_NETNS, NODE2_IP, KUBELET2_ROOT,
# CONTAINERD2_SOCK, POD_LOGS2).
#
# Settings this machine needs (see ../shared/k8s/README.md of the project workspace):
# - containerd's CRI plugin with restrict_oom_score_adj (no CAP_SYS_RESOURCE here),
#   runc without systemd cgroups, its own CNI conf dir;
# - kubelet with cgroupDriver cgroupfs and failCgroupV1 false (cgroups are hybrid v1).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -eq 1 ] || { echo "usage: $0 STATE_DIR" >&2; exit 2; }
mkdir -p "$1"
S="$(cd "$1" && pwd)"
NODE=hawser-k8s-1
NODES=${HAWSER_K8S_NODES:-1}
# The kubelets' log level; 4 shows the volume manager's reconciler and populator.
KUBELET_V=${HAWSER_KUBELET_V:-2}
# How often the kubelets report node status, Kubernetes' default unless told (docs/csi.md,
# "Failover"): a kubelet mounts a newly attached volume only after a report lists it in use.
KUBELET_STATUS_SECS=${HAWSER_KUBELET_STATUS_SECS:-10}
# Node addresses: kubelets refuse a loopback node IP, and pods on the host network get the
# node's (the API server listens on node 1's).
NODE_IP=${HAWSER_K8S_NODE_IP:-10.98.0.1}
NODE2=hawser-k8s-2 NODE2_NETNS=hawser-k8s-2 NODE2_IP=10.98.2.2 NODE2_GW=10.98.2.1
# Fixed ports, away from Hawser's (9400-9700, 10809-10830), from the ephemeral range and from
# the ports the test processes pick (hawser-testkit's TEST_PORTS, 20000-31999): another test
# runs beside this cluster (.config/nextest.toml) and must never take one of them first.
ETCD_PORT=18379 ETCD_PEER=18380 API_PORT=18443
KUBELET_PORT=18250 KUBELET_HEALTHZ=18248 CM_PORT=18257 SCHED_PORT=18259
export DEBIAN_FRONTEND=noninteractive

need=""
for c in containerd runc etcd busybox gcc openssl iptables; do
  command -v $c >/dev/null 2>&1 || need="$need $c"
done
[ -x /usr/lib/cni/bridge ] || need="$need cni"
if [ -n "$need" ]; then
  echo "installing packages (missing:$need)" >&2
  apt-get update -qq && apt-get install -y -qq containerd runc etcd-server \
    containernetworking-plugins busybox-static gcc libc6-dev openssl iptables >/dev/null
fi
BIN="$("$here/build.sh" | tail -n 1)"
mkdir -p "$S/logs" "$S/pids" "$S/pki" "$S/kubelet" "$S/cni/net.d" "$S/containerd"

fail() {
  echo "up.sh: $1" >&2
  if [ -n "${2:-}" ] && [ -f "$S/logs/$2.log" ]; then
    echo "--- last lines of $2.log ---" >&2
    tail -n 40 "$S/logs/$2.log" >&2
  fi
  "$here/down.sh" "$S" >&2 || true
  exit 1
}

# start NAME CMD...: runs a daemon in its own session, its log and pid in STATE_DIR.
start() {
  local name=$1; shift
  setsid "$@" >"$S/logs/$name.log" 2>&1 < /dev/null &
  echo $! >"$S/pids/$name.pid"
}

# wait_for WHAT SECONDS CMD...: polls CMD every 0.2 s until it succeeds.
wait_for() {
  local what=$1 secs=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.2
  done
  echo "  $what ready after $((SECONDS - t0))s" >&2
}
t0=$SECONDS

# What the kubelet changes on the host, recorded so down.sh puts it back.
for k in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
         kernel/keys/root_maxkeys kernel/keys/root_maxbytes net/ipv4/ip_forward \
         net/bridge/bridge-nf-call-iptables; do
  if [ -f "/proc/sys/$k" ]; then echo "$k=$(cat "/proc/sys/$k")"; fi
done >"$S/sysctls.before"
ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort >"$S/links.before"
# Host paths the kubelet uses whatever its --root-dir: the device-plugin socket directory and
# the container log links.
for p in /var/lib/kubelet /var/log/containers; do if [ -e "$p" ]; then echo "$p"; fi; done >"$S/paths.before"
ip netns list 2>/dev/null | awk '{print $1}' | sort >"$S/netns.before"
iptables-save 2>/dev/null | grep -E '^:KUBE-' | cut -d' ' -f1 | sort -u >"$S/chains.before" || true

# --- credentials ---
if [ ! -f "$S/tokens.csv" ]; then
  tok() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
  ADMIN=$(tok) KUBELET=$(tok) CM=$(tok) SCHED=$(tok)
  cat >"$S/tokens.csv" <<CSV
$ADMIN,admin,admin,"system:masters"
$KUBELET,system:node:$NODE,kubelet,"system:nodes"
$(tok),system:node:$NODE2,kubelet2,"system:nodes"
$CM,system:kube-controller-manager,cm,"system:masters"
$SCHED,system:kube-scheduler,sched,"system:masters"
CSV
  openssl genrsa -out "$S/pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$S/pki/sa.key" -pubout -out "$S/pki/sa.pub" 2>/dev/null
fi
token_of() { awk -F, -v u="$1" '$2==u {print $1}' "$S/tokens.csv"; }
kubeconfig() {
  cat >"$S/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://$NODE_IP:$API_PORT", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: "$(token_of "$2")"}
contexts:
- name: local
  context: {cluster: local, user: u, namespace: default}
current-context: local
KC
}
kubeconfig admin admin
kubeconfig kubelet "system:node:$NODE"
kubeconfig kubelet2 "system:node:$NODE2"
kubeconfig cm system:kube-controller-manager
kubeconfig sched system:kube-scheduler
KUBECTL=("$BIN/kubectl" --kubeconfig "$S/admin.kubeconfig")

# --- images (no registry): pause and busybox, cached ---
IMG="${HAWSER_K8S_CACHE:-$HOME/.cache/hawser-k8s}/images"
mkdir -p "$IMG"
if [ ! -s "$IMG/pause.tar" ] || [ "$here/pause.c" -nt "$IMG/pause.tar" ]; then
  r=$(mktemp -d)
  gcc -static -O2 -o "$r/pause" "$here/pause.c"
  python3 "$here/image.py" "$r" hawser.local/pause:1 "$IMG/pause.tar" /pause
  rm -rf "$r"
fi
if [ ! -s "$IMG/busybox.tar" ] || [ "$here/image.py" -nt "$IMG/busybox.tar" ]; then
  r=$(mktemp -d)
  mkdir -p "$r/bin" "$r/tmp" "$r/etc" "$r/dev" "$r/proc" "$r/sys" "$r/data"
  chmod 1777 "$r/tmp"
  cp "$(command -v busybox)" "$r/bin/busybox"
  for a in $("$r/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$r/bin/$a"; done
  echo "root:x:0:0:root:/:/bin/sh" >"$r/etc/passwd"
  python3 "$here/image.py" "$r" hawser.local/busybox:1 "$IMG/busybox.tar" /bin/sh
  rm -rf "$r"
fi

# --- network: node 1's address (a host-local veth pair: no dummy driver on every kernel),
# node 2's namespace. down.sh removes the links and namespaces that appeared. ---
if ! ip -o addr show | grep -q " inet $NODE_IP/"; then
  ip link add hawserk8s0 type veth peer name hawserk8s1
  ip addr add "$NODE_IP/32" dev hawserk8s0
  ip link set hawserk8s0 up
  ip link set hawserk8s1 up
fi
if [ "$NODES" -ge 2 ]; then
  ip netns add "$NODE2_NETNS"
  ip -n "$NODE2_NETNS" link set lo up
  ip link add hawserk8s2 type veth peer name eth0 netns "$NODE2_NETNS"
  ip addr add "$NODE2_GW/24" dev hawserk8s2
  ip link set hawserk8s2 up
  ip -n "$NODE2_NETNS" addr add "$NODE2_IP/24" dev eth0
  ip -n "$NODE2_NETNS" link set eth0 up
  ip -n "$NODE2_NETNS" route add default via "$NODE2_GW"
  # While a test has hawserk8s2 down (node 2 lost power), its subnet's route is gone: this
  # one, behind it, makes node 2 unreachable then, as a dead host on a LAN is, instead of
  # sending its packets out of the machine by the default route.
  ip route replace unreachable "${NODE2_IP%.*}.0/24" metric 4000
fi

# --- etcd, apiserver ---
start etcd etcd --name default --data-dir "$S/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "default=http://127.0.0.1:$ETCD_PEER"
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
  --cert-dir "$S/pki" --token-auth-file "$S/tokens.csv" --authorization-mode Node,RBAC \
  --allow-privileged=true --service-account-key-file "$S/pki/sa.pub" \
  --service-account-signing-key-file "$S/pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc \
  --service-cluster-ip-range 10.96.0.0/24 --endpoint-reconciler-type none
wait_for "kube-apiserver" 90 "${KUBECTL[@]}" get --raw /readyz || fail "kube-apiserver not ready" kube-apiserver

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$S/cm.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port "$CM_PORT" \
  --service-account-private-key-file "$S/pki/sa.key" --root-ca-file "$S/pki/apiserver.crt" \
  --use-service-account-credentials=true
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$S/sched.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port "$SCHED_PORT"

# start_node N NAME IP DIR [PREFIX...]: containerd and a kubelet for node N, their state in
# DIR, each started through PREFIX (nsenter into the network namespace of node 2).
start_node() {
  local n=$1 name=$2 ip=$3 d=$4; shift 4
  local pre=("$@") sfx="" cgroot="/"
  if [ "$n" -gt 1 ]; then sfx="-$n" cgroot="/$name"; fi
  mkdir -p "$d/kubelet" "$d/cni/net.d" "$d/containerd"
  local sock="$d/containerd/containerd.sock"
  cat >"$d/containerd/config.toml" <<TOML
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "hawser.local/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni/net.d"
TOML
  cat >"$d/cni/net.d/10-hawser.conflist" <<CNI
{"cniVersion": "0.4.0", "name": "hawser-k8s", "plugins": [
  {"type": "bridge", "bridge": "hawsercni$((n - 1))", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.$((n - 1)).0/24"}]],
            "dataDir": "$d/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
CNI
  start "containerd$sfx" "${pre[@]}" containerd --config "$d/containerd/config.toml"
  wait_for "containerd$sfx" 30 ctr -a "$sock" version || fail "containerd$sfx did not start" "containerd$sfx"
  for i in pause busybox; do
    ctr -a "$sock" -n k8s.io images import "$IMG/$i.tar" >>"$S/logs/images.log" 2>&1 \
      || fail "importing the $i image failed" images
  done
  # A cgroup root of its own (the kubelet requires it to exist), so kubelets do not take
  # each other's pod cgroups for orphans.
  if [ "$cgroot" != / ]; then
    for h in /sys/fs/cgroup/*/; do
      [ -f "$h/cgroup.procs" ] || continue
      mkdir -p "$h$name"
      if [ -f "$h/cpuset.cpus" ]; then
        cat "$h/cpuset.cpus" >"$h$name/cpuset.cpus"
        cat "$h/cpuset.mems" >"$h$name/cpuset.mems"
      fi
    done
  fi
  cat >"$d/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: $cgroot
failCgroupV1: false
containerRuntimeEndpoint: unix://$sock
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
failSwapOn: false
podLogsDir: $d/pod-logs
enforceNodeAllocatable: []
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
fileCheckFrequency: 1s
syncFrequency: 5s
nodeStatusUpdateFrequency: ${KUBELET_STATUS_SECS}s
YAML
  local kc="$S/kubelet.kubeconfig"
  [ "$n" -eq 1 ] || kc="$S/kubelet$n.kubeconfig"
  start "kubelet$sfx" "${pre[@]}" "$BIN/kubelet" --config "$d/kubelet/config.yaml" --kubeconfig "$kc" \
    --root-dir "$d/kubelet" --cert-dir "$d/kubelet/pki" --hostname-override "$name" \
    --node-ip "$ip" --v="$KUBELET_V"
  if [ "$n" -gt 1 ]; then
    # What boots the node again after a test cut its power (killed everything on it).
    local pre_q
    pre_q=$(printf '%q ' "${pre[@]}")
    cat >"$d/power-on.sh" <<EOF
#!/usr/bin/env bash
# Node $n again after a power loss: containerd, then the kubelet, as up.sh started them.
set -e
setsid $pre_q containerd --config '$d/containerd/config.toml' >>'$S/logs/containerd$sfx.log' 2>&1 </dev/null &
echo \$! >'$S/pids/containerd$sfx.pid'
for _ in \$(seq 150); do ctr -a '$sock' version >/dev/null 2>&1 && break; sleep 0.2; done
setsid $pre_q '$BIN/kubelet' --config '$d/kubelet/config.yaml' --kubeconfig '$kc' --root-dir '$d/kubelet' --cert-dir '$d/kubelet/pki' --hostname-override '$name' --node-ip '$ip' --v=$KUBELET_V >>'$S/logs/kubelet$sfx.log' 2>&1 </dev/null &
echo \$! >'$S/pids/kubelet$sfx.pid'
EOF
  fi
}
node_ready() {
  [ "$("${KUBECTL[@]}" get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
start_node 1 "$NODE" "$NODE_IP" "$S"
if [ "$NODES" -ge 2 ]; then
  # nsenter, not `ip netns exec`: that one also makes a mount namespace, and the node's
  # mounts (CSI staging, pod volumes) must be the host's, as on a real node.
  start_node 2 "$NODE2" "$NODE2_IP" "$S/node2" nsenter --net="/run/netns/$NODE2_NETNS"
fi
wait_for "node $NODE" 120 node_ready "$NODE" || fail "node $NODE is not Ready" kubelet
if [ "$NODES" -ge 2 ]; then
  wait_for "node $NODE2" 120 node_ready "$NODE2" || fail "node $NODE2 is not Ready" kubelet-2
fi
wait_for "default service account" 60 "${KUBECTL[@]}" get serviceaccount default \
  || fail "no default service account" kube-controller-manager

cat >"$S/env" <<ENV
KUBECONFIG=$S/admin.kubeconfig
K8S_BIN=$BIN
KUBELET_ROOT=$S/kubelet
CONTAINERD_SOCK=$S/containerd/containerd.sock
K8S_NODE=$NODE
NODE_IP=$NODE_IP
API_SERVER=https://$NODE_IP:$API_PORT
K8S_NODE2=$NODE2
NODE2_NETNS=$NODE2_NETNS
NODE2_IP=$NODE2_IP
KUBELET2_ROOT=$S/node2/kubelet
CONTAINERD2_SOCK=$S/node2/containerd/containerd.sock
POD_LOGS2=$S/node2/pod-logs
NODE2_POWER_ON=$S/node2/power-on.sh
PIDS="$(cat "$S"/pids/*.pid | tr '\n' ' ')"
ENV
echo "Kubernetes is up in $((SECONDS - t0))s: KUBECONFIG=$S/admin.kubeconfig" >&2
