#!/usr/bin/env bash
# Stops what scripts/k8s/up.sh STATE_DIR started and puts the host back: pods first (so the
# kubelets unpublish and unstage their CSI volumes), then the kubelets (node 2's too), the containers and
# shims of this containerd, containerd, the controllers, the apiserver and etcd; then mounts
# under STATE_DIR, the kubelet's cgroups, the CNI bridge and netns, the iptables chains the
# kubelet added and the sysctls it changed. Idempotent; safe after a half-done up.sh. Only
# processes up.sh started (by their recorded pids) and shims of its own socket are stopped.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 STATE_DIR" >&2; exit 2; }
[ -d "$1" ] || exit 0
S="$(cd "$1" && pwd)"
BIN="$(grep -s '^K8S_BIN=' "$S/env" | cut -d= -f2)"

alive() { [ -f "$S/pids/$1.pid" ] && kill -0 "$(cat "$S/pids/$1.pid")" 2>/dev/null; }

# stop NAME [SECONDS]: SIGTERM, then SIGKILL after the bound; waits until it is gone.
stop() {
  local name=$1 secs=${2:-10} pid
  [ -f "$S/pids/$name.pid" ] || return 0
  pid=$(cat "$S/pids/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    local end=$((SECONDS + secs))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$S/pids/$name.pid"
}

# 1. Pods, while the kubelet and the CSI driver still run: their volumes get unpublished.
if alive kubelet && alive kube-apiserver && [ -x "$BIN/kubectl" ]; then
  K=("$BIN/kubectl" --kubeconfig "$S/admin.kubeconfig" --request-timeout 10s)
  "${K[@]}" delete pods --all --all-namespaces --grace-period=1 --wait=false >/dev/null 2>&1
  end=$((SECONDS + 60))
  while [ $SECONDS -lt $end ] && [ -n "$("${K[@]}" get pods -A -o name 2>/dev/null)" ]; do
    sleep 0.3
  done
  # Pods of a node that is gone (cut off by a test) are never confirmed: drop them.
  "${K[@]}" delete pods --all --all-namespaces --force --grace-period=0 >/dev/null 2>&1
fi

# 2. The kubelets, then the shims of their containerds and the containerds themselves.
stop kubelet 20
stop kubelet-2 20
for sock in "$S/containerd/containerd.sock" "$S/node2/containerd/containerd.sock"; do
  for pid in $(pgrep -f "containerd-shim.*-address $sock" 2>/dev/null); do
    kill -KILL "$pid" 2>/dev/null
  done
done
stop containerd 20
stop containerd-2 20
stop kube-scheduler
stop kube-controller-manager
stop kube-apiserver 20
stop etcd

# 3. Mounts under STATE_DIR (deepest first; lazily if busy).
for m in $(awk -v s="$S" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-); do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
done

# 4. The kubelet's cgroups (leaves first), in every v1 hierarchy and in v2.
for root in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/hawser-k8s-2; do
  [ -d "$root" ] || continue
  find "$root" -depth -type d -exec rmdir {} \; 2>/dev/null
done

# 5. Network: the CNI bridge, netns and links that appeared, the kubelet's iptables chains.
if [ -f "$S/links.before" ]; then
  for l in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | comm -13 "$S/links.before" -); do
    case "$l" in hawsercni*|hawserk8s*|veth*) ip link del "$l" 2>/dev/null ;; esac
  done
fi
# up.sh's fallback route for node 2's subnet (10.98.2.0/24 unless HAWSER_K8S_* said so).
ip route show type unreachable 2>/dev/null | awk '$0 ~ /metric 4000/ {print $2}' |
  while read -r net; do ip route del unreachable "$net" metric 4000 2>/dev/null; done
if [ -f "$S/netns.before" ]; then
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | sort | comm -13 "$S/netns.before" -); do
    case "$n" in
      cni-*) ip netns del "$n" 2>/dev/null ;;
      hawser-k8s-*)
        # A node in a namespace: whatever still runs there (a test's agent) goes with it.
        for pid in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
        ip netns del "$n" 2>/dev/null ;;
    esac
  done
fi
if [ -f "$S/chains.before" ]; then
  for table in filter nat mangle; do
    for c in $(iptables -t $table -S 2>/dev/null | awk '$1=="-N" && $2 ~ /^KUBE-/ {print $2}'); do
      grep -qx ":$c" "$S/chains.before" && continue
      iptables -t $table -S 2>/dev/null | awk -v c="$c" '$1=="-A" && $0 ~ ("-j " c "( |$)") {sub("^-A", "-D"); print}' |
        while read -r rule; do eval iptables -t $table $rule 2>/dev/null; done
      iptables -t $table -F "$c" 2>/dev/null
      iptables -t $table -X "$c" 2>/dev/null
    done
  done
fi

# 6. Host paths the kubelet made outside STATE_DIR: removed if they were not there before;
#    else only the container log links into STATE_DIR go.
if [ -f "$S/paths.before" ]; then
  for p in /var/lib/kubelet /var/log/containers; do
    grep -qx "$p" "$S/paths.before" || rm -rf "$p"
  done
  if [ -d /var/log/containers ]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$S/*" -delete 2>/dev/null
  fi
fi

# 7. Sysctls as they were.
if [ -f "$S/sysctls.before" ]; then
  while IFS='=' read -r k v; do
    [ -n "$k" ] && [ "$(cat "/proc/sys/$k" 2>/dev/null)" != "$v" ] && echo "$v" >"/proc/sys/$k" 2>/dev/null
  done <"$S/sysctls.before"
fi
exit 0
