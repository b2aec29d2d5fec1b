"""/v2 proven with the official Triton client against the real gunicorn: answers equal v1's, exactly."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT
from tests.live.conftest import LIVE_BODY_LIMIT

SDPA, MHA = "scaled_dot_product_attention", "multi_head_attention"
DATATYPES = {"FP32": np.float32, "FP64": np.float64}
V1_DTYPE = {"FP32": "float32", "FP64": "float64"}


@pytest.fixture(scope="module")
def triton_client(live_server: str) -> triton.InferenceServerClient:
    connection = triton.InferenceServerClient(live_server.removeprefix("http://"), network_timeout=30)
    yield connection
    connection.close()


def v1(live_server: str, path: str, body: dict) -> dict[str, np.ndarray]:
    """The v1 endpoint's answer over real HTTP, as arrays."""
    response = requests.post(f"{live_server}/v1/{path}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return {name: np.array(value) for name, value in response.json().items() if value is not None}


def tensor(name: str, array: np.ndarray, datatype: str, binary: bool) -> triton.InferInput:
    value = triton.InferInput(name, list(array.shape), datatype)
    value.set_data_from_numpy(array, binary_data=binary)
    return value


def assert_same(result: triton.InferResult, expected: dict[str, np.ndarray], dtype: type, names: list[str]) -> None:
    """Every output in the inputs' precision, equal to v1's numbers to the last bit."""
    assert [output["name"] for output in result.get_response()["outputs"]] == names
    for name in names:
        got = result.as_numpy(name)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, expected[name].astype(dtype), strict=True)


def test_health_and_metadata(triton_client, live_server):
    assert triton_client.is_server_live() and triton_client.is_server_ready()
    assert triton_client.is_model_ready(SDPA) and triton_client.is_model_ready(MHA)
    assert not triton_client.is_model_ready("gpt")
    assert triton_client.get_server_metadata()["extensions"] == ["binary_tensor_data"]
    metadata = triton_client.get_model_metadata(MHA)
    assert metadata["inputs"] == [{"name": "embeddings", "datatype": "FP32", "shape": [-1, -1, -1]}]
    assert [(o["name"], o["shape"]) for o in metadata["outputs"]] == [("output", [-1, -1, -1]),
                                                                        ("weights", [-1, -1, -1, -1])]
    sdpa = triton_client.get_model_metadata(SDPA)
    assert [(i["name"], i["datatype"]) for i in sdpa["inputs"]] == [
        ("query", "FP32"), ("key", "FP32"), ("value", "FP32"), ("mask", "BOOL")]
    with pytest.raises(InferenceServerException, match="Unknown model 'gpt'"):
        triton_client.get_model_metadata("gpt")


def test_a_request_built_from_the_metadata_alone_is_answered_in_the_advertised_datatypes(triton_client):
    """A generic client reads each input's datatype and rank from the metadata, fills -1 dims, and infers."""
    metadata = triton_client.get_model_metadata(MHA)
    [spec] = metadata["inputs"]
    x = np.random.default_rng(3).normal(size=(2, 5, 8)).astype(DATATYPES[spec["datatype"]])
    assert x.ndim == len(spec["shape"])
    result = triton_client.infer(MHA, [tensor(spec["name"], x, spec["datatype"], True)],
                                 parameters={"num_heads": 2})
    for output in metadata["outputs"]:
        answered = result.get_output(output["name"])
        assert answered["datatype"] == output["datatype"] and len(answered["shape"]) == len(output["shape"])
        assert result.as_numpy(output["name"]).dtype == DATATYPES[output["datatype"]]


CASES = list(itertools.product(DATATYPES, (True, False), (True, False), (True, False), (True, False)))


@pytest.mark.parametrize(("datatype", "binary_in", "binary_out", "masked", "batched"), CASES,
                         ids=[f"{d}-in{'Bin' if i else 'Json'}-out{'Bin' if o else 'Json'}-{'mask' if m else 'nomask'}"
                              f"-{'B2' if b else 'noB'}" for d, i, o, m, b in CASES])
def test_attention_equals_v1(triton_client, live_server, datatype, binary_in, binary_out, masked, batched):
    rng = np.random.default_rng(7)
    dtype, lead = DATATYPES[datatype], (2,) if batched else ()
    q, k, v = (rng.normal(size=(*lead, n, 4)).astype(dtype) for n in (3, 5, 5))
    mask = rng.random((*lead, 3, 5)) > 0.3
    mask[..., 0] = True  # every query sees something
    inputs = [tensor(name, array, datatype, binary_in) for name, array in (("query", q), ("key", k), ("value", v))]
    if masked:
        inputs.append(tensor("mask", mask, "BOOL", binary_in))
    outputs = [triton.InferRequestedOutput(name, binary_data=binary_out) for name in ("output", "weights")]
    result = triton_client.infer(SDPA, inputs, outputs=outputs, request_id="r-1", parameters={"scale": 0.7})
    assert result.get_response()["id"] == "r-1"
    expected = v1(live_server, "attention", {"query": q.tolist(), "key": k.tolist(), "value": v.tolist(),
                                             "mask": mask.tolist() if masked else None, "scale": 0.7,
                                             "dtype": V1_DTYPE[datatype]})
    assert_same(result, expected, dtype, ["output", "weights"])
    if masked:
        assert (result.as_numpy("weights")[~mask] == 0).all()


