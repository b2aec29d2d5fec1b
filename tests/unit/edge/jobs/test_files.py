"""/v1/files: uploads (the openai client's multipart form, a raw NDJSON body) streamed to disk and refused past
max_file_bytes before anything is kept; lists, records, content and deletion, each answer as openapi.yaml says."""

from __future__ import annotations

import io
import time

import pytest

from service.settings import Limits
from tests.conftest import assert_problem
from tests.unit.edge.jobs.conftest import conforms, jobs_of, stored, upload
from tests.unit.jobs.conftest import drain, request_line

CONTENT = b"".join(request_line(f"r{i}", {"tokens": ["the", "cat"], "d_model": 4, "n_heads": 2}) + b"\n"
                   for i in range(3)) + "caf\u00e9 \r\n".encode()  # bytes kept as sent, not as text


def test_a_multipart_upload_is_the_file_object_and_its_bytes_exactly(client, tmp_path):
    before = int(time.time())
    file = upload(client, CONTENT, "x.jsonl")
    assert file["id"].startswith("file-") and len(file["id"]) == 29
    assert file == {"id": file["id"], "object": "file", "bytes": len(CONTENT), "created_at": file["created_at"],
                    "expires_at": file["created_at"] + 30 * 24 * 3600, "filename": "x.jsonl", "purpose": "batch",
                    "status": "processed"}
    assert before <= file["created_at"] <= time.time()
    assert (tmp_path / "data" / "files" / file["id"]).read_bytes() == CONTENT
    assert stored(tmp_path) == [file["id"]]  # no temporary part left
    assert conforms(client.get(f"/v1/files/{file['id']}"), "/v1/files/{file_id}", "get") == file


def test_a_raw_ndjson_upload_with_purpose_in_the_query(client, tmp_path):
    response = client.post("/v1/files?purpose=batch", data=CONTENT, content_type="application/x-ndjson")
    file = conforms(response, "/v1/files", "post")
    assert (file["bytes"], file["filename"], file["purpose"]) == (len(CONTENT), "input.jsonl", "batch")
    named = conforms(client.post("/v1/files?purpose=batch&filename=mine.jsonl", data=b"{}\n",
                                 content_type="application/x-ndjson"), "/v1/files", "post")
    assert (named["bytes"], named["filename"]) == (3, "mine.jsonl")
    assert (tmp_path / "data" / "files" / file["id"]).read_bytes() == CONTENT


def test_a_chunked_upload_without_a_length_is_stored_whole(client, tmp_path):
    response = client.post("/v1/files?purpose=batch", input_stream=io.BytesIO(CONTENT),
                           content_type="application/x-ndjson", environ_overrides={"wsgi.input_terminated": True})
    file = conforms(response, "/v1/files", "post")
    assert file["bytes"] == len(CONTENT)
    assert (tmp_path / "data" / "files" / file["id"]).read_bytes() == CONTENT


@pytest.mark.parametrize(("send", "where"), [
    ({"data": {"file": (io.BytesIO(CONTENT), "x.jsonl")}}, "/purpose"),
    ({"data": {"file": (io.BytesIO(CONTENT), "x.jsonl"), "purpose": "fine-tune"}}, "/purpose"),
    ({"data": {"purpose": "batch"}}, "/file"),
    ({"data": {"purpose": "batch", "other": (io.BytesIO(CONTENT), "x.jsonl")}}, "/file"),
])
def test_a_form_without_its_file_or_its_purpose_batch(client, tmp_path, send, where):
    response = client.post("/v1/files", content_type="multipart/form-data", **send)
    assert_problem(response, 422, where)
    conforms(response, "/v1/files", "post")
    assert stored(tmp_path) == []  # the body saved meanwhile is dropped


@pytest.mark.parametrize("query", ["", "?purpose=fine-tune", "?purpose="])
def test_a_raw_upload_needs_purpose_batch_in_the_query(client, tmp_path, query):
    response = client.post("/v1/files" + query, data=CONTENT, content_type="application/x-ndjson")
    assert_problem(response, 422, "purpose")
    conforms(response, "/v1/files", "post")
    assert stored(tmp_path) == []


@pytest.mark.parametrize("content_type", ["text/plain", "application/json", None])
def test_another_content_type_is_refused_naming_the_header(client, tmp_path, content_type):
    response = client.post("/v1/files?purpose=batch", data=CONTENT, content_type=content_type)
    body = assert_problem(response, 422)
    assert body["errors"] == [{"header": "Content-Type", "detail": "multipart/form-data or application/x-ndjson"}]
    conforms(response, "/v1/files", "post")
    assert stored(tmp_path) == []


