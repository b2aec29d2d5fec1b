"""service.runtime.cpus on fake /proc/self and cgroup trees in tmp_path: the quota of v2 and v1 cgroups, their
ancestors, mount roots, hybrid machines, and the fall-back to the affinity (a real cgroup: tests/live/test_cpus.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.runtime import cpus

CORES = 64  # a large node: the affinity a pod sees


class Machine:
    """A fake /proc/self (cgroup, mountinfo) and cgroup folders, all below tmp_path."""

    def __init__(self, tmp_path: Path, cgroup: str) -> None:
        self.root = tmp_path
        self.proc_self = tmp_path / "proc" / "self"
        self.proc_self.mkdir(parents=True)
        (self.proc_self / "cgroup").write_text(cgroup)
        self.mountinfo: list[str] = []

    def mount(self, point: str, fstype: str, options: str = "rw", root: str = "/") -> Path:
        """Adds a mountinfo line (as the kernel writes it: spaces as \\040) and makes the mount point."""
        folder = self.root / point.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        escaped = str(folder).replace(" ", "\\040")
        self.mountinfo.append(f"{30 + len(self.mountinfo)} 23 0:{28 + len(self.mountinfo)} {root} {escaped} "
                              f"rw,nosuid,nodev,noexec,relatime shared:9 - {fstype} {fstype} {options}")
        (self.proc_self / "mountinfo").write_text("\n".join(self.mountinfo) + "\n")
        return folder

    def quota(self) -> float | None:
        return cpus.cpu_quota(self.proc_self)

    def workers(self, cores: int = CORES) -> int:
        return cpus.default_workers(self.proc_self, cores)


def write(folder: Path, **files: str) -> None:
    """Cgroup files in ``folder`` (made if missing): cpu_max= is cpu.max, cfs_quota= cpu.cfs_quota_us, ..."""
    names = {"cpu_max": "cpu.max", "cfs_quota": "cpu.cfs_quota_us", "cfs_period": "cpu.cfs_period_us"}
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / names[name]).write_text(text + "\n")


def v2(tmp_path: Path, path: str = "/", root: str = "/") -> tuple[Machine, Path]:
    """A cgroup v2 machine (a pod with a cgroup namespace by default: "0::/" and the mount's root "/")."""
    machine = Machine(tmp_path, f"0::{path}\n")
    return machine, machine.mount("/sys/fs/cgroup", "cgroup2", "rw,nsdelegate,memory_recursiveprot", root)


def v1(tmp_path: Path, path: str, root: str = "/") -> tuple[Machine, Path]:
    """A cgroup v1 machine, cpu and cpuacct mounted together, the process in ``path``."""
    machine = Machine(tmp_path, f"12:pids:{path}\n5:memory:{path}\n4:cpu,cpuacct:{path}\n3:cpuset:{path}\n"
                                f"1:name=systemd:{path}\n")
    machine.mount("/sys/fs/cgroup/cpuset", "cgroup", "rw,cpuset")  # "cpuset" and "cpuacct" are not "cpu"
    machine.mount("/sys/fs/cgroup/memory", "cgroup", "rw,memory")
    return machine, machine.mount("/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct", root)


def test_v2_quota_in_cpus_rounded_up_to_workers(tmp_path):
    machine, mount = v2(tmp_path)
    write(mount, cpu_max="150000 100000")  # docker --cpus=1.5, a pod's limit of 1500m
    assert machine.quota() == 1.5 and machine.workers() == 2


def test_v2_max_is_no_quota_so_one_worker_per_core(tmp_path):
    machine, mount = v2(tmp_path)
    write(mount, cpu_max="max 100000")
    assert machine.quota() is None and machine.workers() == CORES


def test_v1_quota_over_period(tmp_path):
    machine, mount = v1(tmp_path, "/kubepods/burstable/pod1/c1")
    write(mount / "kubepods/burstable/pod1/c1", cfs_quota="300000", cfs_period="100000")
    assert machine.quota() == 3.0 and machine.workers() == 3


def test_v1_minus_one_is_no_quota(tmp_path):
    machine, mount = v1(tmp_path, "/kubepods/besteffort/pod1/c1")
    write(mount / "kubepods/besteffort/pod1/c1", cfs_quota="-1", cfs_period="100000")
    write(mount, cfs_quota="-1", cfs_period="100000")  # the root's
    assert machine.quota() is None and machine.workers() == CORES


@pytest.mark.parametrize(("pod", "container", "expected"), [
    ("100000 100000", "max 100000", 1.0),  # only the pod has a limit: it limits the container too
    ("400000 100000", "250000 100000", 2.5),  # the container's is smaller
    ("50000 50000", "300000 100000", 1.0),  # another period: compared as CPUs
])
def test_the_smallest_quota_of_the_cgroup_and_its_ancestors(tmp_path, pod, container, expected):
    machine, mount = v2(tmp_path, "/kubepods.slice/pod1.slice/cri-c1.scope")
    write(mount / "kubepods.slice", cpu_max="max 100000")
    write(mount / "kubepods.slice/pod1.slice", cpu_max=pod)
    write(mount / "kubepods.slice/pod1.slice/cri-c1.scope", cpu_max=container)
    assert machine.quota() == expected


def test_v1_ancestors_count_too(tmp_path):
    machine, mount = v1(tmp_path, "/kubepods/pod1/c1")
    write(mount / "kubepods/pod1", cfs_quota="50000", cfs_period="100000")
    write(mount / "kubepods/pod1/c1", cfs_quota="-1", cfs_period="100000")
    assert machine.quota() == 0.5 and machine.workers() == 1


def test_docker_without_a_cgroup_namespace_mounts_its_cgroup_as_the_root(tmp_path):
    """The container's path stands both as the mount's root and in /proc/self/cgroup: the mount point is its folder,
    and what lies above the mount point (the host's folders) is not read."""
    machine, mount = v2(tmp_path, "/system.slice/docker-abc.scope", root="/system.slice/docker-abc.scope")
    write(mount, cpu_max="150000 100000")
    write(mount.parent, cpu_max="10000 100000")  # outside the mount: never an ancestor
    assert machine.quota() == 1.5


def test_a_nested_path_is_taken_relative_to_the_mount_root(tmp_path):
    machine, mount = v1(tmp_path, "/docker/abc/workers/w1", root="/docker/abc")
    write(mount / "workers/w1", cfs_quota="20000", cfs_period="100000")
    write(mount / "docker/abc/workers/w1", cfs_quota="900000", cfs_period="100000")  # the path not made relative
    assert machine.quota() == 0.2


@pytest.mark.parametrize("path", ["/other/cgroup", "/../../kubepods/pod1/c1"])
def test_a_path_outside_the_mount_root_reads_the_mount_point(tmp_path, path):
    """Another namespace's cgroup (a cgroup namespace shows one outside it with "..")."""
    machine, mount = v2(tmp_path, path, root="/kubepods/pod2")
    write(mount, cpu_max="200000 100000")
    assert machine.quota() == 2.0


def test_a_mount_point_with_a_space_is_unescaped(tmp_path):
    machine = Machine(tmp_path / "a b", "0::/c1\n")
    mount = machine.mount("/sys/fs/cgroup", "cgroup2")
    write(mount / "c1", cpu_max="100000 100000")
    assert machine.quota() == 1.0


@pytest.mark.parametrize("unified", [False, True], ids=["no cgroup2 mount", "cgroup2 without the cpu controller"])
def test_a_hybrid_machine_reads_the_v1_cpu_hierarchy(tmp_path, unified):
    """As on the development machines: a "0::/" line beside the v1 ones, cgroup2 at /sys/fs/cgroup/unified (or not
    mounted) holding no cpu.max: the cpu controller is v1's."""
    machine = Machine(tmp_path, "9:name=systemd:/\n4:memory:/process_api/d6bc\n2:cpuacct:/\n1:cpu:/job\n0::/\n")
    mount = machine.mount("/sys/fs/cgroup/cpu", "cgroup", "rw,cpu")
    machine.mount("/sys/fs/cgroup/cpuacct", "cgroup", "rw,cpuacct")
    if unified:
        (machine.mount("/sys/fs/cgroup/unified", "cgroup2") / "cgroup.controllers").write_text("hugetlb\n")
    write(mount, cfs_quota="-1", cfs_period="100000")
    write(mount / "job", cfs_quota="50000", cfs_period="100000")
    assert machine.quota() == 0.5 and machine.workers(cores=2) == 1


def test_the_affinity_caps_the_quota(tmp_path):
    machine, mount = v2(tmp_path)
    write(mount, cpu_max="800000 100000")  # 8 CPUs of quota, pinned to 2 cores (taskset, a cpuset)
    assert machine.workers(cores=2) == 2


def test_a_fraction_of_a_cpu_is_one_worker(tmp_path):
    machine, mount = v2(tmp_path)
    write(mount, cpu_max="20000 100000")
    assert machine.quota() == pytest.approx(0.2) and machine.workers() == 1


def test_no_cgroup_files_is_one_worker_per_core(tmp_path):
    machine, _ = v2(tmp_path, "/kubepods/pod1")  # the folder does not exist; the root has no cpu.max (a host's)
    assert machine.quota() is None and machine.workers() == CORES
    assert cpus.default_workers(tmp_path / "nowhere", cores=3) == 3  # no /proc/self files at all


@pytest.mark.parametrize("cpu_max", ["150000", "max", "", "abc 100000", "1.5 1", "0 100000", "150000 0",
                                     "-100000 100000", "150000 100000 7", "9" * 400 + " 1"])
def test_a_malformed_cpu_max_falls_back_to_the_affinity(tmp_path, cpu_max):
    machine, mount = v2(tmp_path)
    write(mount, cpu_max=cpu_max)
    assert machine.quota() is None and machine.workers() == CORES


@pytest.mark.parametrize(("quota", "period"), [("x", "100000"), ("50000", ""), ("50000", "0"), ("-2", "100000"),
                                               ("0", "100000"), ("50000 1", "100000")])
def test_malformed_v1_files_fall_back_to_the_affinity(tmp_path, quota, period):
    machine, mount = v1(tmp_path, "/")
    write(mount, cfs_quota=quota, cfs_period=period)
    assert machine.workers() == CORES


def test_a_malformed_ancestor_spoils_the_answer(tmp_path):
    machine, mount = v2(tmp_path, "/pod1")
    write(mount, cpu_max="max max")
    write(mount / "pod1", cpu_max="100000 100000")
    assert machine.workers() == CORES


@pytest.mark.parametrize("cgroup", ["garbage\n", "0:/\n", "\0\xff\n"])
def test_a_malformed_proc_self_cgroup_falls_back_to_the_affinity(tmp_path, cgroup):
    machine, mount = v2(tmp_path)
    write(mount, cpu_max="100000 100000")
    (machine.proc_self / "cgroup").write_bytes(cgroup.encode("latin-1"))
    assert machine.workers() == CORES


def test_an_unreadable_quota_file_is_passed_over(tmp_path):
    machine, mount = v2(tmp_path, "/pod1")
    write(mount, cpu_max="100000 100000")
    (mount / "pod1" / "cpu.max").mkdir(parents=True)  # reading it fails (IsADirectoryError), as unreadable does
    assert machine.quota() == 1.0


def test_mountinfo_lines_of_other_filesystems_and_odd_lines_are_passed_over(tmp_path):
    machine, mount = v2(tmp_path)
    write(mount, cpu_max="100000 100000")
    lines = (machine.proc_self / "mountinfo").read_text()
    (machine.proc_self / "mountinfo").write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\nnonsense\n24 1 0:5 / /dev rw - devtmpfs\n" + lines)
    assert machine.quota() == 1.0


def test_this_machine_gives_an_answer():
    assert 1 <= cpus.default_workers() <= len(os.sched_getaffinity(0))
