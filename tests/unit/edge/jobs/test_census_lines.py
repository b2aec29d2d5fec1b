"""A batch job of census lines (POST /v1/models/{model}/census as its endpoint): each line answered as the endpoint
answers it, a refused one in the error file with its pointer; the lines' censuses combine by their counts."""

from __future__ import annotations

import numpy as np

from service.settings import Limits
from tests.unit.edge.jobs.conftest import jobs_of, upload
from tests.unit.edge.v1.test_service_census import MODEL, TEXTS, URL
from tests.unit.jobs.conftest import drain, lines_of, request_line


def test_a_batch_job_of_census_lines_answers_as_the_endpoint_and_its_lines_combine(app, client):
    bodies = [{"texts": TEXTS[:2], "dtype": "float64"}, {"texts": TEXTS[2:], "dtype": "float64"}, {"texts": [""]}]
    content = b"".join(request_line(f"c{i}", body, URL) + b"\n" for i, body in enumerate(bodies))
    file = upload(client, content)
    batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": URL,
                                             "completion_window": "24h"})
    assert batch.status_code == 200, batch.get_data(as_text=True)
    drain(jobs_of(app))
    done = client.get(f"/v1/batches/{batch.get_json()['id']}").get_json()
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    lines = {line["custom_id"]: line for line in lines_of(jobs_of(app), done["output_file_id"])}
    whole = client.post(URL, json={"texts": TEXTS, "dtype": "float64"}).get_json()
    for i in (0, 1):
        assert lines[f"c{i}"]["response"]["status_code"] == 200
        assert lines[f"c{i}"]["response"]["body"] == client.post(URL, json=bodies[i]).get_json()
    # the docs' recipe: mean = sum(mean_i * count_i) / sum(count_i), counts added
    for name, entry in whole["statistics"].items():
        parts = [lines[f"c{i}"]["response"]["body"]["statistics"][name] for i in (0, 1)]
        assert sum(part["count"] for part in parts) == entry["count"]
        combined = sum(np.asarray(part["mean"]) * part["count"] for part in parts) / entry["count"]
        assert np.abs(combined - np.asarray(entry["mean"])).max() <= 1e-12, name
    [error] = lines_of(jobs_of(app), done["error_file_id"])
    assert error["custom_id"] == "c2" and error["response"]["status_code"] == 422
    assert [e["pointer"] for e in error["response"]["body"]["errors"]] == ["/texts/0"]


def test_a_census_line_past_a_batch_budget_runs_alone_in_a_job(make_app):
    """/v1/batch refuses an item past max_batch_elements (413); a job's line within its endpoint's limits runs alone
    (a decoder's census of 64 sentences costs ~5x the default budget)."""
    app = make_app(limits=Limits(max_batch_elements=1000))
    client = app.test_client()
    body = {"texts": TEXTS, "decimals": 4}
    assert client.post("/v1/batch", json={"requests": [{"id": "a", "op": "census",
                                                        "body": {**body, "model": MODEL}}]}).status_code == 413
    file = upload(client, b"".join(request_line(f"c{i}", body, URL) + b"\n" for i in range(2)))
    batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": URL, "completion_window": "24h"})
    drain(jobs_of(app))
    done = client.get(f"/v1/batches/{batch.get_json()['id']}").get_json()
    assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    expected = client.post(URL, json=body).get_json()
    assert [line["response"]["body"] for line in lines_of(jobs_of(app), done["output_file_id"])] == [expected] * 2
