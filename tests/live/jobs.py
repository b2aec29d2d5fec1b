"""What the batch-job live tests share: worker processes, input files, the API's calls and the checks of a batch's
files (tests/live/test_jobs_*.py). Real processes only: ``python -m service.jobs.worker`` consumers beside a real
gunicorn (tests/harness.py), on SQLite under a data folder or on a redis-server.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import requests

from tests.close import assert_close
from tests.harness import ROOT, START_TIMEOUT

MHA = "/v1/multi-head-attention"
DEMO5 = {"tokens": ["the", "cat", "ate", "food", "it"], "d_model": 8, "n_heads": 4, "positional_encoding": True,
         "causal": True}
ENCODER = "/v1/encoder"
SMALL = {"query": [[1.0]], "key": [[1.0]], "value": [[1.0]]}
# ~0.1 s a chunk of 64 here: 3,000 of them keep two workers busy for ~3 s, each answer 640 numbers.
SLOW = {"tokens": ["the", "cat", "ate", "food", "it"] * 2, "d_model": 64, "n_heads": 4, "n_layers": 6,
        "return_weights": False}
ENDED = ("completed", "failed", "expired", "cancelled")
# Short leases and reaps: a killed worker's chunk is run again within seconds, not a minute.
QUICK = {"ATTENTION_BATCH_LEASE_SECONDS": "2", "ATTENTION_BATCH_REAP_SECONDS": "0.5"}


def queue_env(data_dir: Path, queue_url: str | None = None, **extra: str) -> dict[str, str]:
    """The jobs' environment shared by an API and its workers: one data folder, SQLite in it or ``queue_url``."""
    env = {"ATTENTION_DATA_DIR": str(data_dir), **QUICK, **extra}
    if queue_url:
        env["ATTENTION_QUEUE_URL"] = queue_url
    return env


class Worker:
    """One ``python -m service.jobs.worker`` in its own process group (so its whole group can be killed), its
    output in a file; stopped (SIGINT, then SIGKILL) when its ``with`` block ends."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.logfile = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", delete=False)  # noqa: SIM115
        environment = {**os.environ, **env}
        self.process = subprocess.Popen([sys.executable, "-m", "service.jobs.worker"], cwd=ROOT, env=environment,
                                        stdout=self.logfile, stderr=subprocess.STDOUT, start_new_session=True)

    def ready(self) -> Worker:
        """This worker, once its consumer runs (its models loaded, its queue open: ~1-2 s here)."""
        deadline = time.monotonic() + START_TIMEOUT
        while "Huey consumer started" not in self.log():
            assert self.process.poll() is None, f"the worker exited: {self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"no consumer after {START_TIMEOUT} s: {self.log()[-3000:]}"
            time.sleep(0.05)
        return self

    def memory_kib(self, field: str = "VmRSS") -> int:
        """The worker's resident memory now (VmRSS) or at its peak so far (VmHWM), KiB."""
        return memory_kib(self.process.pid, field)

    def kill(self) -> None:
        """SIGKILL to the worker's whole process group: a crash mid-task, no clean-up of any kind."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def frozen_holding(self, task: str) -> bool:
        """Freeze the worker's group (SIGSTOP) and read its log: True, left frozen, if a ``task`` has begun and not
        finished in it; False, let go (SIGCONT), if not."""
        os.killpg(self.process.pid, signal.SIGSTOP)
        started, done = self.tasks(task)
        if started > done:
            return True
        self.resume()
        return False

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def log(self) -> str:
        return Path(self.logfile.name).read_text(errors="replace")

    def tasks(self, task: str) -> tuple[int, int]:
        """How many ``task`` tasks (chunk, validate, finalize, reap) this worker has started and finished so far
        (Huey's log lines: "Executing <name>: <id>", "<name>: <id> executed in ...")."""
        return huey_tasks(self.log(), task)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # Huey's graceful stop: the running task finishes
            with contextlib.suppress(subprocess.TimeoutExpired):  # then killed below
                self.process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.logfile.close()
        os.unlink(self.logfile.name)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def huey_tasks(log: str, task: str) -> tuple[int, int]:
    """How many ``task`` tasks a worker's ``log`` shows started and finished (Huey's log lines: "Executing
    <name>: <id>", "<name>: <id> executed in ...")."""
    name = f"service.jobs.tasks.{task}:"
    lines = log.splitlines()
    return (sum(f"Executing {name}" in line for line in lines),
            sum(name in line and " executed in " in line for line in lines))


def frozen_holding(workers: Iterable[Worker], task: str, timeout: float = 30) -> Worker:
    """The first of ``workers`` found (and left) frozen while a ``task`` is in its hands: killed then, it dies
    mid-task, whatever the task's length."""
    workers, deadline = list(workers), time.monotonic() + timeout
    while True:
        for worker in workers:
            if worker.frozen_holding(task):
                return worker
        assert time.monotonic() < deadline, f"no {task} task in the workers' hands within {timeout} s"
        time.sleep(0.002)


def memory_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory now (VmRSS) or at its peak so far (VmHWM), KiB, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1))


def small_file(count: int) -> bytes:
    """An input file of ``count`` of /v1/attention's smallest items (1 x 1 query, key and value: ~0.1 KB a line,
    ~20 us of compute), custom_id ``i<index>``: what the per-item costs of a batch job show on."""
    line = orjson.dumps({"custom_id": "%d", "method": "POST", "url": "/v1/attention", "body": SMALL})
    return b"".join(line.replace(b'"%d"', b'"i%d"' % i) + b"\n" for i in range(count))


