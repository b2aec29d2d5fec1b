"""The /v2 operations in openapi.yaml: documented, and true of real answers and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.operations.catalogue import DEFAULT_NAME, DEFAULTS
from tests.close import EXAMPLE, assert_close
from tests.unit.edge.test_openapi import SPEC, response_schema, validator
from tests.unit.edge.v2.test_v2_errors import SDPA

V2 = [(path, method, operation) for path, item in SPEC["paths"].items() if path.startswith("/v2")
      for method, operation in item.items() if method in ("get", "post")]
INFER = SPEC["paths"]["/v2/models/{model}/infer"]["post"]


def test_every_v2_route_is_documented():
    assert {(path, method) for path, method, _ in V2} == {
        ("/v2", "get"), ("/v2/health/live", "get"), ("/v2/health/ready", "get"), ("/v2/models/{model}", "get"),
        ("/v2/models/{model}/ready", "get"), ("/v2/models/{model}/infer", "post")}


@pytest.mark.parametrize(("path", "method", "operation"), V2, ids=[f"{m} {p}" for p, m, _ in V2])
def test_real_answers_match_their_schema_and_example(client, path, method, operation):
    assert operation["summary"] and operation["description"]
    url = path.replace("{model}", "scaled_dot_product_attention" if method == "post" or path.endswith("}")
                       else "multi_head_attention")
    media = operation["responses"]["200"]["content"]["application/json"]
    if method == "post":
        response = client.post(url, json=operation["requestBody"]["content"]["application/json"]["example"])
    else:
        response = client.get(url)
    assert response.status_code == 200 and response.mimetype == "application/json"
    validator(media["schema"]).validate(response.get_json())
    assert_close(response.get_json(), media["example"], **EXAMPLE)  # the example's numbers: to 6 digits


def test_infer_documents_the_binary_form():
    assert set(INFER["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    assert "Inference-Header-Content-Length" in INFER["requestBody"]["description"]
    assert set(INFER["responses"]["200"]["content"]) == {"application/json", "application/octet-stream"}
    assert "Inference-Header-Content-Length" in INFER["responses"]["200"]["headers"]


def test_the_binary_header_is_a_documented_parameter_the_server_reads(client):
    """As a parameter, a generated client can send it (and openapi-python-client 0.29's module imports)."""
    [parameter] = INFER["parameters"]
    assert parameter["in"] == "header" and parameter["name"] == "Inference-Header-Content-Length"
    assert parameter["schema"] == {"type": "integer", "minimum": 0} and parameter["required"] is False
    header = json.dumps({"inputs": [{"name": "embeddings", "shape": [1, 2], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 8}}],
                         "parameters": {"num_heads": 1}, "outputs": [{"name": "output"}]}).encode()
    url = SDPA.replace("scaled_dot_product_attention", "multi_head_attention")
    sent = client.post(url, data=header + np.array([1, 0], "<f4").tobytes(),
                       headers={parameter["name"]: str(len(header))})
    assert sent.status_code == 200 and sent.get_json()["outputs"][0]["shape"] == [1, 2]
    refused = client.post(url, data=header, headers={parameter["name"]: "-1"})
    assert refused.status_code == 400 and parameter["name"] in refused.get_json()["error"]


@pytest.mark.parametrize(("status", "send"), [
    ("400", {"json": {"inputs": [{"name": "key", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]}]}}),
    ("404", {"json": {"inputs": []}, "model": "gpt"}),
    ("413", {"data": b"{" * 17 * 2**20}),
])
def test_real_errors_match_the_protocol_error_schema(client, status, send):
    url = SDPA.replace("scaled_dot_product_attention", send.pop("model", "scaled_dot_product_attention"))
    response = client.post(url, **send)
    assert str(response.status_code) == status
    content_type, media = response_schema("/v2/models/{model}/infer", "post", status)
    assert response.mimetype == content_type == "application/json"
    validator(media["schema"]).validate(response.get_json())
    if "example" in media:
        assert response.get_json() == media["example"]


def test_the_trained_model_is_documented_like_the_attention_models():
    """Its name in every /v2 model path's enum, its tensors and parameters in the infer operation's description."""
    for path in ("/v2/models/{model}", "/v2/models/{model}/ready", "/v2/models/{model}/infer"):
        [parameter] = SPEC["paths"][path]["parameters"]
        assert parameter["schema"]["enum"] == ["scaled_dot_product_attention", "multi_head_attention", *DEFAULTS]
    for words in ("`text` (BYTES [B]", "`layers`, `heads` (comma-separated strings such as",
                  "`attentions` (FP32 [B, L, H, n, n])", "`last_hidden_state` (FP32", "`tokens` (BYTES [B, n])",
                  "padded keys weigh exactly 0"):
        assert words in " ".join(INFER["description"].split())


def test_the_trained_models_real_answers_match_the_schemas(client):
    url = f"/v2/models/{DEFAULT_NAME}"
    body = client.get(url).get_json()
    validator(SPEC["paths"]["/v2/models/{model}"]["get"]["responses"]["200"]["content"]["application/json"]
              ["schema"]).validate(body)
    answer = client.post(f"{url}/infer", json={"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                                                           "data": ["the dog ate", "hi"]}],
                                               "parameters": {"layers": "0", "heads": "1,2"}})
    validator(INFER["responses"]["200"]["content"]["application/json"]["schema"]).validate(answer.get_json())
    error = client.post(f"{url}/infer", json={"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                                          "data": [" "]}]})
    _, media = response_schema("/v2/models/{model}/infer", "post", "400")
    assert error.status_code == 400
    validator(media["schema"]).validate(error.get_json())
