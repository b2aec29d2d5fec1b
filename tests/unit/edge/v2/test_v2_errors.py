"""/v2 errors: every bad request is a protocol error caught before compute; the server stays healthy."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from service.settings import Limits
from tests.conftest import app_with

SDPA, MHA = "/v2/models/scaled_dot_product_attention/infer", "/v2/models/multi_head_attention/infer"
HEADER = "Inference-Header-Content-Length"


def tensor(name: str, array: Any, datatype: str = "FP64", **extra: Any) -> dict[str, Any]:
    array = np.asarray(array)
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": array.tolist(), **extra}


QKV = [tensor("query", np.ones((2, 4))), tensor("key", np.ones((3, 4))), tensor("value", np.ones((3, 2)))]


def binary(inputs: list[tuple[str, np.ndarray, str]], header: dict | None = None) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body: JSON header then each array's bytes; the HTTP headers to send."""
    json = orjson.dumps({**(header or {}), "inputs": [
        {"name": name, "shape": list(a.shape), "datatype": dt, "parameters": {"binary_data_size": a.nbytes}}
        for name, a, dt in inputs]})
    return json + b"".join(a.tobytes() for _, a, _ in inputs), {HEADER: str(len(json))}


def binary_qkv(**arrays: np.ndarray) -> tuple[bytes, dict[str, str]]:
    qkv = {"query": np.ones((2, 4)), "key": np.ones((3, 4)), "value": np.ones((3, 2)), **arrays}
    return binary([(name, a, "BOOL" if a.dtype == bool else "FP64") for name, a in qkv.items()])


def send(client, path: str, body: Any, headers: dict[str, str] | None = None):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return client.post(path, data=data, headers=headers or {})


def assert_still_healthy(client) -> None:
    """After any error: live, ready, and a real inference still answers."""
    assert client.get("/v2/health/live").get_json() == {"live": True}
    assert client.get("/v2/health/ready").status_code == 200
    assert send(client, SDPA, {"inputs": QKV}).status_code == 200


