#!/usr/bin/env bash
# Builds the Hawser container image from the release binary: `hawser` plus what the CSI node
# service runs on the host (mkfs, mount, blkid, losetup, resize2fs, e2fsck, xfs_growfs,
# nbdfuse, fusermount3, setsid) and modprobe (the node's init container loads the kernel
# frontends' modules), each with the shared libraries it loads. No Docker and no
# registry: the result is a docker-archive tarball for `ctr images import` (or
# `docker load`), named hawser.local/hawser:<version> unless IMAGE says otherwise.
#
# usage: scripts/image.sh [OUT.tar]        (default target/hawser-image.tar)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/hawser
[ -x "$BIN" ] || { echo "no $BIN: run make build first" >&2; exit 1; }
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
IMAGE=${IMAGE:-hawser.local/hawser:$VERSION}
OUT=${1:-target/hawser-image.tar}
TOOLS="mkfs.ext4 mkfs.xfs mount umount blkid losetup resize2fs e2fsck dumpe2fs xfs_growfs
       nbdfuse fusermount3 setsid modprobe sh"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/dev" "$root/proc" "$root/sys" "$root/run"
chmod 1777 "$root/tmp"
# copy_with_libs FILE: the file and every library ldd names, at the same paths.
copy_with_libs() {
  local f=$1
  mkdir -p "$root$(dirname "$f")"
  cp -L "$f" "$root$f"
  for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
copy_with_libs "$(realpath "$BIN")"
mv "$root$(realpath "$BIN")" "$root/bin/hawser"
for t in $TOOLS; do
  p=$(command -v "$t") || { echo "missing tool $t (make deps installs it)" >&2; exit 1; }
  copy_with_libs "$p"
done
# /bin/sh where scripts expect it, whatever directory the host's sh lives in.
[ -e "$root/bin/sh" ] || ln -s "$(command -v sh)" "$root/bin/sh"
# mke2fs reads its defaults from here; nbdfuse needs fusermount3 on PATH.
[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$root/etc/"
echo "root:x:0:0:root:/:/bin/sh" >"$root/etc/passwd"
python3 scripts/k8s/image.py "$root" "$IMAGE" "$OUT" --entrypoint /bin/hawser --help
echo "$IMAGE in $OUT ($(du -h "$OUT" | cut -f1)); load it with: ctr -n k8s.io images import $OUT" >&2
