"""A batch job of census lines (POST /v1/models/{model}/census as its endpoint): each line answered as the endpoint
answers it, a refused one in the error file with its pointer; the lines' censuses combine by their counts."""

from __future__ import annotations

import numpy as np

from tests.unit.edge.jobs.conftest import jobs_of, upload
from tests.unit.edge.v1.test_service_census import TEXTS, URL
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
