"""Job workers beside the web workers in a real gunicorn (service/gunicorn.conf.py, service.runtime.embedded): the
master starts ATTENTION_EMBEDDED_WORKERS processes of ``python -m service.jobs.worker``, each in its own process
group and not one of WEB_CONCURRENCY's workers, starts another when one's group is killed, and stops them when it
stops (SIGINT: Huey's graceful stop). No trained model (ATTENTION_MODELS=""): the workers load what the API serves."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

from tests.harness import Gunicorn, children, exited, new_masters, process_group, stop_master, wait_for

COMMAND = ["-m", "service.jobs.worker"]


def argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def consuming(pid: int, folder: Path) -> bool:
    """Whether the job worker ``pid`` runs its Huey consumer, with its queue in ``folder`` open. Huey sets its signal
    handlers last as it starts (SIGTERM caught: Python leaves it at the default): one signalled before dies of
    SIGINT's KeyboardInterrupt, harmlessly (it ran no task), and is no graceful stop."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # gone, or an fd closed while listed
        caught = int(re.search(r"^SigCgt:\s+([0-9a-f]+)$", Path(f"/proc/{pid}/status").read_text(), re.M)[1], 16)
        files = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        return bool(caught >> (signal.SIGTERM - 1) & 1) and any(name.startswith(f"{folder}/") for name in files)
    return False


def test_the_master_runs_its_job_workers_restarts_a_killed_one_and_stops_them_when_it_stops(tmp_path):
    env = {"ATTENTION_EMBEDDED_WORKERS": "2", "ATTENTION_DATA_DIR": str(tmp_path), "ATTENTION_MODELS": ""}
    with Gunicorn(env, workers=1) as server:
        jobs = wait_for(lambda: len(found := server.job_workers()) == 2 and found, 30, "two job workers")
        wait_for(lambda: all(argv(pid)[1:] == COMMAND for pid in jobs), 5, "the job workers' exec")
        interpreter = os.path.realpath(f"/proc/{server.pid}/exe")
        for pid in jobs:
            assert os.path.realpath(argv(pid)[0]) == interpreter  # the master's python
            assert os.getpgid(pid) == pid != server.pid
        [web] = server.workers()  # WEB_CONCURRENCY's one, in the master's group
        assert os.getpgid(web) == server.pid and argv(web)[1:] != COMMAND
        assert len(re.findall(r"Booting worker with pid", server.log())) == 1

        victim, survivor = jobs
        os.killpg(victim, signal.SIGKILL)
        jobs = wait_for(lambda: len(now := server.job_workers()) == 2 and victim not in now and now, 5,
                        "another job worker within 5 s")
        assert survivor in jobs
        # Popen's child has its own group from setsid on, and the command line from its exec on, a moment later
        wait_for(lambda: all(argv(pid)[1:] == COMMAND for pid in jobs), 5, "the new job worker's exec")
        # The master's reaping of its children leaves the job workers' statuses to the supervisor, which logs them.
        wait_for(lambda: f"(pid {victim}) was killed by SIGKILL" in server.log(), 5, "the killed worker's end logged")
        [web_after] = server.workers()
        assert web_after == web  # gunicorn's own worker untouched

        wait_for(lambda: all(consuming(pid, tmp_path) for pid in jobs), 30, "the job workers consuming")
        server.terminate()
        assert server.process.wait(timeout=60) == 0
        assert all(exited(pid) for pid in jobs), jobs
        log = server.log()
    for pid in jobs:  # each finished of itself after SIGINT, within GUNICORN_GRACEFUL_TIMEOUT: no SIGKILL
        assert f"(pid {pid}) exited with code 0" in log, log[-3000:]
    assert "SIGKILL: " not in log and "could not start" not in log


def test_a_reload_keeps_the_job_workers_and_an_upgrade_in_place_stops_only_the_old_masters(tmp_path):
    """SIGHUP reads the config again in the same master: the job workers go on, and are still stopped at its exit
    (a new supervisor would have left them running). USR2 execs a new master, which starts its own; stopping the
    old master then stops the old master's only."""
    env = {"ATTENTION_EMBEDDED_WORKERS": "1", "ATTENTION_DATA_DIR": str(tmp_path), "ATTENTION_MODELS": ""}
    with Gunicorn(env, workers=1) as server:
        [job] = wait_for(server.job_workers, 30, "the job worker")
        [web] = server.workers()
        os.kill(server.pid, signal.SIGHUP)
        wait_for(lambda: server.workers() not in ([], [web]), 30, "a new web worker")
        assert server.job_workers() == [job]
        masters: list[int] = []
        try:
            os.kill(server.pid, signal.SIGUSR2)
            masters += wait_for(lambda: new_masters(server.pid), 30, "the new master")
            [new_job] = wait_for(lambda: [pid for pid in children(masters[0]) if process_group(pid) == pid], 30,
                                 "the new master's job worker")
            wait_for(lambda: consuming(job, tmp_path), 30, "the old job worker consuming")
            server.terminate()
            assert server.process.wait(timeout=60) == 0
            assert exited(job) and not exited(new_job)
            assert f"(pid {job}) exited with code 0" in server.log()
        finally:  # never leave the new master serving the port, whatever failed
            for pid in {*masters, *new_masters(server.pid)}:
                stop_master(pid)
        assert exited(new_job)
