#!/usr/bin/env bash
# Builds every fuzz target under fuzz/ and runs each for a bounded time (FUZZ_SECONDS, default
# 20 s each; FUZZ_JOBS of them at a time, default one per core). Fails if any target crashes
# (a panic, a failed assertion, a hang past the per-input timeout); prints per target the
# number of inputs run.
#
#   scripts/fuzz.sh             build, then run every target
#   scripts/fuzz.sh --prepare   install cargo-fuzz and build the targets only (make test does
#                               this beside its other builds, so its fuzz step only runs)
#
# Toolchain: cargo-fuzz on the pinned stable toolchain (rust-toolchain.toml), with
# `--sanitizer none`: no nightly is needed, so this runs on a fresh machine that can reach
# crates.io. cargo-fuzz is installed from crates.io when missing.
#
# Corpora: fuzz/corpus/<target> (not committed; it grows from run to run). Each target writes
# its own seeds there at start (HAWSER_FUZZ_SEEDS), built by the encoders of this build, so
# the seeds always speak the current wire and disk formats.
# Crashes: fuzz/artifacts/<target>/crash-*; replay one with
#   cargo fuzz run --sanitizer none --release --debug-assertions <target> \
#       fuzz/artifacts/<target>/crash-...
# (add --target-dir ~/.cache/hawser-fuzz/target to reuse this script's build).
# (replica_session prints each exchange with HAWSER_FUZZ_TRACE=1).
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=false
case "${1:-}" in
--prepare) prepare=true ;;
"") ;;
*) echo "usage: $0 [--prepare]" >&2; exit 2 ;;
esac

seconds="${FUZZ_SECONDS:-20}"
max_corpus="${FUZZ_MAX_CORPUS:-3000}"
cargo_fuzz_version="0.13.2"
# The fuzz build's own target directory, outside the checkout: its ~250 dependencies, built with
# the fuzzer's instrumentation, take 6 minutes on 2 cores, and a cache survives a new clone
# (as the Kubernetes tools' does), so only the project's crates are built again.
target_dir="${HAWSER_FUZZ_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hawser-fuzz/target}"
flags=(--sanitizer none --release --debug-assertions --target-dir "$target_dir")

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz $cargo_fuzz_version from crates.io"
    cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked
fi
command -v c++ >/dev/null || { echo "fuzz: a C++ compiler is needed to build libFuzzer (apt-get install g++)"; exit 1; }

start=$(date +%s)
echo "fuzz: building the targets ($(cargo fuzz --version))"
cargo fuzz build "${flags[@]}"
built=$(date +%s)
if $prepare; then
    echo "fuzz: built in $((built - start))s"
    exit 0
fi

# The targets' stores and replicas live here (tmpfs when there is one) and go away with it.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    tmp=$(mktemp -d -p /dev/shm hawser-fuzz.XXXXXX)
else
    tmp=$(mktemp -d)
fi
logs="$tmp/logs"
mkdir -p "$logs"
trap 'rm -rf "$tmp"' EXIT

# The binaries just built are run as they are (`cargo fuzz run` would rebuild first).
bin="$target_dir/$(rustc -vV | sed -n 's/^host: //p')/release"

# Run one target; its summary goes to $logs/<target>.summary, its exit status to .status.
fuzz_one() {
    local target=$1
    local corpus="fuzz/corpus/$target" log="$logs/$target.log" out="$logs/$target.summary"
    mkdir -p "$corpus" "fuzz/artifacts/$target"
    # A corpus grows from run to run, and loading it counts against the target's time: past
    # max_corpus inputs it is first cut down to the inputs that keep its coverage.
    if [ "$(find "$corpus" -type f | wc -l)" -gt "$max_corpus" ]; then
        rm -rf "$corpus.min" && mkdir "$corpus.min"
        if HAWSER_FUZZ_TMP="$tmp" "$bin/$target" -merge=1 -timeout=60 "$corpus.min" "$corpus" \
            >"$logs/$target.merge.log" 2>&1; then
            rm -rf "$corpus" && mv "$corpus.min" "$corpus"
        else
            rm -rf "$corpus.min"
        fi
    fi
    local status=0
    HAWSER_FUZZ_SEEDS="$corpus" HAWSER_FUZZ_TMP="$tmp" "$bin/$target" "$corpus" \
        -artifact_prefix="fuzz/artifacts/$target/" -max_total_time="$seconds" -timeout=60 \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    local runs cov inputs
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)
    cov=$(sed -nE 's/.*[[:space:]]cov: ([0-9]+).*/\1/p' "$log" | tail -1)
    inputs=$(find "$corpus" -type f | wc -l)
    if [ "$status" -eq 0 ]; then
        printf 'fuzz %-16s %9s runs in %ss, coverage %s, corpus %s inputs\n' \
            "$target" "${runs:-?}" "$seconds" "${cov:-?}" "$inputs" >"$out"
    else
        {
            printf 'fuzz %-16s FAILED (exit %s) after %s runs\n' "$target" "$status" "${runs:-?}"
            # The panic or libFuzzer's report, and where the crashing input was written.
            grep -E -A12 "panicked at|ERROR: libFuzzer|deadly signal|timeout after" "$log" |
                grep -vE "Test unit written to|Base64:" | head -40 || true
            grep -E "Test unit written to|Base64:" "$log" | sort -u || true
        } >"$out"
    fi
    echo "$status" >"$logs/$target.status"
}

# Targets run side by side, FUZZ_JOBS at a time (default: one per core); each is one
# fuzzing process, so each gets its full time on a core.
jobs="${FUZZ_JOBS:-$(nproc)}"
targets=$(cargo fuzz list)
for target in $targets; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
        wait -n || true
    done
    fuzz_one "$target" &
done
wait

failed=()
for target in $targets; do
    cat "$logs/$target.summary" 2>/dev/null || echo "fuzz $target: no result"
    [ "$(cat "$logs/$target.status" 2>/dev/null)" = 0 ] || failed+=("$target")
done

end=$(date +%s)
echo "fuzz: build $((built - start))s, runs $((end - built))s ($jobs at a time)"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}"
    exit 1
fi
echo "fuzz: every target ran ${seconds}s without a crash"
