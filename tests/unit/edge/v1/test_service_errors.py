"""Every documented error is an RFC 9457 problem: 400, 404, 405, 413, 415, 422."""

from __future__ import annotations

import io

import pytest

from service.settings import Limits
from tests.conftest import app_with, assert_problem

CHUNKED = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
TERMINATED = {"wsgi.input_terminated": True}  # what gunicorn sets for a chunked body
GOOD = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0]], "value": [[2.0]]}


@pytest.mark.parametrize("body", [b'{"query": [[NaN]]}', b'{"query": [[Infinity]]}', b"{", b"", b"\xff\xfe",
                                  b'{"query": [[1]]} trailing'])
def test_malformed_json_is_400(client, body):
    response = client.post("/v1/attention", data=body, content_type="application/json")
    assert assert_problem(response, 400)["type"].endswith("malformed-json")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_wrong_content_type_is_415(client, content_type):
    response = client.post("/v1/attention", data=b'{"query": [[1]]}', content_type=content_type)
    assert "application/json" in assert_problem(response, 415)["detail"]


@pytest.mark.parametrize(("charset", "body"), [("utf-16", '{"tokens": ["cat"]}'), ("UTF-32LE", '{"tokens": ["cat"]}'),
                                               ("latin-1", '{"tokens": ["caf\u00e9"]}')])
def test_a_body_unreadable_as_utf8_names_the_charset_it_declares_415(client, charset, body):
    response = client.post("/v1/embed", data=body.encode(charset), content_type=f"application/json; charset={charset}")
    assert f"charset={charset.lower()}" in assert_problem(response, 415)["detail"]


@pytest.mark.parametrize(("body", "where"), [
    (b'{"tokens": ["caf\xe9"]}', "byte 0xe9 at offset 16 (line 1, column 17): invalid continuation byte"),
    (b'{\n  "tokens":\n  ["\xff"]}', "byte 0xff at offset 18 (line 3, column 5): invalid start byte"),
    (b'{"tokens": ["\xed\xa0\x80"]}', "byte 0xed at offset 13 (line 1, column 14): invalid continuation byte"),
])
def test_a_body_that_is_not_utf8_and_declares_no_charset_says_where_it_stops_being_utf8(client, body, where):
    detail = assert_problem(client.post("/v1/embed", data=body, content_type="application/json"), 400)["detail"]
    assert detail == f"The body is not valid UTF-8 (JSON is UTF-8): {where}."


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "utf8", "us-ascii", "ISO-8859-1", "utf-16"])
def test_a_body_readable_as_utf8_is_accepted_whatever_charset_it_declares(client, charset):
    """JSON is UTF-8 (RFC 8259): the parameter has no effect when the body reads, as ASCII does in them all."""
    response = client.post("/v1/attention", data=b'{"query": [[1.0]], "key": [[1.0]], "value": [[3.0]]}',
                           content_type=f"application/json; charset={charset}")
    assert response.status_code == 200


def test_json_suffix_content_type_is_accepted(client):
    response = client.post("/v1/attention", data=b'{"query": [[1.0]], "key": [[1.0]], "value": [[3.0]]}',
                           content_type="application/vnd.attention+json; charset=utf-8")
    assert response.get_json() == {"output": [[3.0]], "weights": [[1.0]]}


def test_unknown_path_is_404_and_wrong_method_is_405_with_allow(client):
    assert_problem(client.get("/v1/nothing-here"), 404)
    response = client.get("/v1/attention")
    assert_problem(response, 405)
    assert "POST" in response.headers["Allow"]


@pytest.mark.parametrize(("value", "pointer", "words"), [
    ([[1.0, True]], "/query/0/1", "number"),
    ([[1.0, "1.5"]], "/query/0/1", "number"),
    ([[1.0, None]], "/query/0/1", "number"),
    ([[1.0, {"a": 1}]], "/query/0/1", "number"),
    ([[1.0, 2.0], [3.0, "x"]], "/query/1/1", "number"),
    ([[[1.0], [2.0]], [[3.0], [None]], [["x"], [4.0]]], "/query/1/1/0", "number"),  # the first, depth first
    ([[1.0, 2.0], [3.0]], "/query/1", "ragged"),
    ([[1.0, 2.0], 3.0], "/query/1", "ragged"),
    ([1.0, 2.0], "/query", "dimensions"),
    ([[[[1.0]]]], "/query", "dimensions"),
    ([[]], "/query", "non-empty"),
    ([], "/query", "non-empty"),
    ("1.0", "/query", "nested array"),
    ([[1e308, 1e400]], "/query/0/1", "number"),
])
def test_bad_tensors_are_422_with_a_pointer(client, value, pointer, words):
    body = assert_problem(client.post("/v1/attention", json={**GOOD, "query": value}), 422, pointer)
    assert words in body["errors"][0]["detail"] or words in body["detail"]


def test_huge_numbers_are_floats_or_refused_and_float32_overflow_is_422(client):
    wide = b'{"query": [[1' + b"0" * 30 + b']], "key": [[1.0]], "value": [[4.0]]}'
    assert client.post("/v1/attention", data=wide, content_type="application/json").get_json()["output"] == [[4.0]]
    huge = b'{"query": [[1' + b"0" * 400 + b']], "key": [[1.0]], "value": [[1.0]]}'
    assert_problem(client.post("/v1/attention", data=huge, content_type="application/json"), 400)
    response = client.post("/v1/attention", json={**GOOD, "query": [[1e200, 0.0]], "dtype": "float32"})
    assert "float32" in assert_problem(response, 422, "/query")["detail"]