def assert_error(response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert list(body) == ["error"]
    for fragment in fragments:
        assert fragment in body["error"]
    return body["error"]


def with_input(index: int, **changes: Any) -> dict[str, Any]:
    inputs = [dict(t) for t in QKV]
    inputs[index].update(changes)
    return {"inputs": [{k: v for k, v in t.items() if v is not None} for t in inputs]}


JSON_ERRORS = {
    "not json": (SDPA, b"{", "not valid JSON"),
    "nan literal": (SDPA, b'{"inputs": [{"name": "query", "shape": [1], "datatype": "FP64", "data": [NaN]}]}',
                    "not valid JSON"),
    "not an object": (SDPA, [1, 2], "Invalid inference request"),
    "no inputs": (SDPA, {"id": "x"}, "/inputs: Missing data"),
    "empty inputs": (SDPA, {"inputs": []}, "/inputs"),
    "id not a string": (SDPA, {"id": 3, "inputs": QKV}, "/id"),
    "shape negative": (SDPA, with_input(0, shape=[-2, 4]), "/inputs/0/shape/0"),
    "shape not a list": (SDPA, with_input(0, shape="2x4"), "/inputs/0/shape"),
    "unknown datatype": (SDPA, with_input(0, datatype="FLOAT"), "/inputs/0/datatype"),
    "unknown input member": (SDPA, with_input(0, contents=[1]), "/inputs/0/contents"),
    "unknown input": (SDPA, {"inputs": [*QKV, tensor("bias", [1.0])]}, "Unknown input 'bias'"),
    "repeated input": (SDPA, {"inputs": [*QKV, QKV[0]]}, "input 'query' is given twice"),
    "missing input": (SDPA, {"inputs": QKV[:2]}, "input 'value' is missing; expected FP32 or FP64 with shape"),
    "unsupported datatype": (SDPA, with_input(1, datatype="INT32"),
                             "input 'key': datatype INT32 is not supported; expected FP32 or FP64"),
    "mixed float datatypes": (SDPA, with_input(1, datatype="FP32"), "share one datatype"),
    "mask not BOOL": (SDPA, {"inputs": [*QKV, tensor("mask", [[1.0, 0.0, 1.0]])]},
                      "input 'mask': datatype FP64 is not supported; expected BOOL"),
    "rank 1 query": (SDPA, {"inputs": [tensor("query", [1.0, 2.0]), *QKV[1:]]},
                     "input 'query': got shape [2]; expected FP32 or FP64 with shape [n_q, d_k] or [B, n_q, d_k]"),
    "zero dim": (SDPA, with_input(0, shape=[0, 4], data=[]), "input 'query': got shape [0, 4]"),
    "no data": (SDPA, with_input(0, data=None), "input 'query': no data and no binary_data_size"),
    "string leaf": (SDPA, with_input(0, data=[1, 1, 1, "1", 1, 1, 1, 1]), "input 'query': data/3: Expected a number"),
    "boolean leaf": (SDPA, with_input(0, data=[[1, 1, 1, 1], [1, True, 1, 1]]), "data/1/1: Expected a number"),
    "ragged data": (SDPA, with_input(0, data=[[1, 1, 1, 1], [1, 1, 1]]), "data/1: ragged array"),
    "too few values": (SDPA, with_input(0, data=[1, 2, 3]), "input 'query': data has shape [3], not [2, 4]"),
    "nested in another shape": (SDPA, with_input(0, data=[[1, 2], [3, 4], [5, 6], [7, 8]]),
                                "data has shape [4, 2], not [2, 4]"),
    "huge for FP32": (SDPA, {"inputs": [dict(t, datatype="FP32") for t in with_input(0, data=[1e39] * 8)["inputs"]]},
                      "input 'query': query has values beyond the float32 range"),
    "mask number leaf": (SDPA, {"inputs": [*QKV, tensor("mask", [[1, 0, 1]], "BOOL")]},
                         "input 'mask': data/0/0: Expected a boolean"),
    "d_k mismatch": (SDPA, with_input(1, shape=[3, 2], data=[1.0] * 6), "input 'key': expected last axis d_k = 4"),
    "batch mismatch": (SDPA, {"inputs": [tensor("query", np.ones((2, 2, 4))), tensor("key", np.ones((3, 3, 4))),
                                         tensor("value", np.ones((3, 3, 2)))]}, "input 'key': batch axes of query"),
    "mask shape": (SDPA, {"inputs": [*QKV, tensor("mask", [[True, False]], "BOOL")]},
                   "input 'mask': shape (1, 2) does not broadcast to (2, 3)"),
    "scale a string": (SDPA, {"inputs": QKV, "parameters": {"scale": "2"}}, "/parameters/scale: Not a valid number"),
    "causal not a bool": (SDPA, {"inputs": QKV, "parameters": {"causal": "yes"}}, "/parameters/causal"),
    "binary_data_output not a bool": (SDPA, {"inputs": QKV, "parameters": {"binary_data_output": 1}},
                                      "/parameters/binary_data_output"),
    "unknown output": (SDPA, {"inputs": QKV, "outputs": [{"name": "scores"}]},
                       "outputs: 'scores' is unknown or repeated; scaled_dot_product_attention has output and weights"),
    "repeated output": (SDPA, {"inputs": QKV, "outputs": [{"name": "output"}, {"name": "output"}]}, "repeated"),
    "output binary_data not a bool": (SDPA, {"inputs": QKV, "outputs": [{"name": "output",
                                                                           "parameters": {"binary_data": "no"}}]},
                                      "/outputs/0/parameters/binary_data"),
    "num_heads missing": (MHA, {"inputs": [tensor("embeddings", np.ones((3, 8)))]},
                          "/parameters/num_heads: Missing data"),
    "num_heads fractional": (MHA, {"inputs": [tensor("embeddings", np.ones((3, 8)))], "parameters": {"num_heads": 2.5}},
                             "/parameters/num_heads: Not a valid integer"),
    "num_heads not dividing": (MHA, {"inputs": [tensor("embeddings", np.ones((3, 8)))], "parameters": {"num_heads": 3}},
                               "parameter 'num_heads': d_model=8 must be divisible by n_heads=3"),
    "seed negative": (MHA, {"inputs": [tensor("embeddings", np.ones((3, 8)))],
                            "parameters": {"num_heads": 2, "seed": -1}}, "/parameters/seed"),
    "17 inputs": (SDPA, {"inputs": [{}] * 17}, "/inputs: Length must be between 1 and 16"),
    "17 outputs": (SDPA, {"inputs": QKV, "outputs": [{}] * 17}, "/outputs: Longer than maximum length 16"),
    "65 parameters": (SDPA, {"inputs": QKV, "parameters": {f"p{i}": i for i in range(65)}},
                      "/parameters: More than 64 members"),
    "rank 9": (SDPA, with_input(0, shape=[1] * 9, data=[1.0]), "/inputs/0/shape: Longer than maximum length 8"),
    "embeddings rank 4": (MHA, {"inputs": [tensor("embeddings", np.ones((1, 1, 3, 8)))],
                                "parameters": {"num_heads": 2}},
                          "input 'embeddings': got shape [1, 1, 3, 8]; expected FP32 or FP64 with shape "
                          "[n, d_model] or [B, n, d_model]"),
}


@pytest.mark.parametrize(("path", "body", "fragment"), JSON_ERRORS.values(), ids=JSON_ERRORS.keys())
def test_json_request_errors(client, path, body, fragment):
    assert_error(send(client, path, body), 400, fragment)
    assert_still_healthy(client)


def _header(json: bytes, value: str) -> tuple[bytes, dict[str, str]]:
    return json, {HEADER: value}


BINARY_ERRORS = {
    "size does not match shape": (lambda: binary([("query", np.ones((2, 4)), "FP64")])[0].replace(b"64}", b"32}"),
                                  "input 'query': binary_data_size is 32 bytes but shape [2, 4] of FP64 needs 64"),
    "body shorter than sizes": (lambda: binary_qkv()[0][:-8], "input 'value': binary_data_size 48 runs past the end"),
    "unclaimed bytes": (lambda: binary_qkv()[0] + b"\0" * 8,
                        "8 bytes of binary data after the JSON header are not claimed"),
    "FP32 bytes declared FP64": (lambda: binary([("query", np.ones((2, 4), np.float32), "FP64")])[0],
                                 "binary_data_size is 32 bytes but shape [2, 4] of FP64 needs 64"),
    "NaN bytes": (lambda: binary_qkv(query=np.full((2, 4), np.nan))[0],
                  "input 'query': every value must be finite (NaN or Infinity found)"),
    "infinity bytes": (lambda: binary_qkv(value=np.full((3, 2), -np.inf))[0], "input 'value': every value must be"),
    "BOOL byte 2": (lambda: binary_qkv(mask=np.ones((2, 3), bool))[0][:-1] + b"\x02", "BOOL bytes must be 0 or 1"),
}


@pytest.mark.parametrize(("make", "fragment"), BINARY_ERRORS.values(), ids=BINARY_ERRORS.keys())
def test_binary_request_errors(client, make, fragment):
    body = make()
    json_length = body.index(b"}]}") + 3
    assert_error(send(client, SDPA, body, {HEADER: str(json_length)}), 400, fragment)
    assert_still_healthy(client)


def test_both_data_and_binary_data_size(client):
    body, headers = binary_qkv()
    header = orjson.loads(body[:int(headers[HEADER])])
    header["inputs"][0]["data"] = [1.0] * 8
    json = orjson.dumps(header)
    response = send(client, SDPA, json + body[int(headers[HEADER]):], {HEADER: str(len(json))})
    assert_error(response, 400, "input 'query': give either data or binary_data_size, not both")
    assert_still_healthy(client)


@pytest.mark.parametrize("value", ["x", "-1", "1e3", "999999", "\u00b2", "0" * 4999 + "1"])
def test_bad_header_length(client, value):
    body, _ = binary_qkv()
    assert_error(send(client, SDPA, body, {HEADER: value}), 400, "Inference-Header-Content-Length must be")
    assert_still_healthy(client)


def test_binary_without_header_length_is_not_json(client):
    body, _ = binary_qkv()
    assert_error(send(client, SDPA, body, {"Content-Type": "application/octet-stream"}), 400,
                 "not valid UTF-8: byte 0x", "binary tensor data needs Inference-Header-Content-Length")
    assert_still_healthy(client)


def test_a_header_unreadable_as_utf8_names_the_charset_it_declares(client):
    body = '{"inputs": []}'.encode("utf-16")
    assert_error(send(client, SDPA, body, {"Content-Type": "application/json; charset=utf-16"}), 400,
                 "declares charset=utf-16")
    assert_still_healthy(client)


def test_a_header_that_is_not_utf8_says_where_it_stops_being_utf8(client):
    body = b'{"id": "caf\xe9!", "inputs": []}'
    assert_error(send(client, SDPA, body, {"Content-Type": "application/json"}), 400,
                 "not valid UTF-8: byte 0xe9 at offset 11 (line 1, column 12): invalid continuation byte")
    assert_still_healthy(client)


@pytest.mark.parametrize("path", ["/v2/models/gpt", "/v2/models/gpt/ready", "/v2/models/gpt/infer"])
def test_unknown_model_is_404(client, path):
    response = client.post(path, json={"inputs": QKV}) if path.endswith("infer") else client.get(path)
    assert_error(response, 404, "Unknown model 'gpt'; the models are scaled_dot_product_attention, "
                                "multi_head_attention, all-minilm-l6-v2, smollm2-135m-instruct.")
    assert_still_healthy(client)


def limited(**limits: int):
    return app_with(limits=Limits(**limits)).test_client()


OVERSIZE = {
    "sequence length": ({"max_sequence_length": 2}, SDPA, {"inputs": QKV},
                        "input 'key': 3 exceeds the limit max_sequence_length=2"),
    "d_model": ({"max_d_model": 4}, MHA, {"inputs": [tensor("embeddings", np.ones((3, 8)))],
                                          "parameters": {"num_heads": 2}},
                "input 'embeddings': 8 exceeds the limit max_d_model=4"),
    "heads": ({"max_heads": 2}, MHA, {"inputs": [tensor("embeddings", np.ones((3, 8)))],
                                      "parameters": {"num_heads": 4}},
              "parameter 'num_heads': 4 exceeds the limit max_heads=2"),
    "weight elements": ({"max_weight_elements": 5}, SDPA, {"inputs": QKV},
                        "input 'query': 6 exceeds the limit max_weight_elements=5"),  # n_q x n_k = 2 x 3
    "output elements": ({"max_output_elements": 8}, SDPA,  # B x n_q x d_v = 5 x 1 x 2: one key and value, 5 queries
                        {"inputs": [tensor("query", np.ones((5, 1, 4))), tensor("key", np.ones((1, 4))),
                                    tensor("value", np.ones((1, 2)))]},
                        "input 'query': 10 exceeds the limit max_output_elements=8"),
    "json depth": ({"max_json_depth": 3}, SDPA, {"inputs": QKV}, "request: 5 exceeds the limit max_json_depth=3"),
}


@pytest.mark.parametrize(("limits", "path", "body", "fragment"), OVERSIZE.values(), ids=OVERSIZE.keys())
def test_oversized_requests_are_refused_before_compute(limits, path, body, fragment, monkeypatch):
    client = limited(**limits)
    monkeypatch.setattr("attention.MultiHeadAttention.__call__", _no_compute)
    monkeypatch.setattr("service.operations.attention.engine.scaled_dot_product_attention", _no_compute)
    assert_error(send(client, path, body), 400, fragment)
    monkeypatch.undo()
    assert client.get("/v2/health/ready").status_code == 200


def _no_compute(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("computed an oversized request")


@pytest.mark.parametrize("as_binary", [True, False], ids=["binary", "json"])
def test_body_over_the_limit_is_413(as_binary):
    client = limited(max_body_bytes=1000)
    query = np.ones((100, 4))
    body, headers = binary_qkv(query=query) if as_binary else (orjson.dumps(with_input(0, data=query.tolist())), {})
    assert_error(send(client, SDPA, body, headers), 413, "the limit max_body_bytes is 1000")
    assert client.get("/v2/health/ready").status_code == 200


@pytest.mark.parametrize(("method", "path", "status"), [
    ("get", "/v2/nope", 404), ("get", "/v2/models/multi_head_attention/nope", 404),
    ("delete", "/v2/models/multi_head_attention/infer", 405), ("post", "/v2/health/live", 405),
])
def test_unrouted_v2_paths_answer_in_the_protocol_form(client, method, path, status):
    response = getattr(client, method)(path)
    assert response.status_code == status and response.mimetype == "application/json"
    assert set(response.get_json()) == {"error"}
    if status == 405:
        assert "POST" in response.headers["Allow"] or "GET" in response.headers["Allow"]


def test_unrouted_v1_paths_stay_problems(client):
    for response in (client.get("/v1/nope"), client.get("/v2x"), client.post("/v1/limits")):
        assert response.mimetype == "application/problem+json"


def test_an_overflow_names_the_input_not_the_engine_argument(client):
    body = {"inputs": [tensor("embeddings", np.full((2, 8), 1e200))], "parameters": {"num_heads": 2}}
    assert_error(send(client, MHA, orjson.dumps(body)), 400,
                 "input 'embeddings': the attention scores overflowed: input values are too large")


def test_model_name_in_the_request_is_accepted_when_it_is_the_paths(client):
    """Triton's examples send model_name in the body: the path's model is fine, another is a 400."""
    assert send(client, SDPA, {"model_name": "scaled_dot_product_attention", "inputs": QKV}).status_code == 200
    assert_error(send(client, SDPA, {"model_name": "multi_head_attention", "inputs": QKV}), 400,
                 "model_name 'multi_head_attention' is not the model of the path")


@pytest.mark.parametrize(("path", "rest"), [("/versions/1", ""), ("/versions/2/ready", "/ready"),
                                            ("/versions/1/infer", "/infer")])
def test_a_versioned_path_says_models_are_not_versioned(client, path, rest):
    """The protocol's optional /versions/<v> segment: a 404 that says what to call instead."""
    url = f"/v2/models/scaled_dot_product_attention{path}"
    response = client.post(url, json={"inputs": QKV}) if rest == "/infer" else client.get(url)
    assert_error(response, 404, f"use /v2/models/scaled_dot_product_attention{rest} (without /versions/")
