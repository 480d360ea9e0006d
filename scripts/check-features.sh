#!/usr/bin/env bash
# Fails when the builds `make test` makes would resolve a dependency with different features:
# the release build (`cargo build --workspace --bins`), the unit tests (`cargo test
# --workspace --exclude hawser-e2e`) and the end-to-end tests (`cargo test -p hawser-e2e`).
#
# Why: cargo turns a dependency's features on per build, for the packages it builds (a
# dev-dependency's features count only in test builds). A dependency with another feature
# set is built again, with every crate above it: on a fresh machine that was tokio, hyper,
# axum, reqwest and all of ours, twice more, minutes of `make test` (issue 40). The fix is
# to turn the feature on for every build: in the workspace's dependency table, or as a
# dependency of a crate that every build has (hawser-storage's bitflags is one).
set -euo pipefail
export LC_ALL=C # sort and join must agree on the order
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
target=$(rustc -vV | sed -n 's/^host: //p')

features() {
    # One line per package: name@version and its features (build-dependencies left out:
    # cargo resolves those apart, for the host).
    "$cargo" tree -q --target "$target" -f '{p} {f}' --prefix none "$@" |
        sed -E 's/ \(\*\)$//; s/ \(proc-macro\)//; s/ \([^)]*\)$//' |
        awk '{ print $1 "@" $2 "|" $3 }' | sort -u
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
features -e normal --workspace >"$work/release"
features -e normal,dev --workspace --exclude hawser-e2e >"$work/unit"
features -e normal,dev -p hawser-e2e >"$work/e2e"

status=0
for build in release e2e; do
    # Packages both builds have, with features that differ.
    diffs=$(join -t '|' "$work/$build" "$work/unit" | awk -F '|' '$2 != $3 { print "  " $1 ": " $2 " here, " $3 " in the unit tests" }')
    if [ -n "$diffs" ]; then
        echo "check-features: the $build build resolves these dependencies with other features than the unit tests' build:"
        echo "$diffs"
        status=1
    fi
done
[ "$status" -eq 0 ] && echo "check-features: the release, unit-test and end-to-end builds resolve one feature set"
exit "$status"
