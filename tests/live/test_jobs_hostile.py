"""Hostile files for the batch jobs, against a real gunicorn (one web worker, so its memory is the upload's) and a
real job worker, on SQLite: what is not NDJSON, too many lines, repeated ids, uploads past max_file_bytes (with a
Content-Length and chunked, a form left open), a line of 10 MB, JSON nested deep in a line. Each is refused by
name, memory stays bounded, nothing is left on disk, and the server answers normally after each."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import requests

from service.settings import Limits
from tests.harness import Gunicorn
from tests.live.jobs import (
    DEMO5,
    MHA,
    Worker,
    assert_answers,
    create,
    ended,
    expected,
    memory_kib,
    queue_env,
    request_line,
    results,
    seeded,
    upload,
    wait_batch,
)

LIMITS = Limits()
BLOCK = b"\n" * (1 << 20)  # an upload's block: 1 MiB (of empty lines, which a file may hold)
UPLOAD_BLOCKS = 300  # 300 MiB: past max_file_bytes (200 MiB)
GROWTH_KIB = 64 * 1024  # what a process may grow by while refusing 300 MiB, or reading a 10 MB line


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    with Worker(queue_env(tmp_path_factory.mktemp("jobs-hostile"))) as running:
        yield running.ready()


@pytest.fixture(scope="module")
def data_dir(worker: Worker) -> Path:
    return Path(worker.env["ATTENTION_DATA_DIR"])


@pytest.fixture(scope="module")
def api(worker: Worker) -> Iterator[Gunicorn]:
    """The API, one web worker: every upload is that worker's to read."""
    with Gunicorn(worker.env, workers=1) as instance:
        yield instance


@pytest.fixture(scope="module")
def server(api: Gunicorn) -> str:
    return api.url


@pytest.fixture(autouse=True)
def still_serving(server: str) -> Iterator[None]:
    """After each test the server is ready and answers a normal request as it did."""
    yield
    assert requests.get(f"{server}/readyz", timeout=10).json() == {"status": "ready"}
    response = requests.post(server + MHA, json=DEMO5, timeout=30)
    assert response.status_code == 200 and len(response.json()["weights"]) == 4


def stored(data_dir: Path) -> set[str]:
    """The names under the data folder's files/, temporary ones included."""
    folder = data_dir / "files"
    return {path.name for path in folder.iterdir()} if folder.exists() else set()


