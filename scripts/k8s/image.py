#!/usr/bin/env python3
"""Writes a one-layer image as a docker-archive tarball (what `docker save` makes and
`ctr images import` reads), from a root filesystem directory, with no registry and no
image tool: the test images of the local Kubernetes (pause, busybox) are made this way.

usage: image.py ROOTFS NAME:TAG OUT.tar [--entrypoint PATH] CMD [ARG...]
"""
import hashlib
import io
import json
import os
import sys
import tarfile


def layer_tar(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                arc = os.path.relpath(full, rootfs)
                info = t.gettarinfo(full, arc)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isreg():
                    with open(full, "rb") as f:
                        t.addfile(info, f)
                else:
                    t.addfile(info)
    return buf.getvalue()


def main() -> None:
    rootfs, ref, out, *cmd = sys.argv[1:]
    entrypoint = None
    if cmd[:1] == ["--entrypoint"]:
        entrypoint, cmd = [cmd[1]], cmd[2:]
    layer = layer_tar(rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "scripts/k8s/image.py"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id[len("sha256:"):] + "/layer.tar"
    manifest = json.dumps([{
        "Config": config_name,
        "RepoTags": [ref],
        "Layers": [layer_name],
    }]).encode()
    with tarfile.open(out, mode="w") as t:
        for name, data in [(config_name, config), (layer_name, layer),
                           ("manifest.json", manifest)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
