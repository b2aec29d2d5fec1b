"""The batch jobs through the official ``openai`` package, with only its ``base_url`` changed: a real gunicorn, a
real worker (``python -m service.jobs.worker``) on the SQLite queue, each result equal to the single endpoint's
answer over HTTP, lists paged by the client's own cursor, cancellation and deletion as the client calls them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import requests
from openai import OpenAI

from tests.live.conftest import gunicorn_server
from tests.live.jobs import (
    DEMO5,
    ENCODER,
    MHA,
    SLOW,
    Worker,
    assert_answers,
    expected,
    queue_env,
    request_line,
    results,
    seeded,
)

MODEL = "/v1/models/all-minilm-l6-v2/attention"
TEXTS = ["The cat sat on the mat.", "Attention is all you need.", "A short one.", "Batches outlive a request."]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """One worker for every server of this module (they share its data folder, hence the queue)."""
    with Worker(queue_env(tmp_path_factory.mktemp("jobs-openai"))) as running:
        yield running


@pytest.fixture(scope="module")
def server(worker: Worker) -> Iterator[str]:
    with gunicorn_server(**worker.env, WEB_CONCURRENCY="2") as url:
        worker.ready()  # booted beside gunicorn: the timings below are the queue's, not a start-up's
        yield url


@pytest.fixture
def client(server: str) -> OpenAI:
    return OpenAI(base_url=server + "/v1", api_key="k", max_retries=0, timeout=60)


def run(client: OpenAI, path: Path, endpoint: str, timeout: float = 60) -> tuple[openai.types.Batch, dict[str, float]]:
    """Upload ``path``, create its batch, retrieve it until it ends: the batch, and when (seconds after the
    create call) it was first seen ``in_progress`` and ended."""
    with path.open("rb") as file:
        uploaded = client.files.create(file=file, purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == path.stat().st_size
    start = time.monotonic()
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")
    assert batch.status == "validating" and batch.request_counts.total == 0
    seen: dict[str, float] = {}
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() - start < timeout, batch
        time.sleep(0.02)
        batch = client.batches.retrieve(batch.id)
        if batch.status != "validating":
            seen.setdefault("in_progress", time.monotonic() - start)
    seen["ended"] = time.monotonic() - start
    return batch, seen


def test_a_batch_through_the_openai_client_equals_the_single_endpoint(client, server, tmp_path):
    content, seeds = seeded(40, seeds=5)
    content += request_line("refused", {**DEMO5, "n_heads": 3})  # 8 is not a multiple of 3: the endpoint's 422
    (path := tmp_path / "requests.jsonl").write_bytes(content)
    batch, times = run(client, path, MHA)
    print(f"\nsmall batch (41 demo-5 items, one worker): submit -> in_progress {times['in_progress']:.3f} s, "
          f"-> completed {times['ended']:.3f} s")
    assert batch.status == "completed" and batch.completed_at and batch.in_progress_at
    assert batch.request_counts.total == 41 and batch.request_counts.failed == 1
    # files.content sends Accept: application/binary; the answer is the file whatever it asks.
    output = client.files.content(batch.output_file_id).content
    errors = client.files.content(batch.error_file_id).content
    as_http = requests.post(server + MHA, json={**DEMO5, "n_heads": 3}, timeout=30)
    found_out, found_err = results(server, batch.model_dump(), [*seeds, "refused"])
    assert len(output.splitlines()) == 40 and len(errors.splitlines()) == 1
    assert_answers(found_out, expected(server, seeds))
    refused = found_err["refused"]["response"]
    assert refused["status_code"] == as_http.status_code == 422
    assert refused["body"]["errors"] == as_http.json()["errors"]  # pointers relative to the body, as the endpoint's
    assert refused["body"]["request_id"] == refused["request_id"]


def test_the_model_endpoint_in_a_batch_of_its_own(client, server, tmp_path):
    bodies = {f"text-{i}": {"text": text, "layers": [0, 5], "heads": [1]} for i, text in enumerate(TEXTS)}
    (path := tmp_path / "texts.jsonl").write_bytes(b"".join(request_line(custom_id, body, MODEL)
                                                            for custom_id, body in bodies.items()))
    batch, _ = run(client, path, MODEL)
    assert batch.status == "completed", batch
    output, errors = results(server, batch.model_dump(), bodies)
    assert not errors
    assert_answers(output, {custom_id: requests.post(server + MODEL, json=body, timeout=30).json()
                            for custom_id, body in bodies.items()})


def test_a_batch_of_mixed_endpoints_fails_naming_the_line(client, tmp_path):
    (path := tmp_path / "mixed.jsonl").write_bytes(request_line("a", DEMO5) + request_line("b", {"text": "x"}, MODEL))
    batch, _ = run(client, path, MHA)
    assert batch.status == "failed" and batch.failed_at
    assert [(error.code, error.line, error.param) for error in batch.errors.data] == [("mismatched_url", 2, "url")]


def test_lists_page_through_the_clients_cursor(client, tmp_path):
    (path := tmp_path / "one.jsonl").write_bytes(request_line("a", DEMO5))
    uploaded = []
    for _ in range(5):
        with path.open("rb") as file:
            uploaded.append(client.files.create(file=file, purpose="batch").id)
    created = [client.batches.create(input_file_id=file_id, endpoint=MHA, completion_window="24h").id
               for file_id in uploaded[:3]]
    first = client.files.list(limit=2)
    assert len(first.data) == 2 and first.has_more
    files = [file.id for file in client.files.list(limit=2)]  # every page, each after the last id of the one before
    assert len(files) == len(set(files)) and set(uploaded) <= set(files)
    batches = [batch.id for batch in client.batches.list(limit=2)]
    assert len(batches) == len(set(batches)) and set(created) <= set(batches)
    assert batches == sorted(batches, key=lambda i: -client.batches.retrieve(i).created_at)  # newest first


def test_cancel_and_delete_through_the_client(client, server, tmp_path):
    content, ids = seeded(3000, body=SLOW, url=ENCODER)  # ~6 s of one worker
    (path := tmp_path / "many.jsonl").write_bytes(content)
    with path.open("rb") as file:
        uploaded = client.files.create(file=file, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=ENCODER, completion_window="24h")
    with pytest.raises(openai.ConflictError):  # an unfinished batch still reads it
        client.files.delete(uploaded.id)
    deadline = time.monotonic() + 30
    while (batch := client.batches.retrieve(batch.id)).request_counts.completed == 0:
        assert batch.status in ("validating", "in_progress") and time.monotonic() < deadline, batch
        time.sleep(0.02)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    while (batch := client.batches.retrieve(batch.id)).status != "cancelled":
        assert batch.status == "cancelling" and time.monotonic() < deadline, batch
        time.sleep(0.02)
    assert batch.cancelled_at and batch.completed_at is None
    output, errors = results(server, batch.model_dump(), ids)
    assert 0 < len(output) < len(ids) and {line["error"]["code"] for line in errors.values()} == {"batch_cancelled"}
    with pytest.raises(openai.ConflictError):  # it has ended
        client.batches.cancel(batch.id)
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(uploaded.id)


def test_with_api_keys_each_key_sees_only_its_own(worker, tmp_path):
    with gunicorn_server(**worker.env, API_KEYS="k,other") as keyed:
        mine, theirs = (OpenAI(base_url=keyed + "/v1", api_key=key, max_retries=0) for key in ("k", "other"))
        (path := tmp_path / "one.jsonl").write_bytes(request_line("a", DEMO5))
        batch, _ = run(mine, path, MHA)
        assert batch.status == "completed"
        with pytest.raises(openai.NotFoundError):
            theirs.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            theirs.files.content(batch.output_file_id)
        assert batch.id not in [found.id for found in theirs.batches.list()]
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=keyed + "/v1", api_key="wrong", max_retries=0).batches.list()
        key = {"Authorization": "Bearer k"}
        output, _ = results(keyed, batch.model_dump(), ["a"], key)
        assert_answers(output, {"a": requests.post(keyed + MHA, json=DEMO5, headers=key, timeout=30).json()})
