"""The real gunicorn in a real cgroup v1 CPU quota, WEB_CONCURRENCY unset: the master forks as many workers as the
quota allows, rounded up (service/runtime/cpus.py; every cgroup layout on fake trees: tests/unit/runtime/test_cpus.py).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Gunicorn, in_ci, wait_for

CPU_HIERARCHY = Path("/sys/fs/cgroup/cpu")  # the development and CI machines: cgroup v1, cpu mounted alone
PERIOD_US = 100_000
SETTLE_SECONDS = 1.0  # gunicorn forks all its workers at start-up, up to 0.1 s apart: any extra one is there by then


def _rmdir(folder: Path) -> bool:
    try:
        folder.rmdir()
    except OSError as error:
        if error.errno == errno.EBUSY:  # a process is still in it
            return False
        raise
    return True


def _remove(folder: Path) -> None:
    """Kills what is left in the cgroup (only this test's gunicorn was put there), then removes it."""
    if not folder.exists():
        return
    for pid in (folder / "cgroup.procs").read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    wait_for(lambda: _rmdir(folder), 10, f"rmdir {folder}")


@contextlib.contextmanager
def cpu_cgroup(quota_us: int) -> Iterator[Path]:
    """A child cgroup of the cpu hierarchy with this quota over PERIOD_US, removed afterwards whatever happened.
    Where it cannot be made (not root, no v1 cpu hierarchy, read-only): a skip, but a failure in CI."""
    folder = CPU_HIERARCHY / f"attention-test-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (folder / "cpu.cfs_quota_us").write_text(str(quota_us))
    except OSError as error:
        _remove(folder)
        message = f"cannot make a cgroup v1 CPU quota at {folder}: {error}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield folder
    finally:
        _remove(folder)


@pytest.mark.parametrize("quota_us", [50_000, 150_000], ids=["0.5 CPU", "1.5 CPUs"])
def test_the_cpu_quota_sets_the_worker_count(quota_us):
    """0.5 CPU on this 2-core machine (affinity 2) gives 1 worker: the quota was read. 1.5 CPUs gives 2, which is
    also the affinity: the pair shows the count follows the quota, rounded up."""
    assert "WEB_CONCURRENCY" not in os.environ  # tests/conftest.py clears it: it would win over the quota
    expected = min(math.ceil(quota_us / PERIOD_US), len(os.sched_getaffinity(0)))
    with cpu_cgroup(quota_us) as folder:
        procs = folder / "cgroup.procs"

        def join() -> None:
            """In the child, before exec: the master, and the workers it forks, run in the cgroup. Plain os calls:
            between fork and exec, no lock another thread of pytest's process held may be needed."""
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

        # debug: the master logs its configuration; no trained model, so a 0.5-CPU start stays quick
        env = {"GUNICORN_LOGLEVEL": "debug", "ATTENTION_MODELS": "", "LOG_REQUESTS": "0"}
        with Gunicorn(env, preexec_fn=join) as server:
            assert str(server.pid) in procs.read_text().split()
            assert b"WEB_CONCURRENCY=" not in Path(f"/proc/{server.pid}/environ").read_bytes()
            wait_for(lambda: len(server.workers()) >= expected, 30, f"{expected} workers")
            time.sleep(SETTLE_SECONDS)
            workers = server.workers()
            log = server.log()
        assert len(workers) == expected, log[-3000:]
        assert re.findall(r"^ {2}workers: (\d+)$", log, re.M) == [str(expected)], log[-3000:]
        assert len(re.findall(r"Booting worker with pid", log)) == expected, log[-3000:]
