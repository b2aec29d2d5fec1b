"""/v1/batches: creation (answered at once, validating), its refusals, the list paged as OpenAI's, cancellation,
and, with API_KEYS, each key's files and batches hidden from the others; each answer as openapi.yaml says."""

from __future__ import annotations

import orjson
import pytest

from service.jobs.endpoints import endpoints
from service.settings import Access, JobSettings
from tests.conftest import assert_problem
from tests.unit.edge.jobs.conftest import conforms, jobs_of, upload
from tests.unit.jobs.conftest import body_of, drain, lines_of, request_line

MHA = "/v1/multi-head-attention"
LINES = b"".join(request_line(f"r{i}", {"tokens": ["the", "cat"], "d_model": 4, "n_heads": 2}) + b"\n"
                 for i in range(3))
NULLS = ("output_file_id", "error_file_id", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
         "expired_at", "cancelling_at", "cancelled_at", "errors")


def create(client, file_id: str, headers: dict | None = None, **request):
    return client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": MHA, "completion_window": "24h",
                                            **request}, headers=headers or {})


def test_a_new_batch_is_validating_with_zero_counts_and_expires_a_window_later(client):
    file = upload(client, LINES)
    response = create(client, file["id"], metadata={"corpus": "lesson-3"})
    batch = conforms(response, "/v1/batches", "post")
    assert batch["id"].startswith("batch_") and len(batch["id"]) == 30
    assert {key: batch[key] for key in ("object", "endpoint", "input_file_id", "completion_window", "status",
                                        "request_counts", "metadata")} == {
        "object": "batch", "endpoint": MHA, "input_file_id": file["id"], "completion_window": "24h",
        "status": "validating", "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": {"corpus": "lesson-3"}}
    assert all(batch[key] is None for key in NULLS)
    assert batch["expires_at"] == batch["created_at"] + 86400
    assert conforms(client.get(f"/v1/batches/{batch['id']}"), "/v1/batches/{batch_id}", "get") == batch


def test_a_batch_run_to_its_end_as_the_client_sees_it(app, client):
    file = upload(client, LINES + request_line("bad", {"tokens": ["dog"]}) + b"\n")
    batch = create(client, file["id"]).get_json()
    drain(jobs_of(app))
    done = conforms(client.get(f"/v1/batches/{batch['id']}"), "/v1/batches/{batch_id}", "get")
    assert done["status"] == "completed" and done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    output = client.get(f"/v1/files/{done['output_file_id']}/content", headers={"Accept": "application/binary"})
    assert sorted(line["custom_id"] for line in lines_of(jobs_of(app), done["output_file_id"])) == ["r0", "r1", "r2"]
    assert output.get_data() == body_of(jobs_of(app), done["output_file_id"])
    record = conforms(client.get(f"/v1/files/{done['error_file_id']}"), "/v1/files/{file_id}", "get")
    assert record["purpose"] == "batch_output" and record["bytes"] == len(
        client.get(f"/v1/files/{done['error_file_id']}/content").get_data())


def test_a_file_that_fails_validation_fails_the_batch_with_its_errors(app, client):
    file = upload(client, LINES + b"{bad\n")
    batch = create(client, file["id"]).get_json()
    drain(jobs_of(app))
    failed = conforms(client.get(f"/v1/batches/{batch['id']}"), "/v1/batches/{batch_id}", "get")
    assert failed["status"] == "failed" and failed["failed_at"] is not None
    assert [(e["code"], e["line"]) for e in failed["errors"]["data"]] == [("invalid_json_line", 4)]


def test_an_unknown_input_file_or_one_of_another_purpose(app, client):
    assert_problem(create(client, "file-nope"), 422, "/input_file_id")
    file = upload(client, LINES)
    batch = create(client, file["id"]).get_json()
    drain(jobs_of(app))
    output_id = client.get(f"/v1/batches/{batch['id']}").get_json()["output_file_id"]
    response = create(client, output_id)
    assert "'batch_output'" in assert_problem(response, 422, "/input_file_id")["detail"]
    conforms(response, "/v1/batches", "post")


def test_an_endpoint_that_is_no_batch_endpoint_names_those_that_are(client):
    file = upload(client, LINES)
    for endpoint in ("/v1/batch", "/v1/positional-encoding", "/v1/nope"):
        response = create(client, file["id"], endpoint=endpoint)
        detail = assert_problem(response, 422, "/endpoint")["detail"]
        assert all(known in detail for known in endpoints()), detail
        conforms(response, "/v1/batches", "post")


@pytest.mark.parametrize(("request_", "where"), [
    ({"completion_window": "48h"}, "/completion_window"),
    ({"completion_window": None}, "/completion_window"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "/metadata"),
    ({"metadata": {"k" * 65: "v"}}, "/metadata/" + "k" * 65 + "/key"),
    ({"metadata": {"k": "v" * 513}}, "/metadata/k/value"),
    ({"metadata": {"k": 1}}, "/metadata/k/value"),
])
def test_a_window_other_than_24h_and_metadata_past_openai_s_limits(client, request_, where):
    file = upload(client, LINES)
    response = create(client, file["id"], **request_)
    assert_problem(response, 422, where)
    conforms(response, "/v1/batches", "post")


def test_metadata_of_16_pairs_of_64_and_512_characters_is_kept(client):
    metadata = {f"{i:02}" + "k" * 62: "v" * 512 for i in range(16)}
    batch = conforms(create(client, upload(client, LINES)["id"], metadata=metadata), "/v1/batches", "post")
    assert batch["metadata"] == metadata


