"""/metrics' batch-job census (service.jobs.census, service.edge.observability.JobsCollector): batches by status,
their requests by outcome and the queue's depth, read from a real SQLite store; left out, with batch_store_up 0,
when the store does not answer. Tasks are run here, one at a time, instead of by a worker, so every state is seen."""

from __future__ import annotations

import orjson
import pytest

from schemas.jobs import STATUSES
from service.settings import JobSettings
from tests.conftest import app_with
from tests.harness import free_port
from tests.unit.edge.test_observability import DEMO5, scrape, value

ENDPOINT = "/v1/multi-head-attention"


@pytest.fixture
def client(tmp_path):
    return app_with(jobs=JobSettings(data_dir=tmp_path, chunk_items=2)).test_client()


def jobs_of(client):
    return client.application.extensions["jobs"]()  # the app's own (built once per process)


def line(custom_id: str, body: object = DEMO5) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": body}


def submit(client, lines: list[object]) -> str:
    """A batch of ``lines`` (dicts as JSON lines, bytes as they are): its id."""
    content = b"".join((item if isinstance(item, bytes) else orjson.dumps(item)) + b"\n" for item in lines)
    file = client.post("/v1/files?purpose=batch", data=content, content_type="application/x-ndjson")
    assert file.status_code == 200, file.get_data(as_text=True)
    batch = client.post("/v1/batches", json={"input_file_id": file.get_json()["id"], "endpoint": ENDPOINT,
                                             "completion_window": "24h"})
    assert batch.status_code == 200, batch.get_data(as_text=True)
    return batch.get_json()["id"]


def run_tasks(client, until=lambda: False) -> None:
    """Run the queued tasks one at a time, as a worker would, until the queue is empty or ``until()``."""
    jobs = jobs_of(client)
    while not until() and (task := jobs.huey.dequeue()) is not None:
        jobs.huey.execute(task)


def status(client, batch_id: str) -> dict:
    return client.get(f"/v1/batches/{batch_id}").get_json()


def census(client) -> tuple[dict[str, float], dict[str, float], float]:
    samples = scrape(client)
    assert value(samples, "batch_store_up") == 1
    return ({status: value(samples, "batch_jobs", status=status) for status in STATUSES},
            {outcome: value(samples, "batch_job_items_total", outcome=outcome) for outcome in ("completed", "failed")},
            value(samples, "batch_queue_depth"))


def test_an_empty_store_lists_every_status_at_zero(client):
    samples = scrape(client)
    assert value(samples, "batch_store_up") == 1
    assert {labels: count for (name, labels), count in samples.items() if name == "batch_jobs"} == {
        (("status", status),): 0 for status in STATUSES}
    assert [value(samples, "batch_job_items_total", outcome=o) for o in ("completed", "failed")] == [0, 0]
    assert ("batch_queue_depth", ()) in samples and value(samples, "batch_queue_depth") == 0


def test_batches_are_counted_by_status_and_their_requests_by_outcome_as_chunks_finish(client):
    refused = {**DEMO5, "n_heads": 3}  # d_model 8 is not divisible by 3: that request's 422, not the batch's failure
    done = submit(client, [line("a"), line("b"), line("c"), line("d", refused)])
    failed = submit(client, [line("a"), b"not json"])
    cancelled = submit(client, [line("a")])
    client.post(f"/v1/batches/{cancelled}/cancel")
    run_tasks(client)
    assert status(client, done)["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert (status(client, failed)["status"], status(client, cancelled)["status"]) == ("failed", "cancelled")

    running = submit(client, [line("a"), line("b"), line("c")])  # two chunks: 2 requests, then 1
    run_tasks(client, until=lambda: status(client, running)["request_counts"]["completed"] == 2)
    waiting = submit(client, [line("a")])
    statuses, requests, depth = census(client)
    assert statuses == {**dict.fromkeys(STATUSES, 0), "completed": 1, "failed": 1, "cancelled": 1,
                        "in_progress": 1, "validating": 1}
    # the refused request, the cancelled batch's (its batch_cancelled line); the running batch's first chunk
    assert requests == {"completed": 3 + 2, "failed": 1 + 1}
    assert depth == jobs_of(client).huey.pending_count() == 2  # its second chunk, the waiting batch's validation

    run_tasks(client)
    statuses, requests, depth = census(client)
    assert statuses == {**dict.fromkeys(STATUSES, 0), "completed": 3, "failed": 1, "cancelled": 1}
    assert (requests, depth) == ({"completed": 3 + 3 + 1, "failed": 1 + 1}, 0)
    assert status(client, waiting)["status"] == "completed"


def test_a_census_of_200_batches_reads_the_store_a_few_times_not_once_per_batch(client):
    batch_ids = [submit(client, [line("a"), line("b"), line("c")]) for _ in range(200)]
    run_tasks(client, until=lambda: status(client, batch_ids[49])["status"] == "completed")  # 50 done, 150 running
    statements: list[str] = []
    jobs_of(client).store.storage.conn.set_trace_callback(statements.append)
    statuses, requests, _ = census(client)
    jobs_of(client).store.storage.conn.set_trace_callback(None)
    assert (statuses["completed"], statuses["in_progress"]) == (50, 150)
    assert requests["completed"] == sum(status(client, b)["request_counts"]["completed"] for b in batch_ids)
    # the scan of the batches, their 1,000 events (500 keys a statement), their running chunks, the queue's length
    assert len([sql for sql in statements if sql.lstrip().lower().startswith("select")]) <= 5, statements


def test_a_store_that_does_not_answer_leaves_the_jobs_metrics_out_and_says_so(tmp_path, caplog):
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: Redis is down
    client = app_with(jobs=JobSettings(data_dir=tmp_path, queue_url=nobody)).test_client()
    samples = scrape(client)
    assert value(samples, "batch_store_up") == 0
    assert not [name for name, _ in samples if name.startswith(("batch_jobs", "batch_job_items", "batch_queue"))]
    assert ("http_requests_in_flight", ()) in samples  # the rest of the scrape is there
    assert "did not answer the census" in caplog.text