def failed_with(server: str, content: bytes) -> list[dict]:
    """The errors of a batch of ``content`` (which must fail validation)."""
    found = wait_batch(server, create(server, upload(server, content)["id"])["id"], ended, 60)
    assert found["status"] == "failed" and found["failed_at"] and found["output_file_id"] is None, found
    assert found["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    return found["errors"]["data"]


def png() -> bytes:
    """A 64 x 64 PNG of noise: binary, with newlines where they fall."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes((x * 37 + y * 101) % 256 for x in range(64 * 3)) for y in range(64))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_a_png_fails_as_invalid_json_lines(server):
    errors = failed_with(server, png())
    assert errors and {error["code"] for error in errors} == {"invalid_json_line"}
    assert errors[0]["line"] == 1


def test_json_arrays_per_line_fail_as_not_objects(server):
    errors = failed_with(server, b"[1, 2, 3]\n" + orjson.dumps(["custom_id", "a"]) + b"\n")
    assert [(error["code"], error["line"]) for error in errors] == [("invalid_json_line", 1), ("invalid_json_line", 2)]
    assert "not a JSON object" in errors[0]["message"]


def test_one_line_past_max_job_requests_fails_at_that_line(server):
    line = b'{"custom_id":"%d","method":"POST","url":"/v1/multi-head-attention","body":{}}\n'
    content = b"".join(line % i for i in range(LIMITS.max_job_requests + 1))
    errors = failed_with(server, content)
    assert [(error["code"], error["line"]) for error in errors] == [("too_many_requests", 50_001)]
    assert "max_job_requests=50000" in errors[0]["message"]


def test_repeated_custom_ids_fail_naming_each_repeat(server):
    content = request_line("a", DEMO5) + request_line("b", DEMO5) + request_line("a", DEMO5) + request_line("b", {})
    errors = failed_with(server, content)
    assert [(error["code"], error["line"], error["param"]) for error in errors] == [
        ("duplicate_custom_id", 3, "custom_id"), ("duplicate_custom_id", 4, "custom_id")]
    assert "line 1" in errors[0]["message"]


class Sized:
    """``count`` blocks, iterated as they are sent, with a length: requests sends a Content-Length, not chunks."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count * len(BLOCK)

    def __iter__(self) -> Iterator[bytes]:
        return (BLOCK for _ in range(self.count))


def form_of(blocks: Iterator[bytes], boundary: str = "hostile") -> Iterator[bytes]:
    """A multipart/form-data body with ``blocks`` as its file, and its closing boundary."""
    yield (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--{boundary}\r\n'
           'Content-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
           "Content-Type: application/octet-stream\r\n\r\n").encode()
    yield from blocks
    yield f"\r\n--{boundary}--\r\n".encode()


@pytest.mark.parametrize("how", ["content-length", "chunked", "form, chunked"])
def test_a_300_mb_upload_is_413_in_bounded_memory_and_leaves_nothing(api, data_dir, how):
    [pid] = api.workers()
    before, peak = stored(data_dir), memory_kib(pid, "VmHWM")
    if how == "content-length":
        body, content_type = Sized(UPLOAD_BLOCKS), "application/x-ndjson"
    elif how == "chunked":
        body, content_type = (BLOCK for _ in range(UPLOAD_BLOCKS)), "application/x-ndjson"
    else:
        body = form_of(BLOCK for _ in range(UPLOAD_BLOCKS))
        content_type = "multipart/form-data; boundary=hostile"
    response = requests.post(f"{api.url}/v1/files?purpose=batch", data=body, timeout=120,
                             headers={"Content-Type": content_type})
    assert response.status_code == 413, response.text
    grown = memory_kib(pid, "VmHWM") - peak
    print(f"\n300 MiB upload ({how}): the web worker's peak RSS grew {grown} KiB")
    assert grown < GROWTH_KIB and api.workers() == [pid]
    problem = response.json()
    assert problem["limit"]["name"] == "max_file_bytes" and problem["limit"]["maximum"] == LIMITS.max_file_bytes
    assert stored(data_dir) == before  # no file, no temporary part


@pytest.mark.parametrize(("cut", "detail"), [
    (lambda body: body[:body.rindex(b"\r\n--hostile--")], "ended before its closing boundary"),
    (lambda body: b"--hostile\r\nX-Part: nameless\r\n\r\nbatch\r\n--hostile--\r\n", "Content-Disposition")])
def test_a_broken_form_is_400_and_leaves_nothing(server, data_dir, cut, detail):
    before = stored(data_dir)
    body = b"".join(form_of(iter([request_line("a", DEMO5)])))
    response = requests.post(f"{server}/v1/files", data=cut(body), timeout=30,
                             headers={"Content-Type": "multipart/form-data; boundary=hostile"})
    assert response.status_code == 400 and response.headers["Content-Type"] == "application/problem+json"
    assert detail in response.json()["detail"]
    assert stored(data_dir) == before


def test_a_10_mb_line_fails_the_batch_and_the_worker_stays_small(server, worker):
    peak = worker.memory_kib("VmHWM")
    content = request_line("a", DEMO5) + request_line("big", {"pad": "x" * 10_000_000}) + request_line("c", DEMO5)
    errors = failed_with(server, content)
    assert [(error["code"], error["line"]) for error in errors] == [("line_too_long", 2)]
    assert worker.memory_kib("VmHWM") - peak < GROWTH_KIB // 8  # read in 1 MiB pieces, never whole


def test_a_body_nested_100_deep_is_that_items_422(server):
    content, ids = seeded(3)
    nested = {"embeddings": orjson.loads(b"[" * 100 + b"1.0" + b"]" * 100), "n_heads": 1}
    content += request_line("deep", nested)
    found = wait_batch(server, create(server, upload(server, content)["id"])["id"], ended, 60)
    assert found["status"] == "completed", found
    output, errors = results(server, found, [*ids, "deep"])
    assert_answers(output, expected(server, ids))
    deep = errors["deep"]["response"]
    assert deep["status_code"] == 422 and "max_json_depth" in orjson.dumps(deep["body"]).decode()


def test_a_line_nested_5000_deep_is_an_invalid_json_line(server):
    content = request_line("a", DEMO5) + b'{"custom_id": "deep", "method": "POST", "url": "/v1/multi-head-attention", '
    content += b'"body": {"embeddings": ' + b"[" * 5000 + b"1.0" + b"]" * 5000 + b"}}\n"
    errors = failed_with(server, content)
    assert [(error["code"], error["line"]) for error in errors] == [("invalid_json_line", 2)]