@pytest.mark.parametrize("end", [b"", b"\r\n", b"\r\n--cut", b"\r\n--cut\r\n"])
def test_a_form_cut_before_its_closing_boundary_is_a_400_and_keeps_nothing(client, tmp_path, end):
    body = (b'--cut\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--cut\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n" + CONTENT + end)
    response = client.post("/v1/files", data=body, content_type="multipart/form-data; boundary=cut")
    assert_problem(response, 400)
    conforms(response, "/v1/files", "post")
    assert stored(tmp_path) == []


def test_a_form_part_without_its_content_disposition_is_a_400(client, tmp_path):
    body = b"--cut\r\nContent-Type: text/plain\r\n\r\nbatch\r\n--cut--\r\n"
    assert_problem(client.post("/v1/files", data=body, content_type="multipart/form-data; boundary=cut"), 400)
    assert stored(tmp_path) == []


def test_a_form_with_its_closing_boundary_is_stored(client, tmp_path):
    body = (b'--cut\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n' + CONTENT
            + b'\r\n--cut\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--cut--\r\n')
    response = client.post("/v1/files", data=body, content_type="multipart/form-data; boundary=cut")
    file = conforms(response, "/v1/files", "post")  # the purpose may come after the file
    assert (tmp_path / "data" / "files" / file["id"]).read_bytes() == CONTENT


class Counted(io.BytesIO):
    """A request body that counts the bytes read from it."""

    taken = 0

    def read(self, size: int | None = -1) -> bytes:
        block = super().read(size)
        self.taken += len(block)
        return block

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        self.taken += len(line)
        return line


@pytest.mark.parametrize("content_type", ["application/x-ndjson", "multipart/form-data; boundary=b"])
def test_a_content_length_over_max_file_bytes_is_a_413_before_a_byte_is_read(make_app, tmp_path, content_type):
    client = make_app(limits=Limits(max_file_bytes=1000)).test_client()
    body = Counted(b"x" * 70_000)  # past the limit, and past a form's allowance for its boundaries too
    response = client.post("/v1/files?purpose=batch", input_stream=body, content_type=content_type,
                           headers={"Content-Length": "70000"})
    problem = assert_problem(response, 413)
    assert problem["limit"] == {"name": "max_file_bytes", "maximum": 1000, "value": 70000}
    conforms(response, "/v1/files", "post")
    assert body.taken == 0
    assert stored(tmp_path) == []


def test_a_raw_upload_at_max_file_bytes_is_kept_and_one_more_byte_is_not(make_app, tmp_path):
    client = make_app(limits=Limits(max_file_bytes=1000)).test_client()
    file = conforms(client.post("/v1/files?purpose=batch", data=b"x" * 1000, content_type="application/x-ndjson"),
                    "/v1/files", "post")
    assert file["bytes"] == 1000
    assert_problem(client.post("/v1/files?purpose=batch", data=b"x" * 1001, content_type="application/x-ndjson"),
                   413)
    assert stored(tmp_path) == [file["id"]]


@pytest.mark.parametrize("form", [False, True])
def test_a_chunked_body_over_the_limit_is_a_413_and_nothing_is_kept(make_app, tmp_path, form):
    client = make_app(limits=Limits(max_file_bytes=100_000)).test_client()
    lines = b"".join(request_line(f"r{i}", {"tokens": ["the"]}) + b"\n" for i in range(5000))  # ~470 kB
    if form:
        body = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n' + lines
                + b'\r\n--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b--\r\n')
        content_type = "multipart/form-data; boundary=b"
    else:
        body, content_type = lines, "application/x-ndjson"
    response = client.post("/v1/files?purpose=batch", input_stream=io.BytesIO(body), content_type=content_type,
                           environ_overrides={"wsgi.input_terminated": True})
    assert_problem(response, 413)
    conforms(response, "/v1/files", "post")
    assert stored(tmp_path) == []


def finished_batch(client, app) -> dict:
    """A batch run to its end: its input file (purpose batch) and its output file (batch_output)."""
    file = upload(client, CONTENT.rsplit(b"\n", 2)[0] + b"\n")
    batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/multi-head-attention",
                                             "completion_window": "24h"}).get_json()
    drain(jobs_of(app))
    return client.get(f"/v1/batches/{batch['id']}").get_json()


