"""What every batch-jobs endpoint answers besides its own: 501 where batch jobs are not served here
(ATTENTION_BATCH_JOBS=0, a KServe predictor), 503 with Retry-After when the queue does not answer; both documented
in openapi.yaml, and the rest of the API unchanged."""

from __future__ import annotations

import pytest
import redis

from service.jobs.store import Store
from service.settings import JobSettings
from tests.unit.edge.jobs.conftest import conforms

# Every batch-jobs operation: (method, path as requested, path as documented).
OPERATIONS = [("post", "/v1/files?purpose=batch", "/v1/files"), ("get", "/v1/files", "/v1/files"),
              ("get", "/v1/files/file-1", "/v1/files/{file_id}"), ("delete", "/v1/files/file-1", "/v1/files/{file_id}"),
              ("get", "/v1/files/file-1/content", "/v1/files/{file_id}/content"),
              ("post", "/v1/batches", "/v1/batches"), ("get", "/v1/batches", "/v1/batches"),
              ("get", "/v1/batches/batch_1", "/v1/batches/{batch_id}"),
              ("post", "/v1/batches/batch_1/cancel", "/v1/batches/{batch_id}/cancel")]


def ask(client, method: str, path: str):
    """The request, with a valid body where it takes one."""
    body = ({"data": b"{}\n", "content_type": "application/x-ndjson"} if "files" in path else
            {"json": {"input_file_id": "file-1", "endpoint": "/v1/attention", "completion_window": "24h"}})
    return getattr(client, method)(path, **(body if method == "post" else {}))


@pytest.mark.parametrize(("method", "path", "documented"), OPERATIONS)
def test_where_batch_jobs_are_not_served_each_endpoint_says_where_they_run(make_app, tmp_path, method, path,
                                                                          documented):
    app = make_app(jobs=JobSettings(data_dir=tmp_path / "data", served=False))
    client = app.test_client()
    response = ask(client, method, path)
    assert response.status_code == 501
    problem = conforms(response, documented, method)
    assert problem["type"].endswith(":jobs-not-served") and "deploy/k8s" in problem["detail"]
    assert "ATTENTION_BATCH_JOBS=0" in problem["detail"]
    assert not (tmp_path / "data").exists()  # no queue opened, nothing stored
    metrics = client.get("/metrics").get_data(as_text=True)
    assert "batch_store_up" not in metrics and "http_requests_total" in metrics  # no census of jobs not served
    assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize(("method", "path", "documented"), OPERATIONS)
def test_a_queue_that_does_not_answer_is_a_503_with_retry_after(app, tmp_path, monkeypatch, method, path,
                                                                documented):
    def silent(*args, **kwargs):
        raise redis.TimeoutError("Timeout reading from 127.0.0.1:6379")

    for name in ("get", "get_many", "put", "claim", "delete", "scan", "commit", "members"):
        monkeypatch.setattr(Store, name, silent)
    response = ask(app.test_client(), method, path)
    assert response.status_code == 503, response.get_data(as_text=True)
    problem = conforms(response, documented, method)
    assert problem["type"].endswith(":queue-unavailable") and response.headers["Retry-After"] == "5"
    files = tmp_path / "data" / "files"
    assert not files.exists() or not list(files.iterdir())  # an upload whose record was not written leaves no body