MHA_CASES = list(itertools.product(DATATYPES, (True, False), (True, False), (True, False)))


@pytest.mark.parametrize(("datatype", "binary_in", "binary_out", "batched"), MHA_CASES,
                         ids=[f"{d}-in{'Bin' if i else 'Json'}-out{'Bin' if o else 'Json'}-{'B2' if b else 'noB'}"
                              for d, i, o, b in MHA_CASES])
def test_multi_head_equals_v1(triton_client, live_server, datatype, binary_in, binary_out, batched):
    dtype = DATATYPES[datatype]
    x = np.random.default_rng(3).normal(size=(2, 6, 8) if batched else (6, 8)).astype(dtype)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary_out) for name in ("output", "weights")]
    result = triton_client.infer(MHA, [tensor("embeddings", x, datatype, binary_in)], outputs=outputs, parameters={
        "num_heads": 4, "seed": 5, "causal": True, "positional_encoding": True})
    expected = v1(live_server, "multi-head-attention", {"embeddings": x.tolist(), "n_heads": 4, "seed": 5,
                                                        "causal": True, "positional_encoding": True,
                                                        "dtype": V1_DTYPE[datatype]})
    assert_same(result, expected, dtype, ["output", "weights"])
    assert result.as_numpy("weights").shape == ((2, 4, 6, 6) if batched else (4, 6, 6))


def test_seed_demo_5_weights_by_default(triton_client, live_server, seed_script):
    """seed 0 is the seed script's weights: its demo 5 per-head weights through v2."""
    tokens = ["the", "cat", "ate", "food", "it"]
    x = np.pad(seed_script.embed(tokens), ((0, 0), (0, 4)))
    result = triton_client.infer(MHA, [tensor("embeddings", x, "FP64", True)], parameters={
        "num_heads": 4, "causal": True, "positional_encoding": True})
    _, heads = seed_script.MultiHeadAttention(8, 4)(x + seed_script.positional_encoding(5, 8),
                                                     mask=seed_script.causal_mask(5))
    np.testing.assert_allclose(result.as_numpy("weights"), np.stack(heads), rtol=1e-12, atol=1e-15)


def test_no_outputs_asked_means_all_binary(triton_client, live_server):
    """tritonclient without `outputs` asks binary_data_output: true: both outputs come back as bytes."""
    x = np.eye(4)
    result = triton_client.infer(MHA, [tensor("embeddings", x, "FP64", False)], parameters={"num_heads": 2})
    assert [o["parameters"]["binary_data_size"] for o in result.get_response()["outputs"]] == [4 * 4 * 8, 2 * 16 * 8]
    expected = v1(live_server, "multi-head-attention", {"embeddings": x.tolist(), "n_heads": 2})
    assert_same(result, expected, np.float64, ["output", "weights"])


def test_only_output_asked_returns_only_output(triton_client, live_server):
    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    result = triton_client.infer(MHA, [tensor("embeddings", x, "FP32", True)], parameters={"num_heads": 2},
                          outputs=[triton.InferRequestedOutput("output")])
    expected = v1(live_server, "multi-head-attention", {"embeddings": x.tolist(), "n_heads": 2, "dtype": "float32"})
    assert_same(result, expected, np.float32, ["output"])
    assert result.as_numpy("weights") is None


def test_client_errors_are_protocol_errors_and_the_server_stays_healthy(triton_client, live_server):
    q = np.ones((2, 4), np.float32)
    bad = [tensor("query", q, "FP32", True), tensor("key", np.ones((2, 3), np.float32), "FP32", True),
           tensor("value", q, "FP32", True)]
    with pytest.raises(InferenceServerException, match=r"\[400\] input 'key': .*d_k") as error:
        triton_client.infer(SDPA, bad)
    assert error.value.status() == "400"
    with pytest.raises(InferenceServerException, match=r"input 'value' is missing; expected FP32 or FP64"):
        triton_client.infer(SDPA, bad[:2])
    nan = np.full((2, 4), np.nan, np.float32)
    with pytest.raises(InferenceServerException, match=r"input 'query': every value must be finite"):
        triton_client.infer(SDPA, [tensor("query", nan, "FP32", True), *bad[1:]])
    assert triton_client.is_server_live() and triton_client.is_server_ready()