def test_the_list_pages_newest_first_by_after_and_filters_by_purpose(app, client):
    uploaded = [upload(client, b"{}\n", f"f{i}.jsonl") for i in range(5)]
    batch = finished_batch(client, app)
    everything = conforms(client.get("/v1/files"), "/v1/files", "get")
    ids = [file["id"] for file in everything["data"]]
    assert len(ids) == 7 and everything["has_more"] is False
    assert (everything["first_id"], everything["last_id"]) == (ids[0], ids[-1])
    keys = [(file["created_at"], file["id"]) for file in everything["data"]]
    assert keys == sorted(keys, reverse=True)  # newest first, ties by id
    paged, after = [], None
    while True:
        page = conforms(client.get("/v1/files", query_string={"limit": 3, **({"after": after} if after else {})}),
                        "/v1/files", "get")
        paged += [file["id"] for file in page["data"]]
        assert (page["first_id"], page["last_id"]) == (page["data"][0]["id"], page["data"][-1]["id"])
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert paged == ids and len(page["data"]) == 1
    inputs = conforms(client.get("/v1/files?purpose=batch"), "/v1/files", "get")["data"]
    assert {file["id"] for file in inputs} == {file["id"] for file in uploaded} | {batch["input_file_id"]}
    outputs = conforms(client.get("/v1/files?purpose=batch_output"), "/v1/files", "get")["data"]
    assert [file["id"] for file in outputs] == [batch["output_file_id"]]
    assert outputs[0]["filename"] == f"{batch['id']}_output.jsonl"


@pytest.mark.parametrize(("query", "status", "where"), [
    ({"after": "file-nope"}, 404, None), ({"limit": 0}, 422, "limit"), ({"limit": "x"}, 422, "limit"),
    ({"purpose": "fine-tune"}, 422, "purpose")])
def test_a_list_asked_wrong(client, query, status, where):
    upload(client, b"{}\n")
    response = client.get("/v1/files", query_string=query)
    assert_problem(response, status, *([where] if where else []))
    conforms(response, "/v1/files", "get")


@pytest.mark.parametrize("accept", ["application/binary", "*/*", "image/png", "application/json", "text/html", None])
def test_the_content_is_the_bytes_whatever_the_accept(client, accept):
    file = upload(client, CONTENT)
    response = client.get(f"/v1/files/{file['id']}/content", headers={"Accept": accept} if accept else {})
    assert response.status_code == 200 and response.get_data() == CONTENT
    assert response.mimetype == "application/x-ndjson"


def test_delete_then_everything_about_the_file_is_a_404(client, tmp_path):
    file = upload(client, CONTENT)
    deleted = client.delete(f"/v1/files/{file['id']}")
    assert conforms(deleted, "/v1/files/{file_id}", "delete") == {"id": file["id"], "object": "file",
                                                                  "deleted": True}
    assert stored(tmp_path) == []
    for response, path, method in [
            (client.get(f"/v1/files/{file['id']}"), "/v1/files/{file_id}", "get"),
            (client.get(f"/v1/files/{file['id']}/content"), "/v1/files/{file_id}/content", "get"),
            (client.delete(f"/v1/files/{file['id']}"), "/v1/files/{file_id}", "delete")]:
        assert_problem(response, 404)
        conforms(response, path, method)
    assert conforms(client.get("/v1/files"), "/v1/files", "get")["data"] == []


def test_a_file_an_unfinished_batch_reads_cannot_be_deleted(app, client, tmp_path):
    file = upload(client, CONTENT.rsplit(b"\n", 2)[0] + b"\n")
    batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/multi-head-attention",
                                             "completion_window": "24h"}).get_json()
    refused = client.delete(f"/v1/files/{file['id']}")
    assert batch["id"] in assert_problem(refused, 409)["detail"]
    conforms(refused, "/v1/files/{file_id}", "delete")
    assert file["id"] in stored(tmp_path)
    drain(jobs_of(app))
    assert client.get(f"/v1/batches/{batch['id']}").get_json()["status"] == "completed"
    assert client.delete(f"/v1/files/{file['id']}").status_code == 200


def test_a_body_deleted_under_its_record_is_a_404(client, tmp_path):
    file = upload(client, CONTENT)
    (name,) = stored(tmp_path)  # another replica's DELETE, between this one reading the record and the body
    (tmp_path / "data" / "files" / name).unlink()
    response = client.get(f"/v1/files/{file['id']}/content")
    assert_problem(response, 404)
    assert "was just deleted" in response.json["detail"]
    conforms(response, "/v1/files/{file_id}/content", "get")