@pytest.mark.parametrize(("member", "value"), [
    ("mask", [[1, 0]]), ("mask", [["true"]]), ("scale", "2"), ("scale", True), ("causal", "yes"),
    ("causal", 1), ("decimals", 16), ("decimals", 2.5), ("dtype", "float16"), ("return_weights", None),
    ("unknown_member", 1),
])
def test_bad_options_are_422(client, member, value):
    response = client.post("/v1/attention", json={**GOOD, member: value})
    body = assert_problem(response, 422)
    assert body["errors"][0]["pointer"].startswith(f"/{member}")


@pytest.mark.parametrize(("request_body", "pointer"), [
    ({"tokens": ["cat"], "seed": -1}, "/seed"),
    ({"tokens": ["cat"], "seed": 1.5}, "/seed"),
    ({"tokens": ["cat"], "seed": 2.0}, "/seed"),
    ({"tokens": ["cat"], "seed": "3"}, "/seed"),
    ({"tokens": []}, "/tokens"),
    ({"tokens": ["cat"], "d_model": 3}, "/d_model"),
    ({"tokens": ["cat"], "embeddings": [[1.0]]}, "/embeddings"),
    ({}, "/embeddings"),
    ({"embeddings": [[1.0, 2.0]], "d_model": 3}, "/d_model"),
    ({"tokens": ["cat"], "weights": {"w_q": [[1.0]]}}, "/weights/w_k"),
    ({"tokens": ["cat"], "d_k": 2, "weights": {"w_q": [[1.0]], "w_k": [[1.0]], "w_v": [[1.0]]}}, "/weights/w_q"),
    ([1, 2], ""),
])
def test_bad_self_attention_requests_are_422(client, request_body, pointer):
    body = assert_problem(client.post("/v1/self-attention", json=request_body), 422)
    assert pointer in [e["pointer"] for e in body["errors"]]


def test_unknown_tokens_point_at_each_and_list_the_known(client):
    body = assert_problem(client.post("/v1/embed", json={"tokens": ["cat", "dog", "it", "mouse"]}), 422,
                          "/tokens/1", "/tokens/3")
    assert body["known"] == ["the", "cat", "ate", "food", "it"]
    assert "dog" in body["detail"] and "mouse" in body["detail"]


def test_query_string_errors_name_the_parameter(client):
    body = assert_problem(client.get("/v1/positional-encoding?n_positions=x&d_model=0"), 422)
    assert {e["parameter"] for e in body["errors"]} == {"n_positions", "d_model"}
    assert_problem(client.get("/v1/causal-mask"), 422, "size")
    assert_problem(client.get("/v1/causal-mask?size=2.5"), 422, "size")


def test_body_over_the_limit_is_413_before_reading(client, app):
    limit = app.extensions["limits"].max_body_bytes
    response = client.post("/v1/attention", data=b" " * (limit + 1), content_type="application/json")
    assert "max_body_bytes" in assert_problem(response, 413)["detail"]


def test_chunked_body_over_the_limit_is_413():
    """No Content-Length: the service counts while reading instead of cutting the body."""
    app = app_with(limits=Limits(max_body_bytes=1000))
    body = b'{"query": [[' + b"1.0, " * 300 + b"1.0]]}"
    response = app.test_client().post("/v1/attention", input_stream=io.BytesIO(body),
                                      headers=CHUNKED, environ_overrides=TERMINATED)
    assert assert_problem(response, 413)["status"] == 413
    small = b'{"query": [[1.0]], "key": [[1.0]], "value": [[5.0]]}'
    response = app.test_client().post("/v1/attention", input_stream=io.BytesIO(small),
                                      headers=CHUNKED, environ_overrides=TERMINATED)
    assert response.get_json()["output"] == [[5.0]]


def test_unexpected_exception_is_a_500_problem_without_internals(app, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("attention.scaled_dot_product_attention", broken)
    body = assert_problem(app.test_client().post("/v1/attention", json=GOOD), 500)
    assert "secret" not in body["detail"]


@pytest.mark.parametrize(("path", "extra"), [("/v1/self-attention", {}), ("/v1/multi-head-attention", {"n_heads": 1}),
                                             ("/v1/encoder", {"n_heads": 1})])
def test_overflowing_inputs_are_422_at_the_input(client, path, extra):
    response = client.post(path, json={"embeddings": [[1e300, 1e300], [1.0, 1.0]], **extra})
    assert "overflow" in assert_problem(response, 422, "/embeddings")["detail"]


@pytest.mark.parametrize(("tokens", "pointer"), [([1], "/tokens/0"), (["cat", None], "/tokens/1"),
                                                 (["cat", "it", ["x"]], "/tokens/2"), ("cat", "/tokens"),
                                                 ([], "/tokens")])
def test_token_lists_hold_only_strings(client, tokens, pointer):
    assert_problem(client.post("/v1/embed", json={"tokens": tokens}), 422, pointer)