def test_the_list_pages_newest_first_and_an_unknown_after_is_a_404(client):
    file = upload(client, LINES)
    made = [create(client, file["id"]).get_json()["id"] for _ in range(5)]
    first = conforms(client.get("/v1/batches?limit=2"), "/v1/batches", "get")
    everything = conforms(client.get("/v1/batches"), "/v1/batches", "get")
    ids = [batch["id"] for batch in everything["data"]]
    assert sorted(ids) == sorted(made) and everything["has_more"] is False
    keys = [(batch["created_at"], batch["id"]) for batch in everything["data"]]
    assert keys == sorted(keys, reverse=True)
    assert [batch["id"] for batch in first["data"]] == ids[:2] and first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == (ids[0], ids[1])
    rest = conforms(client.get(f"/v1/batches?limit=3&after={first['last_id']}"), "/v1/batches", "get")
    assert [batch["id"] for batch in rest["data"]] == ids[2:] and rest["has_more"] is False
    empty = conforms(client.get(f"/v1/batches?after={ids[-1]}"), "/v1/batches", "get")
    assert empty == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    for query, status in (("after=batch_nope", 404), ("limit=101", 422), ("limit=0", 422)):
        response = client.get(f"/v1/batches?{query}")
        assert_problem(response, status)
        conforms(response, "/v1/batches", "get")


def test_cancel_answers_cancelling_and_a_finished_batch_cannot_be_cancelled(app, client):
    file = upload(client, LINES)
    batch = create(client, file["id"]).get_json()
    cancelling = conforms(client.post(f"/v1/batches/{batch['id']}/cancel"), "/v1/batches/{batch_id}/cancel", "post")
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    drain(jobs_of(app))
    cancelled = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert cancelled["status"] == "cancelled" and cancelled["request_counts"] == {"total": 3, "completed": 0,
                                                                                  "failed": 3}
    done = create(client, file["id"]).get_json()
    drain(jobs_of(app))
    for ended in (batch, done):
        response = client.post(f"/v1/batches/{ended['id']}/cancel")
        assert_problem(response, 409)
        conforms(response, "/v1/batches/{batch_id}/cancel", "post")
    for response, path, method in [(client.get("/v1/batches/batch_nope"), "/v1/batches/{batch_id}", "get"),
                                   (client.post("/v1/batches/batch_nope/cancel"), "/v1/batches/{batch_id}/cancel",
                                    "post")]:
        assert_problem(response, 404)
        conforms(response, path, method)


def test_with_api_keys_a_key_sees_only_its_own_files_and_batches(make_app):
    app = make_app(access=Access(api_keys=("a", "b")))
    client = app.test_client()
    a, b = {"Authorization": "Bearer a"}, {"Authorization": "Bearer b"}
    file = upload(client, LINES, **a)
    batch = conforms(create(client, file["id"], a), "/v1/batches", "post")
    assert_problem(create(client, file["id"], b), 422, "/input_file_id")  # b may not batch a's file
    for call in (lambda h: client.get(f"/v1/files/{file['id']}", headers=h),
                 lambda h: client.get(f"/v1/files/{file['id']}/content", headers=h),
                 lambda h: client.get(f"/v1/batches/{batch['id']}", headers=h),
                 lambda h: client.post(f"/v1/batches/{batch['id']}/cancel", headers=h),
                 lambda h: client.delete(f"/v1/files/{file['id']}", headers=h)):
        assert_problem(call(b), 404)
    assert client.get("/v1/files", headers=b).get_json()["data"] == []
    assert client.get("/v1/batches", headers=b).get_json()["data"] == []
    assert [f["id"] for f in client.get("/v1/files", headers=a).get_json()["data"]] == [file["id"]]
    assert [x["id"] for x in client.get("/v1/batches", headers=a).get_json()["data"]] == [batch["id"]]
    drain(jobs_of(app))
    done = client.get(f"/v1/batches/{batch['id']}", headers=a).get_json()
    assert done["status"] == "completed"
    assert_problem(client.get(f"/v1/files/{done['output_file_id']}/content", headers=b), 404)  # a's output too
    assert client.get(f"/v1/files/{done['output_file_id']}/content", headers=a).status_code == 200
    assert_problem(client.get("/v1/files"), 401)




def test_an_output_of_many_chunks_reads_as_one_file_in_ranges_and_revalidates(make_app, tmp_path):
    app = make_app(jobs=JobSettings(data_dir=tmp_path / "data", chunk_items=1))  # three chunks: three parts
    client = app.test_client()
    batch_id = create(client, upload(client, LINES)["id"]).get_json()["id"]
    drain(jobs_of(app))
    url = f"/v1/files/{client.get(f'/v1/batches/{batch_id}').get_json()['output_file_id']}/content"
    whole = client.get(url)
    lines = whole.get_data().splitlines()
    assert sorted(orjson.loads(line)["custom_id"] for line in lines) == ["r0", "r1", "r2"]
    assert whole.content_length == len(whole.get_data()) and whole.headers["Accept-Ranges"] == "bytes"
    start, end = len(lines[0]) - 5, len(lines[0]) + 5  # across the first part's end
    ranged = client.get(url, headers={"Range": f"bytes={start}-{end}"})
    assert ranged.status_code == 206 and ranged.get_data() == whole.get_data()[start:end + 1]
    assert ranged.headers["Content-Range"] == f"bytes {start}-{end}/{whole.content_length}"
    assert client.get(url, headers={"Range": "bytes=-7"}).get_data() == whole.get_data()[-7:]
    assert client.get(url, headers={"If-None-Match": whole.headers["ETag"]}).status_code == 304
    assert client.get(url, headers={"Range": f"bytes={whole.content_length}-"}).status_code == 416
