"""Hostile input against the real gunicorn server: each gets a fast 4xx, memory stays bounded, the server stays ready.

Bounded: every request has a timeout, bodies are at most ~17 MB, slow clients trickle for ~3 s.
Worker RSS (VmRSS from /proc) is measured before and after the whole suite.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
from http import HTTPStatus

import pytest
import requests

from service.settings import Limits
from tests.harness import Gunicorn, Nginx

LIMIT = Limits().max_body_bytes
FAST = 3.0  # seconds: a refusal slower than this is not "fast" (they take milliseconds; CI is noisy)
RSS_BOUND_KIB = 400 * 1024  # per worker, after the whole suite (~60-90 MiB after start-up)
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server():
    with Gunicorn({"LOG_REQUESTS": "0"}, compose=True) as instance:
        baseline = instance.rss_kib()
        yield instance
        after = instance.rss_kib()
        assert set(after) == set(baseline), "a worker died (or was recycled) during the hostile suite"
        assert max(after.values()) < RSS_BOUND_KIB, (baseline, after)
        print(f"\nworker RSS KiB before {baseline} after {after}")


def post(server, path: str, data: bytes | object, headers: dict | None = None) -> requests.Response:
    started = time.monotonic()
    response = requests.post(f"{server.url}{path}", data=data, headers=JSON if headers is None else headers, timeout=30)
    assert time.monotonic() - started < FAST, f"slow refusal: {time.monotonic() - started:.1f} s"
    return response


def assert_refused(response: requests.Response, *statuses: int) -> dict:
    assert response.status_code in statuses, response.text[:500]
    assert response.headers["Content-Type"] == "application/problem+json"
    return response.json()


@pytest.fixture(autouse=True)
def still_ready(server):
    yield
    assert requests.get(f"{server.url}/readyz", timeout=10).json() == {"status": "ready"}


def mha_body(embeddings: str) -> bytes:
    return b'{"n_heads": 2, "embeddings": ' + embeddings.encode() + b"}"


def test_body_exactly_at_the_limit_is_read_and_judged(server):
    head = b'{"n_heads": 2, "embeddings": [[1.0, 2.0]], "pad": "'
    body = head + b"x" * (LIMIT - len(head) - 2) + b'"}'
    assert len(body) == LIMIT
    assert_refused(post(server, "/v1/multi-head-attention", body), 422)  # read; "pad" is an unknown field


@pytest.mark.parametrize("extra", [1, 1024 * 1024])
def test_body_past_the_limit_with_content_length_is_413(server, extra):
    assert_refused(post(server, "/v1/attention", b" " * (LIMIT + extra)), 413)


def test_body_past_the_limit_chunked_is_413(server):
    def chunks():
        yield b'{"query": ['
        for _ in range(LIMIT // (64 * 1024) + 2):
            yield b"[1.0]," * (64 * 1024 // 6)
        yield b"[1.0]]}"

    assert_refused(post(server, "/v1/attention", chunks()), 413)


@pytest.mark.parametrize("depth", [33, 1000, 5000, 100_000])
def test_json_nested_thousands_deep_is_422(server, depth):
    body = assert_refused(post(server, "/v1/attention", b"[" * depth + b"]" * depth), 422)
    assert body["limit"]["name"] == "max_json_depth"


@pytest.mark.parametrize("path", ["/v1/attention", "/v2/models/scaled_dot_product_attention/infer"])
def test_an_unterminated_string_of_escaped_quotes_is_refused_fast(server, path):
    """Megabytes of \\" in a string that never ends, behind more brackets than the depth limit: the
    depth scan stays linear (a regex over strings took 20 s for 80 KB of this), then 400 or 422."""
    body = b"[" * 40 + b'"' + b'\\"' * 4_000_000
    response = post(server, path, body)
    assert response.status_code in (400, 422), response.text[:300]


def test_a_million_numbers_with_one_nan_at_the_end_is_400(server):
    numbers = "[" + "0.5," * (10**6 - 1) + "NaN]"
    assert_refused(post(server, "/v1/multi-head-attention", mha_body(f"[{numbers}]")), 400)


def test_a_million_numbers_with_one_overflow_at_the_end_is_400(server):
    numbers = "[" + "0.5," * (10**6 - 1) + "1e999]"
    assert_refused(post(server, "/v1/multi-head-attention", mha_body(f"[{numbers}]")), 400)


def test_a_million_finite_numbers_past_the_sequence_limit_is_422(server):
    rows = ",".join(["[0.5, 0.25]"] * 500_000)
    body = assert_refused(post(server, "/v1/multi-head-attention", mha_body(f"[{rows}]")), 422)
    assert body["limit"]["name"] == "max_sequence_length"


def rows_of_ones(rows: int) -> bytes:
    """Embeddings (rows, 1, 500) of ones: 1 KB a row."""
    return ("[" + ",".join(["[[" + ",".join(["1"] * 500) + "]]"] * rows) + "]").encode()


@pytest.mark.parametrize(("path", "rows", "options"), [
    ("/v1/encoder", 800, b'"n_heads": 1, "n_layers": 6, "d_ff": 1, "trace": true'),  # was 327 MB of JSON, +420 MB RSS
    ("/v1/multi-head-attention", 5000, b'"n_heads": 1'),  # was 47 MB
])
def test_a_small_body_asking_for_a_huge_answer_is_422(server, path, rows, options):
    """Each number of the input is written as ~20 bytes in the answer, and a trace returns several arrays of
    the input's size per layer: the answer is bounded by max_output_elements, not by the body."""
    body = b'{"embeddings": ' + rows_of_ones(rows) + b", " + options + b"}"
    assert assert_refused(post(server, path, body), 422)["limit"]["name"] == "max_output_elements"


