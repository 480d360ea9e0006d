#!/usr/bin/env bash
# Runs hawser-e2e's test binaries as `cargo test --release -p hawser-e2e ARGS` would, in three
# phases by what each needs of the machine; prints each binary's output in one piece when it
# ends (with cargo's "Running" line, which scripts/test-times.sh reads), names the binaries
# that failed, and fails if any did.
#
# 1. PARALLEL, two at a time (E2E_JOBS): most binaries start a cluster of their own on free
#    loopback ports and spend their time waiting on it, so two at a time on two cores costs
#    them little.
# 2. GUESTS and SHARED, in two lanes. Each test of a GUESTS binary boots a guest kernel of its
#    own (scripts/kvm/boot.sh, one emulated CPU, so one host core) and shares nothing with the
#    host's tests but the read-only host files; its tests run one per job. The first lane runs
#    guest jobs only; the second runs the SHARED binaries one at a time, then helps with the
#    guest jobs. A SHARED binary needs what no other host test may use at once (network
#    namespaces, loop devices and mounts, fixed ports, the kubelet) but has no time bound
#    tighter than tens of seconds, so one core is enough for it; before, it ran alone with
#    the second core idle while the guests waited their turn.
# 3. Every other binary alone, with the machine to itself: those that measure time (failover,
#    QoS, the longest gap in I/O, how long a leader takes) or need both cores (the kubelet's
#    tests, the browser). A new test file runs here until it is added to a group above.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
cargo=${CARGO:-cargo}
jobs=${E2E_JOBS:-2}

PARALLEL=" ca_rotation tls_garbage port_matrix nbd_tls tls_identity join_names node_credential
  snapshots snapshot_restore snapshot_catchup checksums encryption epoch_grants write_log
  volume_expand force_promote bad_replicas metrics cluster_recover device_api backup_targets
  backup_volume standby_volume backup_cost backup_schedule csi_backup peer_probe backup_seeds "
# backup_seeds runs here though it kills agents and its controller: by the PIDs its own cluster
# started, on free ports, and its bounds (a minute for a seed to settle) are not timings that
# another binary on the other core could break.
# backup_interleavings stays in phase 3: its leader-change test runs two controllers on etcd,
# whose lease a loaded machine lets lapse (etcd answering in over 3 s), as for the failover tests.
# Longest first (kernel_growth is one test of over 4 minutes), so the two lanes end together.
GUESTS=" kernel_growth kernel_devices kernel_csi guest_kernel "
# Longest first too; none asserts a time shorter than tens of seconds (phase 2 above).
SHARED=" helm_chart engine_faults replicated_volume backup_faults bad_input csi_node
  snapshot_space backup_postgres leader_kill_loop csi_sanity snapshot_resync snapshot_cut clones
  hawser_e2e "

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

# Pops the first line of queue file $1 (under a lock) and prints it; fails when it is empty.
pop() {
    local line
    {
        flock 8
        line=$(head -n 1 "$1")
        [ -n "$line" ] || return 1
        sed -i 1d "$1"
    } 8>>"$E2E_WORK/queue.lock"
    printf '%s\n' "$line"
}

# Runs jobs ("BINARY[<tab>TEST]" lines: a tab, because the checkout's path may have spaces)
# from the first of the queue files $@ that has one, until every one is empty.
lane() {
    local job q bin test
    while :; do
        job=""
        for q in "$@"; do
            job=$(pop "$q") && break
        done
        [ -n "$job" ] || return 0
        IFS=$'\t' read -r bin test <<<"$job"
        run_one "$bin" "$test"
    done
}

words() { tr -s ' \n' '  ' <<<"$1"; }
together_names=" $(words "$PARALLEL") " shared_names=" $(words "$SHARED") "
together=() alone=() guest_jobs=() shared=()
declare -A guest_bins=() shared_bins=()
for b in "${bins[@]}"; do
    name=$(basename "$b" | sed -E 's/-[0-9a-f]+$//')
    if [[ "$together_names" == *" $name "* ]]; then
        together+=("$b")
    elif [[ "$GUESTS" == *" $name "* ]]; then
        guest_bins[$name]=$b
    elif [[ "$shared_names" == *" $name "* ]]; then
        shared_bins[$name]=$b
    else
        alone+=("$b")
    fi
done
for name in $GUESTS; do
    b=${guest_bins[$name]:-}
    [ -n "$b" ] || continue
    mapfile -t tests < <(default_tests "$b")
    [ "${#tests[@]}" -gt 0 ] || { echo "e2e: $name lists no test"; exit 1; }
    for t in "${tests[@]}"; do guest_jobs+=("$b"$'\t'"$t"); done
done
for name in $SHARED; do
    [ -z "${shared_bins[$name]:-}" ] || shared+=("${shared_bins[$name]}")
done
lanes=$(( jobs > 1 ? 2 : 1 ))
echo "e2e: ${#together[@]} binaries $jobs at a time; ${#guest_jobs[@]} guest tests and ${#shared[@]} binaries in $lanes lane(s); then ${#alone[@]} binaries alone"

if [ "${#together[@]}" -gt 0 ]; then
    # shellcheck disable=SC2016 # $1 is the inner shell's.
    printf '%s\n' "${together[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$1"' _ {}
fi
if [ "${#guest_jobs[@]}" -gt 0 ] || [ "${#shared[@]}" -gt 0 ]; then
    printf '%s\n' "${guest_jobs[@]}" >"$work/guests"
    printf '%s\n' "${shared[@]}" >"$work/shared"
    if [ "$jobs" -gt 1 ]; then
        lane "$work/guests" &
    fi
    lane "$work/shared" "$work/guests" &
    wait
fi
for b in "${alone[@]}"; do
    run_one "$b"
done

if [ -s "$work/failed" ]; then
    echo "e2e: FAILED: $(sort "$work/failed" | tr '\n' ' ')"
    exit 1
fi
echo "e2e: every binary passed"
