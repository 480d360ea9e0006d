#!/usr/bin/env bash
# The figures behind ARCHITECTURE.md's "The Kubernetes client": the same four calls (discover
# the configuration, page through Pods, watch Nodes with bookmarks, taint a Node) built with
# kube-rs + k8s-openapi (with-kube/) and with Hawser's own client (hand-written/, which
# compiles crates/hawser-kube's api.rs and config.rs in). Each is built from an empty target
# directory in release mode with -j 2, after `cargo fetch` (downloads are not timed); prints
# the wall time, the crates compiled and the stripped binary's size. Run both in one go on an
# otherwise idle machine: only their ratio means much.
#
#   tools/kube-client-measure/measure.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for c in with-kube hand-written; do
    (cd "$here/$c" && cargo fetch -q)
    start=$(date +%s.%N)
    (cd "$here/$c" && CARGO_TARGET_DIR="$work/$c" cargo build --release -j 2 2>"$work/$c.log")
    end=$(date +%s.%N)
    compiled=$(grep -c '^ *Compiling ' "$work/$c.log" || true)
    strip -o "$work/$c.stripped" "$work/$c/release/$c"
    printf '%-13s build %6.1f s  crates compiled %4d  stripped binary %s bytes\n' "$c" \
        "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "$compiled" \
        "$(stat -c %s "$work/$c.stripped")"
done