V2_INFER = "/v2/models/scaled_dot_product_attention/infer"
ONE_INPUT = b'{"name": "query", "shape": [1, 1], "datatype": "FP64", "data": [1.0]}'


@pytest.mark.parametrize(("path", "body", "status"), [
    (V2_INFER, b'{"inputs": [{}' + b", {}" * 999_999 + b"]}", 400),  # a million inputs
    (V2_INFER, b'{"inputs": [' + ONE_INPUT + b'], "outputs": [1' + b", 1" * 999_999 + b"]}", 400),
    (V2_INFER, b'{"inputs": [{"name": "query", "datatype": "FP64", "shape": [-1' + b", -1" * 999_999 + b"]}]}", 400),
    (V2_INFER, b'{"inputs": [' + ONE_INPUT + b'], "parameters": {' + b", ".join(b'"p%d": 0' % i for i in range(10**6))
     + b"}}", 400),
    ("/v1/heatmap", b'{"weights": [[0.5]], "row_labels": [1' + b", 1" * 3_999_999 + b"]}", 422),
    ("/v1/heatmap", b'{"weights": [[0.5]], "col_labels": ["' + b'x", "x' * 2_500_000 + b'"]}', 422),
    ("/v1/attention", b'{"query": [[1.0]], ' + b", ".join(b'"k%d": 0' % i for i in range(1_000_000)) + b"}", 422),
])
def test_a_million_items_or_keys_are_refused_fast_with_a_short_answer(server, path, body, status):
    """A list or an object of a million bad or stray entries: judged by its length, or named up to a few,
    not one error per entry (this took 4-30 s per few MB, past the worker timeout, with answers of 30-65 MB)."""
    response = post(server, path, body)
    assert response.status_code == status, response.text[:300]
    assert len(response.content) < 8192, len(response.content)


@pytest.mark.parametrize(("leaves", "pointer"), [
    (b"0," * 8_000_000 + b'"x"', "/query/0/8000000"),  # the bad leaf last: every number is looked at
    (b"{}," + b"0," * 8_000_000 + b"0", "/query/0/0"),  # first: nothing past it is
])
def test_sixteen_megabytes_of_numbers_with_one_bad_leaf_is_named_fast(server, leaves, pointer):
    request = b'{"key": [[1]], "value": [[1]], "query": [[' + leaves + b"]]}"
    body = assert_refused(post(server, "/v1/attention", request), 422)
    assert [error["pointer"] for error in body["errors"]] == [pointer]


