"""How many CPUs this process may use: its cgroup's CPU quota (v2 or v1), capped by its CPU affinity.

In a container the affinity is the node's cores, while the quota (a pod's CPU limit, ``docker run --cpus``) is
what the process actually gets. The cgroups are found through ``/proc/self/cgroup`` and ``/proc/self/mountinfo``.
Quotas and periods in the cgroup files are microseconds; what this module returns is CPUs (1.5: one and a half).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import NamedTuple

PROC_SELF = Path("/proc/self")


class Mount(NamedTuple):
    """A cgroup hierarchy's mount, from /proc/self/mountinfo."""

    root: PurePosixPath  # the part of the hierarchy mounted here: "/" or, without a cgroup namespace, a cgroup
    point: Path
    fstype: str  # "cgroup2" or "cgroup" (v1)
    options: frozenset[str]  # the super options: a v1 mount's controllers


def _unescape(field: str) -> str:
    """mountinfo writes a space in a path as \\040 (octal escapes)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def mounts(proc_self: Path = PROC_SELF) -> list[Mount]:
    """The cgroup and cgroup2 mounts this process sees, in mountinfo's order."""
    found = []
    for line in (proc_self / "mountinfo").read_text().splitlines():
        mount, _, filesystem = line.partition(" - ")  # a variable number of optional fields stands before " - "
        fields, filesystem = mount.split(), filesystem.split()  # filesystem: fstype, source, super options
        if len(fields) >= 5 and len(filesystem) >= 3 and filesystem[0] in ("cgroup", "cgroup2"):
            found.append(Mount(PurePosixPath(_unescape(fields[3])), Path(_unescape(fields[4])), filesystem[0],
                               frozenset(filesystem[2].split(","))))
    return found


def _folder(mount: Mount, path: str) -> Path:
    """The folder of cgroup ``path`` (relative to its hierarchy's root) under ``mount``; a path outside the mounted
    part (another namespace's cgroup) is taken to be the mount point itself."""
    cgroup = PurePosixPath(path)
    if ".." in cgroup.parts or not cgroup.is_relative_to(mount.root):
        return mount.point
    return mount.point / cgroup.relative_to(mount.root)


def cpu_folders(proc_self: Path = PROC_SELF) -> Iterator[tuple[str, Path, Path]]:
    """(fstype, folder, mount point) of each hierarchy that holds this process's CPU controller: the v2 one and,
    on v1 or a hybrid machine, the v1 one whose controllers include ``cpu``. The first mount of each is taken."""
    available = mounts(proc_self)
    for line in (proc_self / "cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            wanted = [mount for mount in available if mount.fstype == "cgroup2"]
        elif "cpu" in controllers.split(","):
            wanted = [mount for mount in available if mount.fstype == "cgroup" and "cpu" in mount.options]
        else:
            continue
        for mount in wanted[:1]:
            yield mount.fstype, _folder(mount, path), mount.point


def _cpus(quota_us: int | None, period_us: int) -> float | None:
    """A quota over its period, as CPUs; None: no quota. ValueError on values the kernel never writes."""
    if period_us <= 0 or (quota_us is not None and quota_us <= 0):
        raise ValueError(f"CPU quota {quota_us} over period {period_us}")
    return None if quota_us is None else quota_us / period_us


def folder_limit(fstype: str, folder: Path) -> float | None:
    """The CPUs one cgroup folder allows: v2 ``cpu.max`` ("<quota> <period>", or "max <period>": none), v1
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (-1: none). ValueError if a file is malformed."""
    if fstype == "cgroup2":
        quota, period = (folder / "cpu.max").read_text().split()
        return _cpus(None if quota == "max" else int(quota), int(period))
    quota_us = int((folder / "cpu.cfs_quota_us").read_text())
    return _cpus(None if quota_us == -1 else quota_us, int((folder / "cpu.cfs_period_us").read_text()))


def cpu_quota(proc_self: Path = PROC_SELF) -> float | None:
    """The CPUs this process's cgroups allow (e.g. 1.5), the smallest quota over period of its cgroup and their
    ancestors up to the mount point (a parent's quota limits its children too). None where none is set, where no
    file says (unreadable or absent), or where anything read is malformed."""
    limits = []
    try:
        for fstype, folder, point in cpu_folders(proc_self):
            for level in (folder, *folder.parents):
                # no such file at this level (a root cgroup has no quota files), or unreadable: no limit known there
                with contextlib.suppress(OSError):
                    limits.append(folder_limit(fstype, level))
                if level == point:
                    break
    except (OSError, ValueError, OverflowError):  # malformed, unreadable: one worker per core, never a failed start
        return None
    return min((limit for limit in limits if limit is not None), default=None)


def default_workers(proc_self: Path = PROC_SELF, cores: int | None = None) -> int:
    """gunicorn's sync workers when WEB_CONCURRENCY is unset: the CPU quota rounded up (1.5 CPUs -> 2), at most
    ``cores`` (default: the cores this process may run on, its affinity), at least 1; no quota: ``cores``."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    quota = cpu_quota(proc_self)
    return max(1, cores if quota is None else min(math.ceil(quota), cores))
