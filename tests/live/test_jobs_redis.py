"""The batch jobs against a Redis that misbehaves, every process real (Debian's redis-server, gunicorn,
``python -m service.jobs.worker``): a Redis that stops answering (SIGSTOP: connected, listening, silent), one killed
(SIGKILL) and started again on its append-only file, and one whose password the service does not have.

A silent Redis costs a jobs request a 503 with ``Retry-After`` within the documented bound (twice
ATTENTION_QUEUE_TIMEOUT_SECONDS and a 0.2 s pause, 10.2 s by default: docs/jobs.md), never a hang; /readyz stays
ready; neither the web worker nor the job worker is killed or restarted, and the batch then completes.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.harness import Gunicorn, RedisServer, redis_available
from tests.live.jobs import (
    DEMO5,
    MHA,
    Worker,
    assert_answers,
    assert_completed,
    create,
    ended,
    expected,
    queue_env,
    request_line,
    results,
    seeded,
    started,
    upload,
    wait_batch,
)

BOUND = 15.0  # seconds: what docs/jobs.md promises a jobs request costs at most while Redis is silent (10.2 s now)
ITEMS, CHUNK = 1200, "64"
PASSWORD = "correct-horse-battery-staple"
NDJSON = {"Content-Type": "application/x-ndjson"}


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    if not redis_available():
        pytest.skip("redis-server not installed (apt-get install -y redis-server); CI installs it")


def running(server: str) -> tuple[dict, dict[str, int]]:
    """A batch of slow items, in progress with some of its chunks done: the batch, and its ids' seeds."""
    found, ids = started(server, ITEMS)
    assert found["status"] == "in_progress", found
    return found, ids


def unavailable(response: requests.Response) -> None:
    """A 503 problem saying the queue did not answer, with a Retry-After in whole seconds."""
    assert response.status_code == 503, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.json()["type"].endswith(":queue-unavailable")
    assert int(response.headers["Retry-After"]) >= 1


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def test_a_silent_redis_is_a_503_within_the_bound_and_the_batch_then_completes(data_dir):
    with RedisServer() as redis_server:
        env = queue_env(data_dir, redis_server.url, ATTENTION_BATCH_CHUNK_ITEMS=CHUNK)
        with Worker(env) as worker, Gunicorn(env, workers=2) as api:
            worker.ready()
            batch, ids = running(api.url)
            web_workers = sorted(api.workers())
            stored = set((data_dir / "files").iterdir())
            redis_server.pause()
            try:
                started = time.monotonic()
                with concurrent.futures.ThreadPoolExecutor(2) as pool:  # one request per web worker, side by side
                    asked = [pool.submit(requests.get, f"{api.url}/v1/batches/{batch['id']}", timeout=BOUND),
                             pool.submit(requests.post, f"{api.url}/v1/files?purpose=batch", timeout=BOUND,
                                         data=request_line("a", DEMO5), headers=NDJSON)]
                    answers = [future.result() for future in asked]
                took = time.monotonic() - started
                for answer in answers:
                    unavailable(answer)
                print(f"\nRedis silent: two jobs requests answered 503 in {took:.1f} s")
                ready = requests.get(f"{api.url}/readyz", timeout=5)  # the attention API needs no Redis
                assert ready.status_code == 200 and ready.json() == {"status": "ready"}
                assert requests.post(api.url + MHA, json=DEMO5, timeout=5).status_code == 200
                assert worker.process.poll() is None
            finally:
                redis_server.resume()
            # Answered again without a restart: the same web workers (none killed by gunicorn's timeout), the same
            # job worker, and the upload refused while Redis was silent left no body behind.
            assert set((data_dir / "files").iterdir()) == stored
            assert_completed(api.url, batch["id"], ids)
            assert sorted(api.workers()) == web_workers and worker.process.poll() is None
            late, late_ids = seeded(8)
            finished = wait_batch(api.url, create(api.url, upload(api.url, late)["id"])["id"], ended, 30)
            assert finished["status"] == "completed" and len(results(api.url, finished, late_ids)[0]) == 8


def test_redis_killed_and_restarted_on_its_append_only_file_loses_nothing_acknowledged(data_dir):
    with RedisServer(appendonly=True, password=PASSWORD) as redis_server:
        env = queue_env(data_dir, redis_server.url, ATTENTION_QUEUE_PASSWORD=PASSWORD,
                        ATTENTION_BATCH_CHUNK_ITEMS=CHUNK)
        with Worker(env) as one, Worker(env) as other, Gunicorn(env, workers=1) as api:
            one.ready(), other.ready()
            batch, ids = running(api.url)
            kept = upload(api.url, request_line("kept", DEMO5))  # acknowledged just before the crash
            redis_server.kill()
            time.sleep(1.0)  # workers and API meet a refused connection meanwhile
            redis_server.restart()
            assert requests.get(f"{api.url}/v1/files/{kept['id']}", timeout=30).json() == kept
            assert_completed(api.url, batch["id"], ids)
            assert one.process.poll() is None and other.process.poll() is None


@pytest.mark.parametrize("given", ["wrong", None])
def test_a_worker_without_the_right_password_stops_at_start_with_one_line(data_dir, given):
    with RedisServer(password=PASSWORD) as redis_server:
        url = redis_server.url.replace("redis://", f"redis://:{given}@") if given else redis_server.url
        with Worker(queue_env(data_dir, url)) as worker:
            assert worker.process.wait(timeout=60) == 2
            said = worker.log().strip()
        assert said.startswith("attention-worker: the Redis at ") and "refused the credentials" in said, said
        assert "\n" not in said and "Traceback" not in said and "wrong" not in said  # one line, no password
        # The API with the same settings answers a 503 at once, and the attention API as ever.
        with Gunicorn(queue_env(data_dir, url), workers=1) as api:
            unavailable(requests.get(f"{api.url}/v1/batches", timeout=BOUND))
            assert requests.get(f"{api.url}/readyz", timeout=5).status_code == 200


@pytest.fixture
def api_and_worker(data_dir: Path) -> Iterator[str]:
    """An API and a worker on a Redis that wants a password, given through the URL."""
    with RedisServer(password=PASSWORD) as redis_server:
        env = queue_env(data_dir, redis_server.url.replace("redis://", f"redis://:{PASSWORD}@"))
        with Worker(env) as worker, Gunicorn(env, workers=1) as api:
            worker.ready()
            yield api.url


def test_the_password_in_the_url_reaches_the_api_and_the_workers(api_and_worker):
    content, ids = seeded(20)
    finished = wait_batch(api_and_worker, create(api_and_worker, upload(api_and_worker, content)["id"])["id"],
                          ended, 30)
    assert finished["status"] == "completed"
    assert_answers(results(api_and_worker, finished, ids)[0], expected(api_and_worker, ids))