@pytest.mark.parametrize(("path", "payload", "limit"), [
    ("/v1/multi-head-attention", {"tokens": ["the", "cat"], "d_model": 8, "n_heads": 10**9}, "max_heads"),
    ("/v1/encoder", {"tokens": ["the", "cat"], "d_model": 8, "n_heads": 2, "n_layers": 10**9}, "max_layers"),
    ("/v1/encoder", {"tokens": ["the"], "d_model": 8, "n_heads": 2, "d_ff": 10**12}, "max_d_ff"),
    ("/v1/embed", {"tokens": ["the"], "d_model": 10**9}, "max_d_model"),
])
def test_enormous_sizes_are_refused_before_compute(server, path, payload, limit):
    response = requests.post(f"{server.url}{path}", json=payload, timeout=10)
    assert assert_refused(response, 422)["limit"]["name"] == limit


@pytest.mark.parametrize("query", ["size=1000000000000", "size=143896758767122432000", "size=-1", "size=1e3",
                                   "size=1&size=2", "size=%00", "size=" + "9" * 4000, "size=" + "9" * 5000,
                                   "size=1_000", "size=+3", "size=%203", "size=%EF%BC%93"])  # last: full-width 3
def test_enormous_or_odd_query_values_are_422(server, query):
    response = requests.get(f"{server.url}/v1/causal-mask?{query}", timeout=10)
    assert_refused(response, 422)


@pytest.mark.parametrize("number", [b"123456789012345678901234567890", b"1e300", b"-1e300", b"18446744073709551616"])
def test_huge_integers_and_numbers_are_refused(server, number):
    assert_refused(post(server, "/v1/multi-head-attention", b'{"tokens": ["the"], "d_model": 8, "n_heads": '
                        + number + b"}"), 422)
    assert_refused(post(server, "/v1/self-attention", b'{"tokens": ["the"], "seed": ' + number + b"}"), 422)


def test_a_content_length_past_64_bits_gets_the_apps_own_answer():
    """It was a 500 on every route: the log line's request size did not fit orjson's integers (the suite's
    server writes no log lines, hence a server of its own)."""
    with Gunicorn(compose=True) as logging_server:
        for method, path, status in (("GET", "/healthz", 200), ("POST", "/v1/embed", 413)):
            response = requests.request(method, f"{logging_server.url}{path}", timeout=10,
                                        headers={**JSON, "Content-Length": str(2**64)})
            assert response.status_code == status, response.text[:300]


@pytest.mark.parametrize("token", ["caf\u00e9", "\u0000", "\u202e", "\ud83d\ude00" * 50, "a\tb", "\u00ff" * 1000])
def test_unicode_and_control_characters_in_tokens_are_named_unknown(server, token):
    response = requests.post(f"{server.url}/v1/embed", json={"tokens": ["the", token]}, timeout=10)
    body = assert_refused(response, 422)
    assert body["errors"][0]["pointer"] == "/tokens/1"


def test_raw_control_characters_in_a_json_string_are_400(server):
    assert_refused(post(server, "/v1/embed", b'{"tokens": ["a\x01b"]}'), 400)


def test_invalid_utf8_is_400(server):
    assert_refused(post(server, "/v1/embed", b'{"tokens": ["\xff\xfe"]}'), 400)


@pytest.mark.parametrize(("path", "status"), [("/v1/attention", 415), ("/v2/models/scaled_dot_product_attention/infer",
                                                                     400)])
