#!/usr/bin/env bash
# How long make test's steps and test binaries took, printed at the end of every run (issue
# 40): the slowest first, so the next test that pushes make test past its budget is named.
#
#   scripts/test-times.sh --start         forget the last run's times
#   CMD 2>&1 | scripts/test-times.sh STEP  pass CMD's output through, noting the step's wall
#                                          time and each test binary's "finished in" time
#   scripts/test-times.sh --report        print the slowest binaries and every step
#
# cargo test names each binary on a "Running tests/x.rs (...)" or "Doc-tests x" line and ends
# it with "test result: ... finished in N.NNs"; the times are libtest's own. cargo-nextest
# (the unit step) prints a line for each test that ended, "PASS [   0.417s] (214/573)
# hawser-controller healing::...": a binary's time is then the sum of its tests' times.
set -uo pipefail
log="${HAWSER_TEST_TIMES:-$(dirname "$0")/../target/test-times.log}"

# The seconds this machine's cores have been busy since it booted, all cores added up (user,
# nice, system, irq and softirq in /proc/stat, at 100 ticks a second): over a step, the CPU
# time it and whatever ran beside it took. A step whose busy seconds are about its wall time
# times the cores waited on the CPU, not on itself.
busy() {
    awk '/^cpu / { print int(($2 + $3 + $4 + $7 + $8) / 100) }' /proc/stat 2>/dev/null || echo 0
}

case "${1:-}" in
--start)
    mkdir -p "$(dirname "$log")"
    : >"$log"
    ;;
--report)
    [ -s "$log" ] || exit 0
    echo
    echo "== slowest test binaries (seconds: libtest's count, or the sum of nextest's) =="
    # A binary's tests, each a line of its own (nextest), count once, summed.
    grep '^binary ' "$log" | awk '{ t[$3 " " $4] += $2 } END { for (k in t) print t[k], k }' |
        sort -k1 -rn | head -n "${TOP:-15}" | awk '{ printf "%8.1f  %s: %s\n", $1, $2, $3 }'
    echo "== steps (wall seconds; the cores' busy seconds, and as a share of wall x $(nproc) cores) =="
    grep '^step ' "$log" | awk -v n="$(nproc)" '{
        printf "%8d  %-9s %7d busy  %3d%%\n", $2, $3, $4, ($2 > 0 ? 100 * $4 / ($2 * n) : 0) }'
    grep '^step ' "$log" | awk -v n="$(nproc)" '{ w += $2; b += $4 } END {
        printf "%8d  %-9s %7d busy  %3d%%\n", w, "total", b, (w > 0 ? 100 * b / (w * n) : 0) }'
    ;;
"")
    echo "usage: CMD 2>&1 | $0 STEP, or $0 --start|--report" >&2
    exit 2
    ;;
*)
    step="$1"
    # make -n still runs a recipe line that names $(MAKE), and so this wrapper: check-tools'
    # `make -n -B test` does, in a fresh checkout that has no target/ yet.
    mkdir -p "$(dirname "$log")"
    start=$(date +%s)
    busy_at_start=$(busy)
    current="?"
    while IFS= read -r line; do
        printf '%s\n' "$line"
        case "$line" in
        *"Running "*"("*")"*)
            # "Running unittests src/lib.rs (target/release/deps/hawser_tls-0123abcd)"
            current=$(sed -E 's/.*Running (unittests )?([^ ]+) \(.*\/([^/]+)-[0-9a-f]+\).*/\3:\2/' <<<"$line")
            ;;
        *"Doc-tests "*)
            current="doc:$(sed -E 's/.*Doc-tests ([^ ]+).*/\1/' <<<"$line")"
            ;;
        *" PASS ["*"s] "* | *" FAIL ["*"s] "* | *" TIMEOUT ["*"s] "* | *" LEAK ["*"s] "*)
            # nextest: "  PASS [   0.417s] (214/573) hawser-controller healing::x::y"
            sed -nE 's/.* (PASS|FAIL|TIMEOUT|LEAK) \[ *([0-9.]+)s\] (\([ 0-9]+\/[0-9]+\) )?([^ ]+) .*/\2 \4/p' \
                <<<"$line" | while read -r secs bin; do
                echo "binary $secs $step nextest:$bin" >>"$log"
            done
            ;;
        "test result:"*"finished in "*)
            secs=$(sed -E 's/.*finished in ([0-9.]+)s.*/\1/' <<<"$line")
            echo "binary $secs $step $current" >>"$log"
            ;;
        esac
    done
    # The step's own exit status is the pipeline's (pipefail); noted here whatever it was.
    echo "step $(($(date +%s) - start)) $step $(($(busy) - busy_at_start))" >>"$log"
    ;;
esac
