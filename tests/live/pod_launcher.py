"""Sets up a pod's filesystem in a private mount namespace, then execs a command in it (tests/live/test_pod.py).

    unshare --mount --propagation private python tests/live/pod_launcher.py \
        [--read-only] [--tmpfs PATH=BYTES]... -- COMMAND...

Run as root, inside the new namespace that ``unshare`` made (so no mount here is seen outside it). The command is
exec'd (same pid) from the current directory, the checkout standing for the image's WORKDIR; it drops privileges
itself (the test puts ``setpriv`` in front of it). Nothing on the host changes: no chmod, no chown, no file written.
Standard library only: it runs with the interpreter the command uses, before any of the project is importable.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys

RUNTIME_MOUNTS = ("/proc", "/sys", "/dev")  # a container runtime provides these, writable where the kernel says
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
STAGING = "/tmp"  # where a new root is built before it is moved onto / (a volume covers /tmp again afterwards)
KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}  # a bind remount would clear them
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


def main(argv: list[str]) -> None:
    options = parse(argv)
    # makedirs below must make directories anyone can search, whatever umask the caller had (CI's may be 077).
    os.umask(0o022)
    workdir = os.getcwd()
    # What the unprivileged command must still reach: its interpreter (sys.base_prefix: pyenv's lies under root's
    # 0700 home), the venv (sys.prefix) and the checkout. A handle on each, taken before any mount covers it,
    # binds it back after one did (mount(2) follows /proc/self/fd/N to the directory itself, not to its name).
    keep = {path: os.open(path, os.O_PATH) for path in outermost(sys.base_prefix, sys.prefix, workdir)}
    # A volume whose mount point the host lacks (a claim's /data): its parent reopened with an empty directory made
    # for it, in this namespace only.
    for path, _ in options.tmpfs:
        if not os.path.isdir(path):
            reopen(os.path.dirname(path), made=os.path.basename(path))
    # The pod's writable volumes: an emptyDir with medium: Memory is a tmpfs of its sizeLimit, made 0777 by the
    # kubelet (kubernetes#110835: no sticky bit). A checkout under /tmp (CI's clone) is bound back into it.
    for path, size in options.tmpfs:
        cover(path, f"mode=0777,size={size}", keep)
    # uid 10001 cannot pass a directory that others may not search (root's 0700 home): a 0755 tmpfs on it, with
    # the kept paths bound back, opens the way in this namespace only.
    for path in sorted({closed for kept in keep if (closed := closed_ancestor(kept))}):
        cover(path, "mode=0755", keep)
    # A kept directory closed itself (``mktemp -d`` makes 0700; a checkout cloned into one is): a 0755 tmpfs on
    # it, with each of its entries bound back.
    for path in [kept for kept in keep if not os.stat(kept).st_mode & 0o001]:
        reopen(path)
    # readOnlyRootFilesystem: every other mount read-only, the tmpfs covers and binds above included. /proc, /sys
    # and /dev are the runtime's; mounts that are read-only already (some of the host's) are left as they are.
    if options.read_only:
        volumes = {path for path, _ in options.tmpfs}
        for point, flags in writable_mounts().items():
            if point not in volumes and not any(point == m or inside(point, m) for m in RUNTIME_MOUNTS):
                mount(None, point, flags=MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    # Enter the working directory again by its path: the old handle may point under a mount covered since.
    os.chdir(workdir)
    os.execv(options.command[0], options.command)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--read-only", action="store_true", help="remount every mount read-only")
    parser.add_argument("--tmpfs", action="append", default=[], type=lambda s: tuple(s.split("=", 1)),
                        metavar="PATH=BYTES", help="a writable tmpfs of that size on that path")
    parser.add_argument("command", nargs="+", help="what to exec, after --")
    return parser.parse_args(argv)


def outermost(*paths: str) -> list[str]:
    """The real paths, without those inside another one (binding the outer back brings the inner too)."""
    real = {os.path.realpath(path) for path in paths}
    return [path for path in real if not any(inside(path, other) for other in real)]


def inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip("/") + "/")


def closed_ancestor(path: str) -> str | None:
    """The outermost directory above ``path`` that others may not search (no o+x), if there is one."""
    parts = path.strip("/").split("/")[:-1]
    ancestors = ("/" + "/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return next((ancestor for ancestor in ancestors if not os.stat(ancestor).st_mode & 0o001), None)


def cover(path: str, options: str, keep: dict[str, int]) -> None:
    """A fresh tmpfs on ``path``, then every kept path below it bound back, through its handle, at its old path."""
    mount("tmpfs", path, "tmpfs", data=options)
    for kept, handle in keep.items():
        if inside(kept, path):
            os.makedirs(kept, exist_ok=True)
            mount(f"/proc/self/fd/{handle}", kept, flags=MS_BIND)


def reopen(path: str, made: str | None = None) -> None:
    """``path`` (a directory others may not search, or one that lacks the mount point ``made``) as a 0755 tmpfs
    holding each of its entries, bound back with the mounts below them through a handle taken before the tmpfs
    covered them (a symbolic link is made again, not bound), and an empty directory ``made``. The root is built on
    STAGING, moved onto / and entered (chroot), as switch_root does: a tmpfs mounted on / would stay under this
    process's root, unseen."""
    names = os.listdir(path)
    entries = {name: os.open(os.path.join(path, name), os.O_PATH | os.O_NOFOLLOW) for name in names}
    links = {name: os.readlink(os.path.join(path, name)) for name in names if os.path.islink(os.path.join(path, name))}
    directories = {name for name in names if os.path.isdir(os.path.join(path, name))}
    base = STAGING if path == "/" else path
    mount("tmpfs", base, "tmpfs", data="mode=0755")
    for name, handle in entries.items():
        target = os.path.join(base, name)
        if name in links:
            os.symlink(links[name], target)
            continue
        if name in directories:
            os.mkdir(target)
        else:
            open(target, "x").close()  # a mount point for the file: it is bound over at once
        # Recursively, but for STAGING itself: the new root, mounted on it now, would come along.
        recursive = MS_REC if os.path.join(path, name) != STAGING else 0
        mount(f"/proc/self/fd/{handle}", target, flags=MS_BIND | recursive)
    if made:
        os.mkdir(os.path.join(base, made))
    if path == "/":
        os.chdir(base)
        mount(".", "/", flags=MS_MOVE)
        os.chroot(".")


def writable_mounts() -> dict[str, int]:
    """Mount point -> its nosuid/nodev/noexec flags, for the mounts of this namespace not read-only
    (/proc/self/mountinfo, octal escapes undone; a path mounted twice, one over the other, once)."""
    mounts = {}
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            options = fields[5].split(",")
            if "ro" not in options:
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])
                mounts[point] = sum(KEPT_FLAGS.get(option, 0) for option in options)
    return mounts


def mount(source: str | None, target: str, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    """mount(2) itself: mount(8) keeps records of its own under /run/mount, on the host's root while still writable."""
    encoded = [None if text is None else os.fsencode(text) for text in (source, target, fstype, data)]
    if LIBC.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target} ({fstype}, flags {flags:#x}): {os.strerror(error)}")


if __name__ == "__main__":
    main(sys.argv[1:])