def test_a_compressed_body_is_refused_by_name(server, path, status):
    response = post(server, path, gzip.compress(b'{"query": [[1.0]]}'),
                    {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert response.status_code == status and "Content-Encoding gzip is not supported" in response.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/xml", "", "application/jsonx", "image/png"])
def test_wrong_content_types_are_415(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    assert_refused(post(server, "/v1/attention", b'{"query": [[1.0]]}', headers), 415)


def test_a_slow_client_is_answered_once_its_body_arrives(server):
    """A sync worker waits for a slow body (this is why nginx sits in front: see the next test)."""
    body = b'{"query": [[1.0]], "key": [[1.0]], "value": [[2.0]]}'
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        for i in range(0, len(body), 10):
            sock.sendall(body[i:i + 10])
            time.sleep(0.05)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def raw_exchange(server, request: bytes) -> tuple[bytes, bytes]:
    """Send ``request`` as it is, stop sending, and read the whole answer: (head, body)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return head, payload


@pytest.mark.parametrize("path", ["/v1/attention", "/v2/models/scaled_dot_product_attention/infer"])
def test_a_body_shorter_than_its_content_length_is_400(server, path):
    """The client promises 1000 bytes, sends 50 and stops sending: a 400 naming both sizes, not a hang."""
    body = b'{"query": [[1.0]], "key": [[1.0]], "value": [[2.0]]'
    head, payload = raw_exchange(server, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                         "Content-Length: 1000\r\n\r\n".encode() + body)
    assert head.startswith(b"HTTP/1.1 400"), head + payload[:300]
    assert f"after {len(body)} of its 1000 bytes".encode() in payload, payload


@pytest.mark.parametrize("path", ["/v1/attention", "/v1/batch", "/v2/models/scaled_dot_product_attention/infer"])
@pytest.mark.parametrize("framing", [
    b"ZZ\r\n{}\r\n0\r\n\r\n",  # a chunk size that is not hexadecimal
    b"-1\r\n{}\r\n0\r\n\r\n",  # a negative chunk size
    b"2\r\n{}XX0\r\n\r\n",  # chunk data without its CRLF
    b"10\r\n{}",  # a chunk cut off, then the client stops sending
])
def test_a_badly_framed_chunked_body_is_400(server, path, framing):
    """gunicorn finds bad chunk framing only while the app reads the body: a 400 saying so, never a 500."""
    head, payload = raw_exchange(server, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                         "Transfer-Encoding: chunked\r\n\r\n".encode() + framing)
    assert head.startswith(b"HTTP/1.1 400"), head + payload[:300]
    assert b"The body could not be read" in payload and b"X-Request-Id" in head, payload[:300]


@pytest.mark.parametrize(("request_", "status"), [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    (b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
    (b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", 400),
    (b"G(T /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
    (b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: bogus\r\n\r\n", 501),
])
def test_what_gunicorns_parser_refuses_is_a_problem_with_a_request_id(server, request_, status):
    """Answered before the app sees the request: the same problem+json and X-Request-Id as every other error."""
    head, payload = raw_exchange(server, request_)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert lines[0].startswith(f"HTTP/1.1 {status} "), head
    assert headers["Content-Type"] == "application/problem+json"
    problem = json.loads(payload)
    assert problem["status"] == status and problem["request_id"] == headers["X-Request-Id"] != ""
    assert problem["title"] == HTTPStatus(status).phrase and lines[0] == f"HTTP/1.1 {status} {problem['title']}"


@pytest.mark.needs_nginx
def test_slow_clients_through_nginx_never_hold_a_worker(server):
    """More slowloris connections than workers, trickling for ~3 s: nginx buffers them, and normal
    requests through the same nginx are answered meanwhile."""
    with Nginx([f"127.0.0.1:{server.port}"]) as nginx:
        slow = []
        for _ in range(8):  # 4x the workers
            sock = socket.create_connection(("127.0.0.1", nginx.port), timeout=10)
            sock.sendall(b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n{")
            slow.append(sock)
        try:
            latencies = []
            for _ in range(6):
                for sock in slow:
                    sock.sendall(b" ")
                started = time.monotonic()
                response = requests.get(f"{nginx.url}/v1/limits", timeout=5)
                latencies.append(time.monotonic() - started)
                assert response.status_code == 200
                time.sleep(0.5)
            assert max(latencies) < 1.0, latencies
        finally:
            for sock in slow:
                sock.close()
