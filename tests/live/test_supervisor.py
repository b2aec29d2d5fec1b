"""``attention-serve`` for real (service.runtime.supervisor, what ``make serve`` runs): gunicorn and
ATTENTION_EMBEDDED_WORKERS processes of ``python -m service.jobs.worker`` side by side, each in a process group of its
own; a batch job is computed by them; a killed job worker is started again; SIGTERM stops gunicorn and the job
workers at once, each finishing what it does. No trained model (ATTENTION_MODELS=""): the workers load what the API
serves."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ROOT, children, exited, free_port, process_group, wait_for, wait_until_up
from tests.live.jobs import create, ended, request_line, upload, wait_batch

COMMAND = ["-m", "service.jobs.worker"]


def argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """attention-serve with two job workers on a free port: (its process, its URL, its log file)."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "PROMETHEUS_MULTIPROC_DIR"}
    env.update({"ATTENTION_EMBEDDED_WORKERS": "2", "ATTENTION_DATA_DIR": str(tmp_path / "data"),
                "ATTENTION_MODELS": "", "WEB_CONCURRENCY": "1", "HOST": "127.0.0.1", "PORT": str(port),
                "ATTENTION_BATCH_REAP_SECONDS": "0.5"})
    log = Path(tempfile.mkstemp(prefix="serve-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "service.runtime.supervisor"], cwd=ROOT, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", process, "attention-serve")
        yield process, f"http://127.0.0.1:{port}", log
    finally:
        alive = process.poll() is None
        for group in [process.pid, *(children(process.pid) if alive else [])]:  # its, gunicorn's, each worker's
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        process.wait(timeout=10)
        log.unlink()


def job_workers(supervisor: int) -> list[int]:
    return [pid for pid in children(supervisor) if argv(pid)[1:] == COMMAND]


def test_the_job_workers_run_beside_gunicorn_compute_a_batch_come_back_when_killed_and_stop_with_it(served):
    process, url, log = served
    jobs = wait_for(lambda: len(found := job_workers(process.pid)) == 2 and found, 30, "two job workers")
    [server] = [pid for pid in children(process.pid) if pid not in jobs]
    assert "gunicorn" in " ".join(argv(server))
    for pid in (server, *jobs):
        assert process_group(pid) == pid != process.pid  # a group each: a signal to it reaches what it forked
        assert os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(sys.executable)

    content = b"".join(request_line(f"c{i}", {"tokens": ["cat", "it"]}, "/v1/embed") for i in range(5))
    made = create(url, upload(url, content)["id"], "/v1/embed")
    done = wait_batch(url, made["id"], ended, 60)
    assert done["status"] == "completed" and done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}

    victim, survivor = jobs
    os.killpg(victim, signal.SIGKILL)
    jobs = wait_for(lambda: len(now := job_workers(process.pid)) == 2 and victim not in now and now, 5,
                    "another job worker within 5 s")
    assert survivor in jobs
    wait_for(lambda: f"(pid {victim}) was killed by SIGKILL" in log.read_text(), 5, "the killed worker's end logged")

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0  # gunicorn's graceful stop, passed on
    assert exited(server) and all(exited(pid) for pid in jobs)
    text = log.read_text()
    assert "Shutting down: Master" in text  # gunicorn stopped as told
    assert re.search(r"job worker \d \(pid \d+\) (exited with code 0|was killed by SIGINT)", text), text[-3000:]
    assert "SIGKILL: " not in text and "could not start" not in text
