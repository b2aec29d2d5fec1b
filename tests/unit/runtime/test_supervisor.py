"""service.runtime.supervisor with small programs in place of gunicorn and service.jobs.worker: real processes, each
in its own group, a job worker restarted when killed, every one stopped by the signal the supervisor forwards or,
past the graceful timeout, SIGKILL to the group (the real gunicorn and workers: tests/live/test_supervisor.py)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from service.runtime.supervisor import JobWorkers
from tests.conftest import ROOT
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
LOG = logging.getLogger("test_supervisor")


def ready(folder: Path) -> dict[int, int]:
    """Worker pid -> its child's pid, for the workers that have set their signal handlers."""
    return {int(path.stem): int(path.read_text()) for path in folder.glob("*.ready")}


def job_workers(folder: Path, count: int, mode: str = "graceful", graceful_timeout: float = 10) -> JobWorkers:
    return JobWorkers(count, graceful_timeout, [sys.executable, "-c", WORKER, str(folder), mode], log=LOG)


@pytest.fixture
def running(tmp_path):
    """Start job workers (``running(count, mode, graceful_timeout)``), checked every 0.5 s by a thread as the
    supervisor checks them, until all are ready; stopped at the end, and every process of their groups killed
    whatever the test did."""
    started: list[tuple[JobWorkers, threading.Event]] = []

    def start(count: int, mode: str = "graceful", graceful_timeout: float = 10) -> JobWorkers:
        workers, done = job_workers(tmp_path, count, mode, graceful_timeout), threading.Event()
        started.append((workers, done))
        workers.start()

        def check() -> None:
            while not done.wait(0.5):
                workers.check()

        threading.Thread(target=check, daemon=True).start()
        wait_for(lambda: len(ready(tmp_path)) >= count, 30, f"{count} workers ready")
        return workers

    yield start
    for workers, done in started:
        done.set()
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
    workers = JobWorkers(1, 5, [sys.executable, "-c", "raise SystemExit(3)"], log=LOG)
    workers.start()
    try:
        starts = wait_for(lambda: workers.check() or (len(
            found := [r.created for r in caplog.records if "started" in r.getMessage()]) >= 3 and found), 30,
            "three starts")
    finally:
        workers.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.8, gaps  # 1 s, then 2 s
    assert "exited with code 3" in caplog.text


@pytest.mark.parametrize(("graceful", "name"), [(True, "SIGINT"), (False, "SIGTERM")])
def test_stop_lets_each_worker_finish_its_task(running, tmp_path, caplog, graceful, name):
    """SIGINT is Huey's graceful stop (the running task finishes); SIGTERM, when gunicorn stops quickly, its
    immediate one. Either way each worker exits of itself, within the timeout: no SIGKILL."""
    caplog.set_level(logging.INFO, logger=LOG.name)
    workers = running(2)
    pids = workers.pids()
    workers.interrupt(signal.SIGINT if graceful else signal.SIGTERM)
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
    assert exited(pid)  # reaped by the supervisor; its child, killed with the group, is init's to reap:
    wait_for(lambda: exited(child), 10, "the worker's child gone")  # a moment later on a loaded machine
    assert "still running 0.5 s after the stop signal: SIGKILL" in caplog.text
    assert "was killed by SIGKILL" in caplog.text
    assert not list(tmp_path.glob("*.SIGINT"))


def test_none_is_none(tmp_path):
    workers = job_workers(tmp_path, 0)
    workers.start()
    workers.check()
    assert workers.pids() == []
    workers.stop()


def test_a_command_that_cannot_start_is_logged_and_tried_again(tmp_path, caplog):
    workers = JobWorkers(1, 5, [str(tmp_path / "missing")], log=LOG)
    workers.start()
    try:
        wait_for(lambda: workers.check() or caplog.text.count("could not start job worker 1") >= 2, 10,
                 "a second attempt")
    finally:
        workers.stop()


# The supervisor in a process of its own (it sets signal handlers, which only a main thread may): the server a
# WORKER in "graceful" mode, as are its two job workers; argv: the folder.
SUPERVISED = f"""
import sys
from service.runtime.supervisor import JobWorkers, Supervisor
folder = sys.argv[1]
program = [sys.executable, "-c", {WORKER!r}, folder, "graceful"]
sys.exit(Supervisor([*program[:-1], "server"], JobWorkers(2, 10, program)).run())
"""


@pytest.fixture
def supervised(tmp_path):
    """The supervisor, its server and its two job workers all ready (server: the one whose mode is "server",
    which handles SIGINT and SIGTERM as the workers do); everything killed at the end."""
    process = subprocess.Popen([sys.executable, "-c", SUPERVISED, str(tmp_path)], cwd=ROOT)
    try:
        wait_for(lambda: len(ready(tmp_path)) == 3, 30, "the server and two job workers ready")
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)
        for pid in ready(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def server_and_workers(folder: Path, supervisor: int) -> tuple[int, list[int]]:
    """The server's pid (the child whose command line ends in "server") and the job workers' pids."""
    pids = list(ready(folder))
    [server] = [pid for pid in pids if Path(f"/proc/{pid}/cmdline").read_bytes().endswith(b"server\0")]
    return server, sorted(set(pids) - {server})


@pytest.mark.parametrize(("sent", "to_server", "to_workers"), [
    (signal.SIGTERM, "SIGTERM", "SIGINT"),   # a container's stop: gunicorn's graceful stop, Huey's graceful stop
    (signal.SIGINT, "SIGINT", "SIGTERM"),    # Ctrl-C: both quick
])
def test_a_stop_signal_goes_to_gunicorn_and_the_job_workers_at_once(supervised, tmp_path, sent, to_server,
                                                                    to_workers):
    server, workers = server_and_workers(tmp_path, supervised.pid)
    assert all(os.getpgid(pid) == pid != os.getpgid(supervised.pid) for pid in (server, *workers))
    supervised.send_signal(sent)
    assert supervised.wait(timeout=30) == 0  # the server's status
    assert (tmp_path / f"{server}.{to_server}").exists()
    assert all((tmp_path / f"{pid}.{to_workers}").exists() for pid in workers)
    assert exited(server) and all(exited(pid) for pid in workers)


def test_sighup_goes_to_gunicorn_only(supervised, tmp_path):
    _, workers = server_and_workers(tmp_path, supervised.pid)
    supervised.send_signal(signal.SIGHUP)  # the server program has no SIGHUP handler: it ends, as a crash would
    assert supervised.wait(timeout=30) == 128 + signal.SIGHUP  # gunicorn's end, passed on as a shell says it
    assert all((tmp_path / f"{pid}.SIGINT").exists() for pid in workers)  # then stopped gracefully, by the supervisor
