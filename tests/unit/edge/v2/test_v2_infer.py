"""/v2 behaviour with the Flask test client: data forms, binary layout, output selection, health."""

from __future__ import annotations

import re

import numpy as np
import orjson
import pytest

import attention
from service.edge.smorest import VERSION
from tests.conftest import ROOT
from tests.unit.edge.v2.test_v2_errors import HEADER, MHA, QKV, SDPA, binary, send, tensor


def test_server_metadata_and_health(client):
    assert client.get("/v2").get_json() == {"name": "attention-service", "version": VERSION,
                                            "extensions": ["binary_tensor_data"]}
    assert client.get("/v2/health/live").get_json() == {"live": True}
    assert client.get("/v2/health/ready").get_json() == {"ready": True}
    assert client.get("/v2/models/multi_head_attention/ready").get_json() == {"name": "multi_head_attention",
                                                                              "ready": True}


def test_not_ready_when_the_engine_self_test_fails(client, monkeypatch):
    monkeypatch.setattr("service.operations.reference.engine.scaled_dot_product_attention", lambda *a, **k: 1 / 0)
    assert client.get("/v2/health/ready").status_code == 503
    response = client.get("/v2/models/scaled_dot_product_attention/ready")
    assert (response.status_code, response.get_json()) == (503, {"name": "scaled_dot_product_attention",
                                                                 "ready": False})
    assert client.get("/v2/health/live").status_code == 200


def test_model_metadata_marks_variable_dims(client):
    body = client.get("/v2/models/scaled_dot_product_attention").get_json()
    assert body["platform"] == "numpy" and "versions" not in body
    assert body["inputs"][3] == {"name": "mask", "datatype": "BOOL", "shape": [-1, -1, -1]}
    assert body["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, -1, -1]},
                               {"name": "weights", "datatype": "FP32", "shape": [-1, -1, -1]}]


def test_flat_and_nested_data_give_the_same_answer(client):
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    nested = [tensor("query", q), tensor("key", k), tensor("value", v)]
    flat = [dict(t, data=np.asarray(t["data"]).ravel().tolist()) for t in nested]
    answers = [send(client, SDPA, {"inputs": inputs}).get_json() for inputs in (nested, flat)]
    assert answers[0] == answers[1]
    output, weights = attention.scaled_dot_product_attention(q, k, v)
    assert answers[0]["outputs"][0]["data"] == output.ravel().tolist()
    assert answers[0]["outputs"][1] == {"name": "weights", "datatype": "FP64", "shape": [2, 3],
                                        "data": weights.ravel().tolist()}
    assert "id" not in answers[0]


def test_binary_response_layout(client):
    """JSON header, then each binary output's bytes in order; the header gives the sizes."""
    x = np.random.default_rng(1).normal(size=(2, 3, 8)).astype(np.float32)
    body, headers = binary([("embeddings", x, "FP32")], {"id": "b", "parameters": {"num_heads": 2,
                                                                                  "binary_data_output": True}})
    response = send(client, MHA, body, headers)
    assert response.status_code == 200 and response.mimetype == "application/octet-stream"
    raw = response.get_data()
    split = int(response.headers[HEADER])
    assert int(response.headers["Content-Length"]) == len(raw)
    header = orjson.loads(raw[:split])
    assert header["id"] == "b"
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sizes == [2 * 3 * 8 * 4, 2 * 2 * 3 * 3 * 4] and split + sum(sizes) == len(raw)
    output, weights = attention.MultiHeadAttention(8, 2)(x)
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4", output.size, split).reshape(2, 3, 8), output)
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4", offset=split + sizes[0]).reshape(2, 2, 3, 3), weights)


def test_per_output_binary_overrides_binary_data_output(client):
    answer = send(client, SDPA, {"inputs": QKV, "parameters": {"binary_data_output": True},
                                 "outputs": [{"name": "weights", "parameters": {"binary_data": False}}]})
    assert answer.mimetype == "application/json"
    assert [o["name"] for o in answer.get_json()["outputs"]] == ["weights"]


def test_bool_mask_as_bytes(client):
    mask = np.array([[True, False, True], [False, False, True]])
    body, headers = binary([("query", np.ones((2, 4)), "FP64"), ("key", np.eye(3, 4), "FP64"),
                            ("value", np.eye(3, 2), "FP64"), ("mask", mask, "BOOL")])
    weights = send(client, SDPA, body, headers).get_json()["outputs"][1]["data"]
    assert (np.array(weights).reshape(2, 3)[~mask] == 0).all()


@pytest.mark.parametrize(("outputs", "return_weights"), [(["output"], False), (["output", "weights"], True),
                                                         (None, True), (["weights"], True)])
def test_weights_are_computed_only_when_asked_for(client, monkeypatch, outputs, return_weights):
    calls = []
    real = attention.scaled_dot_product_attention
    monkeypatch.setattr("service.operations.attention.engine.scaled_dot_product_attention",
                        lambda *a, **k: calls.append(k["return_weights"]) or real(*a, **k))
    body = {"inputs": QKV, **({"outputs": [{"name": n} for n in outputs]} if outputs else {})}
    answer = send(client, SDPA, body).get_json()
    assert calls == [return_weights]
    assert [o["name"] for o in answer["outputs"]] == (outputs or ["output", "weights"])


def test_fp32_json_in_fp32_json_out(client):
    x = np.random.default_rng(2).normal(size=(4, 8)).astype(np.float32)
    answer = send(client, MHA, {"inputs": [tensor("embeddings", x, "FP32")], "parameters": {"num_heads": 4,
                                                                                            "causal": True}})
    [output, weights] = answer.get_json()["outputs"]
    assert output["datatype"] == weights["datatype"] == "FP32"
    expected_output, expected_weights = attention.MultiHeadAttention(8, 4)(x, causal=True)
    np.testing.assert_array_equal(np.array(output["data"], np.float32).reshape(4, 8), expected_output)
    np.testing.assert_array_equal(np.array(weights["data"], np.float32).reshape(4, 4, 4), expected_weights)


def test_protocol_parameters_it_does_not_use_are_ignored(client):
    response = send(client, SDPA, {"inputs": QKV, "parameters": {"priority": 1, "timeout": 100}})
    assert response.status_code == 200


def docs_v2_curls() -> list[tuple[str, str | None, str]]:
    """(path, JSON body or None, answer) of each plain curl example of the manual's v2 page (docs/v2.md)."""
    page = (ROOT / "docs" / "v2.md").read_text()
    pattern = re.compile(r"^\$ curl -s localhost:8000(\S+)(?: -d '(.*?)')?\n(\{.*?\})$", re.M | re.S)
    return [(path, body, answer) for path, body, answer in pattern.findall(page)]


def test_docs_v2_curl_answers_are_real(client):
    examples = docs_v2_curls()
    assert len(examples) == 3
    for path, body, answer in examples:
        response = client.post(path, data=body) if body else client.get(path)
        assert response.get_json() == orjson.loads(answer), path
