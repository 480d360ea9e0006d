#!/usr/bin/env bash
# Copies the hawser executable FROM to TO with NOTE in its --version ("0.1.0 (NOTE)"): the
# bytes after the marker of the binary's BUILD_NOTE (crates/hawser/src/main.rs) are written,
# in the copy only. make test's upgrade test replaces a running agent with such a copy, a
# second executable that says it is one, without compiling the crate twice.
#
#   scripts/build-note.sh FROM TO NOTE
set -euo pipefail
[ "$#" -eq 3 ] || { echo "usage: $0 FROM TO NOTE" >&2; exit 2; }
from=$1 to=$2 note=$3
marker='@@hawser-build-note@@'
# BUILD_NOTE is 64 bytes: the marker, then the note and at least one zero byte.
max=$((64 - ${#marker} - 1))
[ "${#note}" -le "$max" ] || { echo "build-note: the note is longer than $max bytes" >&2; exit 2; }
offsets=$(grep -obUaF "$marker" "$from" | cut -d: -f1)
[ "$(wc -w <<<"$offsets")" -eq 1 ] || {
    echo "build-note: $from holds the marker $marker $(wc -w <<<"$offsets") times, not once" >&2
    exit 1
}
tmp="$to.tmp.$$"
cp "$from" "$tmp"
printf '%s\0' "$note" | dd of="$tmp" bs=1 seek=$((offsets + ${#marker})) conv=notrunc status=none
mv "$tmp" "$to"
"$to" --version | grep -qF "($note)" || { echo "build-note: $to --version does not show the note" >&2; exit 1; }
echo "build-note: $to says: $("$to" --version)"
