#!/usr/bin/env bash
# `make test` as a new contributor's machine would run it, on a used one: a new clone of HEAD
# and an empty HOME, so no ~/.cache/hawser-k8s, no Go, npm or cargo caches, no cargo-fuzz, no
# target/ and no ui/node_modules. What a fresh machine of this kind has preinstalled is used
# as it is: the Debian packages, Go, Node.js and the Rust toolchain (rustup's, through
# RUSTUP_HOME). Prints each line with the seconds since the start, and the total; exits with
# make's status. docs/testing.md has the figures.
#
#   scripts/fresh-test.sh [DIR]    (default: a new directory under /tmp; needs about 20 GB)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$(mktemp -d /tmp/hawser-fresh.XXXXXX)}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
rustup_bin=$(command -v rustup) || { echo "fresh-test: rustup not found"; exit 1; }
[ -z "$(ls -A "$dir" 2>/dev/null)" ] || { echo "fresh-test: $dir is not empty"; exit 1; }

mkdir -p "$dir/home/.cargo/bin"
git clone -q "$repo" "$dir/hawser" || exit 1
# rustup's proxies, and nothing else that `cargo install` put beside them.
for t in cargo rustc rustup cargo-clippy cargo-fmt clippy-driver rustfmt rustdoc; do
    ln -s "$rustup_bin" "$dir/home/.cargo/bin/$t"
done
echo "fresh-test: make test in $dir/hawser at $(git -C "$dir/hawser" log -1 --format=%h), HOME=$dir/home"
start=$(date +%s)
(cd "$dir/hawser" && env -i HOME="$dir/home" CARGO_HOME="$dir/home/.cargo" \
    RUSTUP_HOME="$rustup_home" TERM=dumb LANG=C.UTF-8 USER="${USER:-root}" \
    PATH="$dir/home/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    make test 2>&1) |
    while IFS= read -r line; do printf '+%ss %s\n' "$(( $(date +%s) - start ))" "$line"; done
status=${PIPESTATUS[0]}
echo "fresh-test: make test exited $status after $(( $(date +%s) - start )) s; remove $dir when done"
exit "$status"