def request_line(custom_id: str, body: Any, url: str = MHA) -> bytes:
    """One line of a batch's input file."""
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + b"\n"


def seeded(count: int, seeds: int = 8, body: Any = DEMO5, url: str = MHA) -> tuple[bytes, dict[str, int]]:
    """An input file of ``count`` requests of ``body`` with ``seeds`` different weight seeds, and each custom_id's
    seed."""
    ids = {f"item-{i}": i % seeds for i in range(count)}
    return b"".join(request_line(custom_id, {**body, "seed": seed}, url) for custom_id, seed in ids.items()), ids


def expected(server: str, ids: Mapping[str, int], body: Any = DEMO5, url: str = MHA) -> dict[str, Any]:
    """What the single endpoint answers for each custom_id of :func:`seeded` (one request per seed)."""
    answers = {}
    for seed in set(ids.values()):
        response = requests.post(server + url, json={**body, "seed": seed}, timeout=30)
        assert response.status_code == 200, response.text
        answers[seed] = response.json()
    return {custom_id: answers[seed] for custom_id, seed in ids.items()}


def upload(server: str, content: bytes, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The file object of ``content`` uploaded as a raw NDJSON body (the curl form)."""
    response = requests.post(f"{server}/v1/files?purpose=batch", data=content, timeout=60,
                             headers={"Content-Type": "application/x-ndjson", **(headers or {})})
    assert response.status_code == 200, response.text
    return response.json()


def create(server: str, file_id: str, endpoint: str = MHA) -> dict[str, Any]:
    """A new batch of ``file_id``."""
    response = requests.post(f"{server}/v1/batches", timeout=30, json={
        "input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"})
    assert response.status_code == 200, response.text
    return response.json()


def batch(server: str, batch_id: str) -> dict[str, Any]:
    response = requests.get(f"{server}/v1/batches/{batch_id}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def cancel(server: str, batch_id: str) -> dict[str, Any]:
    response = requests.post(f"{server}/v1/batches/{batch_id}/cancel", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def wait_batch(server: str, batch_id: str, until: Any, timeout: float) -> dict[str, Any]:
    """The batch once ``until(batch)`` holds (polled every 50 ms); fails after ``timeout`` seconds, showing it."""
    deadline = time.monotonic() + timeout
    while not until(found := batch(server, batch_id)):
        assert time.monotonic() < deadline, f"timed out after {timeout} s: {found}"
        time.sleep(0.05)
    return found


def ended(batch_: dict[str, Any]) -> bool:
    return batch_["status"] in ENDED


def lines(server: str, file_id: str | None, headers: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The parsed lines of a file (none for a file id of None)."""
    if file_id is None:
        return []
    response = requests.get(f"{server}/v1/files/{file_id}/content", timeout=60, headers=headers)
    assert response.status_code == 200, response.text
    return [orjson.loads(line) for line in response.content.splitlines()]


def results(server: str, batch_: dict[str, Any], ids: Iterable[str],
            headers: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The output and error lines of an ended batch by custom_id, checked: every id of ``ids`` exactly once across
    both files, no other, and ``request_counts`` equal to the lines."""
    output = lines(server, batch_["output_file_id"], headers)
    errors = lines(server, batch_["error_file_id"], headers)
    assert_accounted(output, errors, ids, batch_["request_counts"])
    return {line["custom_id"]: line for line in output}, {line["custom_id"]: line for line in errors}


def assert_accounted(output: list[dict[str, Any]], errors: list[dict[str, Any]], ids: Iterable[str],
                     counts: Mapping[str, int]) -> None:
    """Every id of ``ids`` in exactly one line of ``output`` and ``errors``, none twice, no other; ``counts`` (the
    batch's ``request_counts``) equal to the lines."""
    seen = [line["custom_id"] for line in output + errors]
    ids = list(ids)
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} custom_ids twice"
    assert sorted(seen) == sorted(ids), f"{len(set(ids) - set(seen))} missing, {len(set(seen) - set(ids))} unknown"
    assert dict(counts) == {"total": len(ids), "completed": len(output), "failed": len(errors)}, counts


def assert_answers(output: dict[str, Any], expected: Mapping[str, Any]) -> None:
    """Each output line is a 200 whose body equals ``expected[custom_id]`` to float rounding."""
    for custom_id, line in output.items():
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        assert_close(line["response"]["body"], expected[custom_id], custom_id)



def started(server: str, count: int) -> tuple[dict[str, Any], dict[str, int]]:
    """A batch of ``count`` slow encoder items, created and seen with some chunks done (or ended): the batch, and
    its ids' seeds."""
    content, ids = seeded(count, body=SLOW, url=ENCODER)
    created = create(server, upload(server, content)["id"], ENCODER)
    return wait_batch(server, created["id"], lambda b: b["request_counts"]["completed"] > 0 or ended(b), 60), ids


def assert_completed(server: str, batch_id: str, ids: Mapping[str, int]) -> None:
    """The batch of :func:`started` completes: every item answered once, as the single endpoint answers it."""
    finished = wait_batch(server, batch_id, ended, 90)
    assert finished["status"] == "completed", finished
    output, errors = results(server, finished, ids)
    assert not errors
    assert_answers(output, expected(server, ids, SLOW, ENCODER))