def test_binary_body_over_the_limit_is_413_over_real_http(live_server):
    """Content-Length past max_body_bytes: 413 with a protocol error before the body is read."""
    header = b'{"inputs": [{"name": "embeddings", "shape": [256, 512], "datatype": "FP64", ' \
             b'"parameters": {"binary_data_size": 1048576}}]}'
    body = header + bytes(LIVE_BODY_LIMIT)
    response = requests.post(f"{live_server}/v2/models/{MHA}/infer", data=body, timeout=30,
                              headers={"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["error"]
    assert requests.get(f"{live_server}/v2/health/ready", timeout=10).status_code == 200


def test_chunked_binary_body_over_the_limit_is_413_over_real_http(live_server):
    """No Content-Length (chunked): counted while read, still 413, not a truncated parse."""
    header = b'{"inputs": [{"name": "embeddings", "shape": [1, 8], "datatype": "FP64", ' \
             b'"parameters": {"binary_data_size": 64}}]}'

    def chunks():
        yield header
        for _ in range(LIVE_BODY_LIMIT // 65536 + 2):
            yield bytes(65536)

    response = requests.post(f"{live_server}/v2/models/{MHA}/infer", data=chunks(), timeout=30,
                             headers={"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 413
    assert response.json()["error"].startswith("The body is more than")
    assert requests.get(f"{live_server}/v2/health/live", timeout=10).json() == {"live": True}


TRAINED = "all-minilm-l6-v2"
SENTENCES = ["The animal didn't cross the street because it was too tired.", "the dog ate", "Ünïcode: café ✓"]


def test_trained_model_metadata(triton_client):
    assert triton_client.is_model_ready(TRAINED)
    metadata = triton_client.get_model_metadata(TRAINED)
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert [(o["name"], o["datatype"], len(o["shape"])) for o in metadata["outputs"]] == [
        ("attentions", "FP32", 5), ("last_hidden_state", "FP32", 3), ("tokens", "BYTES", 2)]


TRAINED_CASES = list(itertools.product((True, False), (True, False)))


@pytest.mark.parametrize(("binary_in", "binary_out"), TRAINED_CASES,
                         ids=[f"in{'Bin' if i else 'Json'}-out{'Bin' if o else 'Json'}" for i, o in TRAINED_CASES])
def test_trained_model_equals_each_sentence_alone_on_v1(triton_client, live_server, binary_in, binary_out):
    """B texts padded into one call: each item's real positions are v1's answer for it alone (float32 rounding),
    its padded keys, query rows and positions exactly 0, its padded tokens empty."""
    text = tensor("text", np.array([s.encode() for s in SENTENCES], dtype=object), "BYTES", binary_in)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary_out)
               for name in ("attentions", "last_hidden_state", "tokens")]
    result = triton_client.infer(TRAINED, [text], outputs=outputs, parameters={"layers": "3,5", "heads": "1,11"})
    attentions, hidden = result.as_numpy("attentions"), result.as_numpy("last_hidden_state")
    tokens = [[t.decode() if isinstance(t, bytes) else t for t in row] for row in result.as_numpy("tokens")]
    n = attentions.shape[-1]
    assert attentions.dtype == hidden.dtype == np.float32
    assert attentions.shape == (3, 2, 2, n, n) and hidden.shape == (3, n, 384)
    for i, sentence in enumerate(SENTENCES):
        response = requests.post(f"{live_server}/v1/models/{TRAINED}/attention", timeout=30,
                                 json={"text": sentence, "layers": [3, 5], "heads": [1, 11]})
        alone = response.json()
        k = len(alone["tokens"])
        assert tokens[i] == alone["tokens"] + [""] * (n - k)
        weights = np.array([layer["weights"] for layer in alone["layers"]], np.float32)
        np.testing.assert_allclose(attentions[i, :, :, :k, :k], weights, rtol=0, atol=1e-6)
        output = np.array(alone["output"], np.float32)
        np.testing.assert_allclose(hidden[i, :k], output, rtol=0, atol=1e-6 * np.abs(output).max())
        assert not attentions[i, :, :, k:].any() and not attentions[i, :, :, :, k:].any() and not hidden[i, k:].any()


def test_trained_model_errors_are_protocol_errors(triton_client):
    text = tensor("text", np.array([b"fine", b"  "], dtype=object), "BYTES", True)
    with pytest.raises(InferenceServerException, match=r"\[400\] input 'text' element 1: Must hold something"):
        triton_client.infer(TRAINED, [text])
    with pytest.raises(InferenceServerException, match=r"\[400\] parameter 'layers': layer 6 is out of range"):
        triton_client.infer(TRAINED, [tensor("text", np.array([b"ok"], dtype=object), "BYTES", False)],
                            parameters={"layers": "6"})
    assert triton_client.is_server_ready()


def test_the_docs_trained_model_example_prints_what_it_shows(live_server):
    """The manual's tritonclient example of the trained model (docs/v2.md), run as written against the real
    server."""
    page = (ROOT / "docs" / "v2.md").read_text()
    start = page.index("```python\n", page.index("A trained model, two sentences in one call")) + 10
    code = page[start:page.index("```", start)]
    shown = page[page.index("```\n", page.index("prints", start + len(code))) + 4:]
    shown = shown[:shown.index("```")]
    ran = subprocess.run([sys.executable, "-c", code.replace("localhost:8000", live_server.removeprefix("http://"))],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == shown
