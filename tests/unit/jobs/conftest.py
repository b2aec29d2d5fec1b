"""The batch jobs driven without a consumer: a real queue (SQLite in tmp_path, or a redis-server started here on a
free loopback port), files stored as the API stores them, and the queued tasks run one by one in this process, so
every state between two tasks can be looked at. Imported by tests/unit/edge/jobs too (``drain``, ``lines_of``)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from huey import signals

from service.jobs import batches, files, queue
from service.jobs.context import Jobs
from service.settings import JobSettings, Limits
from tests.harness import free_port

REDIS_SERVER = Path("/usr/bin/redis-server")
BACKENDS = ("sqlite", "redis")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """A redis-server of our own on loopback, nothing saved to disk; skipped where Debian's is not installed."""
    if not REDIS_SERVER.exists():
        pytest.skip("needs Debian's redis-server (/usr/bin/redis-server)")
    port = free_port()
    server = subprocess.Popen([str(REDIS_SERVER), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        server.terminate()
        server.wait(10)


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """The server's URL, emptied for this test (the queue's name is fixed)."""
    redis.Redis.from_url(redis_server).flushall()
    return redis_server


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str | None:
    """None (SQLite under the data dir) or a Redis URL."""
    return None if request.param == "sqlite" else request.getfixturevalue("redis_url")


def watched(jobs: Jobs) -> Jobs:
    """``jobs`` keeping its tasks' exceptions in ``jobs.task_errors`` (Huey logs and swallows them), so that
    :func:`step` fails on them."""
    jobs.task_errors = []

    @jobs.huey.signal(signals.SIGNAL_ERROR)
    def keep(signal: str, task: Any, error: BaseException | None = None) -> None:
        jobs.task_errors.append((task.name, error))

    return jobs


def build(data_dir: Path, queue_url: str | None = None, limits: Limits | None = None, **settings: Any) -> Jobs:
    """Jobs on a real queue, watched."""
    return watched(queue.build(JobSettings(data_dir=data_dir, queue_url=queue_url, **settings), limits or Limits()))


@pytest.fixture
def make_jobs(tmp_path: Path, backend: str | None) -> Callable[..., Jobs]:
    """``make_jobs(chunk_items=3, limits=Limits(...))``: jobs on this test's backend and data dir."""
    return lambda **settings: build(tmp_path / "data", backend, **settings)


def request_line(custom_id: str, body: Any, url: str = "/v1/multi-head-attention", **members: Any) -> bytes:
    """One input line (no newline)."""
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body, **members})


def upload(jobs: Jobs, content: bytes, owner: str = "") -> str:
    """A file stored as POST /v1/files stores it: its id."""
    file_id, size = files.save(jobs, [content])
    files.record(jobs, owner, file_id, size, "input.jsonl", "batch")
    return file_id


def submit(jobs: Jobs, content: bytes, endpoint: str = "/v1/multi-head-attention", owner: str = "") -> str:
    """A batch of ``content``, created (``validating``): its id."""
    file_id = upload(jobs, content, owner)
    return batches.create(jobs, owner, {"input_file_id": file_id, "endpoint": endpoint,
                                        "completion_window": "24h"})["id"]


def step(jobs: Jobs) -> str | None:
    """Run the next task that is due, as a consumer would: its name, or None when none is left. One scheduled for
    later (the reaper's next run) goes to the schedule, where it stays: the tests run the reaper themselves."""
    while jobs.huey.pending_count() and (task := jobs.huey.dequeue()) is not None:  # Redis' waits 1 s when empty
        if jobs.huey.ready_to_run(task):
            jobs.huey.execute(task)
            assert not jobs.task_errors, jobs.task_errors
            return task.name
        jobs.huey.add_schedule(task)
    return None


def drain(jobs: Jobs) -> list[str]:
    """Run queued tasks until none is left: their names, in order."""
    names = []
    while (name := step(jobs)) is not None:
        names.append(name)
    return names


def lines_of(jobs: Jobs, file_id: str | None) -> list[dict[str, Any]]:
    """The JSON lines of a stored file ([] for None)."""
    if file_id is None:
        return []
    return [orjson.loads(line) for line in body_of(jobs, file_id).splitlines()]


def body_of(jobs: Jobs, file_id: str) -> bytes:
    """A stored file's body, as GET /v1/files/{id}/content reads it."""
    with files.content(jobs, "", file_id)[1] as body:
        return body.read()


def results(jobs: Jobs, batch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """custom_id -> its line, across a finished batch's output and error files; each custom_id exactly once."""
    found = lines_of(jobs, batch["output_file_id"]) + lines_of(jobs, batch["error_file_id"])
    by_id = {line["custom_id"]: line for line in found}
    assert len(by_id) == len(found), "a custom_id appears twice"
    return by_id
