#!/usr/bin/env bash
# Runs hawser-e2e's test binaries as `cargo test --release -p hawser-e2e ARGS` would, but
# the ones in PARALLEL two at a time (E2E_JOBS), then every other one alone. Prints each
# binary's output in one piece when it ends (with cargo's "Running" line, which
# scripts/test-times.sh reads), names the binaries that failed, and fails if any did.
#
# Why two groups: most binaries start a cluster of their own on free loopback ports and
# spend their time waiting on it, so two at a time on two cores costs them little. The rest
# need the machine to themselves (network namespaces, loop devices and mounts, the kubelet,
# fixed ports) or measure time (failover, QoS, slow clients), and run alone, as every test
# did before. A new test file runs alone until it is added to PARALLEL.
#
# The binaries in GUESTS are a third group: each of their tests boots a guest kernel of its
# own (scripts/kvm/boot.sh, one emulated CPU, so one host core) and shares nothing with
# another guest but the read-only host files. Their tests run one per job, two jobs at a
# time: they were 40% of the e2e step's time with the second core idle.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
cargo=${CARGO:-cargo}
jobs=${E2E_JOBS:-2}

PARALLEL=" ca_rotation tls_garbage port_matrix nbd_tls tls_identity join_names node_credential
  snapshots snapshot_restore snapshot_catchup checksums encryption epoch_grants write_log
  volume_expand force_promote bad_replicas metrics cluster_recover device_api backup_targets
  backup_volume standby_volume backup_cost backup_schedule csi_backup peer_probe "
# Longest first (kernel_growth is one test of over 4 minutes), so the two lanes end together.
GUESTS=" kernel_growth kernel_devices kernel_csi guest_kernel "

# Build first (cargo's own output), then take the test executables from its JSON messages.
mapfile -t bins < <("$cargo" test --release -p hawser-e2e --no-run --message-format=json "$@" |
    grep -o '"executable":"[^"]*"' | sed -e 's/^"executable":"//' -e 's/"$//')
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "e2e: the build failed"; exit 1; }
[ "${#bins[@]}" -gt 0 ] || { echo "e2e: no test binary"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export E2E_WORK="$work" E2E_ROOT="$root"

# Runs one binary as cargo test does (from the package's directory, one test at a time),
# or only its test TEST (exactly), then prints the output under a lock so that two blocks
# never interleave.
run_one() {
    local bin=$1 test=${2:-} name out rc
    name=$(basename "$bin" | sed -E 's/-[0-9a-f]+$//')
    out=$(mktemp "$E2E_WORK/$name.XXXXXX")
    local args=(--test-threads=1)
    [ -z "$test" ] || args+=(--exact "$test")
    (cd "$E2E_ROOT/crates/hawser-e2e" && CARGO_MANIFEST_DIR="$PWD" "$bin" "${args[@]}") >"$out" 2>&1
    rc=$?
    {
        flock 9
        echo "     Running tests/$name.rs ($bin)"
        cat "$out"
        [ "$rc" -eq 0 ] || echo "$name${test:+ $test}" >>"$E2E_WORK/failed"
    } 9>>"$E2E_WORK/lock"
    return 0
}
export -f run_one

# The tests of binary $1 that run by default ("name: test" lines of --list, without those
# of --list --ignored), one per line.
default_tests() {
    comm -23 <("$1" --list --format=terse 2>/dev/null | sed -n 's/: test$//p' | sort) \
        <("$1" --list --ignored --format=terse 2>/dev/null | sed -n 's/: test$//p' | sort)
}

together_names=" $(tr -s ' \n' '  ' <<<"$PARALLEL") "
together=() alone=() guest_jobs=()
declare -A guest_bins=()
for b in "${bins[@]}"; do
    name=$(basename "$b" | sed -E 's/-[0-9a-f]+$//')
    if [[ "$together_names" == *" $name "* ]]; then
        together+=("$b")
    elif [[ "$GUESTS" == *" $name "* ]]; then
        guest_bins[$name]=$b
    else
        alone+=("$b")
    fi
done
for name in $GUESTS; do
    b=${guest_bins[$name]:-}
    [ -n "$b" ] || continue
    mapfile -t tests < <(default_tests "$b")
    [ "${#tests[@]}" -gt 0 ] || { echo "e2e: $name lists no test"; exit 1; }
    for t in "${tests[@]}"; do guest_jobs+=("$b $t"); done
done
echo "e2e: ${#together[@]} binaries $jobs at a time, ${#guest_jobs[@]} guest tests $jobs at a time, then ${#alone[@]} binaries alone"

if [ "${#together[@]}" -gt 0 ]; then
    # shellcheck disable=SC2016 # $1 is the inner shell's.
    printf '%s\n' "${together[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$1"' _ {}
fi
if [ "${#guest_jobs[@]}" -gt 0 ]; then
    # shellcheck disable=SC2016 # $1 and $2 are the inner shell's.
    printf '%s\n' "${guest_jobs[@]}" | xargs -P "$jobs" -L1 bash -c 'run_one "$1" "$2"' _
fi
for b in "${alone[@]}"; do
    run_one "$b"
done

if [ -s "$work/failed" ]; then
    echo "e2e: FAILED: $(sort "$work/failed" | tr '\n' ' ')"
    exit 1
fi
echo "e2e: every binary passed"
