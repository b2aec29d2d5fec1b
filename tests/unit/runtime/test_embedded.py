"""service.runtime.embedded with a small worker in place of service.jobs.worker: real processes, each in its own
group, restarted when killed, stopped by SIGINT or, past the graceful timeout, SIGKILL to the group (gunicorn's
master: tests/live/test_embedded_workers.py)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.runtime import embedded
from service.runtime.embedded import EmbeddedWorkers
from tests.harness import exited, wait_for

# argv: a folder and a mode. It writes <pid>.ready once its handlers are set (holding the pid of a child it started
# in its group), and on SIGINT or SIGTERM finishes "its task" (0.2 s), writes <pid>.<signal> and exits 0.
# "stubborn" ignores SIGINT, and so does the child it starts, which SIG_IGN is inherited by.
WORKER = """
import os, signal, subprocess, sys, time
folder, mode = sys.argv[1:]

def finish(number, frame):
    time.sleep(0.2)
    open(os.path.join(folder, f"{os.getpid()}.{signal.Signals(number).name}"), "w").close()
    sys.exit(0)

if mode == "stubborn":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
else:
    signal.signal(signal.SIGINT, finish)
    signal.signal(signal.SIGTERM, finish)
child = subprocess.Popen(["sleep", "60"])
with open(os.path.join(folder, f"{os.getpid()}.partial"), "w") as out:
    out.write(str(child.pid))
os.rename(os.path.join(folder, f"{os.getpid()}.partial"), os.path.join(folder, f"{os.getpid()}.ready"))
while True:
    time.sleep(1)
"""
LOG = logging.getLogger("test_embedded")


def ready(folder: Path) -> dict[int, int]:
    """Worker pid -> its child's pid, for the workers that have set their signal handlers."""
    return {int(path.stem): int(path.read_text()) for path in folder.glob("*.ready")}


def supervisor(folder: Path, count: int, mode: str = "graceful", graceful_timeout: float = 10) -> EmbeddedWorkers:
    return EmbeddedWorkers(count, graceful_timeout, [sys.executable, "-c", WORKER, str(folder), mode], log=LOG)


@pytest.fixture
def running(tmp_path):
    """Start a supervisor (``running(count, mode, graceful_timeout)``) whose workers are all ready; stopped at the
    end, and every process of their groups killed whatever the test did."""
    started: list[EmbeddedWorkers] = []

    def start(count: int, mode: str = "graceful", graceful_timeout: float = 10) -> EmbeddedWorkers:
        workers = supervisor(tmp_path, count, mode, graceful_timeout)
        started.append(workers)
        workers.start()
        wait_for(lambda: len(ready(tmp_path)) >= count, 30, f"{count} workers ready")
        return workers

    yield start
    for workers in started:
        workers.stop()
    for pid in ready(tmp_path):  # its group holds the child it started too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def test_each_worker_runs_in_a_process_group_of_its_own(running, tmp_path):
    workers = running(3)
    pids = workers.pids()
    assert sorted(pids) == sorted(ready(tmp_path)) and len(pids) == 3
    for pid in pids:
        assert os.getpgid(pid) == pid != os.getpgid(0)
        assert os.getsid(pid) == pid  # a session too: a terminal's Ctrl-C reaches the master only


def test_a_killed_worker_is_restarted_within_5_s_and_its_end_logged(running, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    workers = running(2)
    victim, survivor = workers.pids()
    os.killpg(victim, signal.SIGKILL)
    wait_for(lambda: len(now := workers.pids()) == 2 and victim not in now, 5, "a new worker within 5 s")
    assert survivor in workers.pids()
    assert f"(pid {victim}) was killed by SIGKILL" in caplog.text
    wait_for(lambda: len(ready(tmp_path)) == 3, 30, "the new worker ready")


def test_a_worker_that_dies_at_once_is_started_less_and_less_often(caplog):
    """At most one start a second, the wait doubling while each dies at once: a broken worker (its queue
    unreachable, say) must not fork at full speed. (Lower bounds: a slow machine only lengthens the waits.)"""
    caplog.set_level(logging.INFO, logger=LOG.name)
    workers = EmbeddedWorkers(1, 5, [sys.executable, "-c", "raise SystemExit(3)"], log=LOG)
    workers.start()
    try:
        starts = wait_for(lambda: len(found := [r.created for r in caplog.records if "started" in r.getMessage()])
                          >= 3 and found, 30, "three starts")
    finally:
        workers.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.8, gaps  # 1 s, then 2 s
    assert "exited with code 3" in caplog.text


@pytest.mark.parametrize(("graceful", "name"), [(True, "SIGINT"), (False, "SIGTERM")])
def test_stop_lets_each_worker_finish_its_task(running, tmp_path, caplog, graceful, name):
    """SIGINT is Huey's graceful stop (the running task finishes); SIGTERM, for gunicorn's quick shutdown, its
    immediate one. Either way each worker exits of itself, within the timeout: no SIGKILL."""
    caplog.set_level(logging.INFO, logger=LOG.name)
    workers = running(2)
    pids = workers.pids()
    workers.interrupt(graceful)
    workers.stop()
    assert workers.pids() == []
    assert sorted(int(path.stem) for path in tmp_path.glob(f"*.{name}")) == sorted(pids)
    assert caplog.text.count("exited with code 0") == 2 and "SIGKILL" not in caplog.text


def test_a_worker_that_ignores_sigint_is_killed_with_its_group_after_the_timeout(running, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    workers = running(1, "stubborn", graceful_timeout=0.5)
    [(pid, child)] = ready(tmp_path).items()
    assert os.getpgid(child) == pid  # what it forked shares its group
    workers.stop()
    assert exited(pid) and exited(child)
    assert "still running 0.5 s after the stop signal: SIGKILL" in caplog.text
    assert "was killed by SIGKILL" in caplog.text
    assert not list(tmp_path.glob("*.SIGINT"))


def test_none_is_none(tmp_path):
    workers = supervisor(tmp_path, 0)
    server = SimpleNamespace(log=LOG, reap_workers=print, stop=print)  # what when_ready would wrap
    workers.when_ready(server)
    assert workers.pids() == [] and server.reap_workers is print and server.stop is print  # gunicorn's own
    workers.on_exit(server)


def test_only_the_process_that_started_them_stops_them(running, tmp_path):
    """A web worker is a fork of the master: it holds the supervisor too, but must never stop the master's workers."""
    workers = running(2)
    pids = workers.pids()
    child = os.fork()
    if child == 0:  # as a web worker would, should it ever call the hooks
        workers.interrupt()
        workers.stop()
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    assert workers.pids() == pids and not list(tmp_path.glob("*.SIG*"))


def test_a_config_reload_keeps_the_running_supervisor(running):
    """gunicorn's SIGHUP reads service/gunicorn.conf.py again in the same master: a new supervisor would not know
    the running workers, and its on_exit would leave them behind."""
    workers = running(1)
    assert EmbeddedWorkers.at_config_load(1, 20) is workers
    workers.stop()
    assert EmbeddedWorkers.at_config_load(1, 20) is not workers and embedded._running is None


def test_a_command_that_cannot_start_is_logged_and_tried_again(tmp_path, caplog):
    workers = EmbeddedWorkers(1, 5, [str(tmp_path / "missing")], log=LOG)
    workers.start()
    try:
        wait_for(lambda: caplog.text.count("could not start job worker 1") >= 2, 10, "a second attempt")
    finally:
        workers.stop()
