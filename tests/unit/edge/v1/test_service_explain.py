"""POST /v1/models/{model}/explain (rollout, flow, norms; JSON, SVG, /v1/batch) and /v1/encoder's methods: the
answers equal the engine's (attention/analyses.py, whose own tests hold it to the definitions), and every bad or
too large request is a 422 naming its member and the limit, before anything is computed."""

from __future__ import annotations

import numpy as np
import pytest

import attention
from service.operations import analyses as explain_op
from service.operations import catalogue, sizes
from service.operations.registry import OPERATIONS
from service.settings import Limits
from tests.conftest import app_with, assert_problem
from tests.unit.edge.v1.test_service_models import SENTENCE, answer
from tests.unit.operations.test_heatmap import SVG_NS, cells, parse

MODEL = "all-minilm-l6-v2"
DECODER = "smollm2-135m-instruct"
URL = f"/v1/models/{MODEL}/explain"
EVERY = ["rollout", "flow", "norms"]


def engine_run(minilm: attention.Pretrained, text: str, pair: str | None = None, dtype: type = np.float32):
    """The engine's own analyses of the text, on a load of the folder apart from the service's."""
    encoding = minilm.tokenizer.encode(text, pair)
    out = minilm.bert(encoding.ids[None], encoding.type_ids[None], dtype=dtype, norms_of=None)
    return encoding, out, attention.rollout(out.weights), attention.flow(out.weights)


def as_array(value: list, dtype: str) -> np.ndarray:
    """A JSON array back in the answer's precision (orjson writes float32 values by their own shortest text)."""
    return np.asarray(value, dtype=dtype)


# --- the numbers --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("text", "pair"), [(SENTENCE, None), ("Where did it stop?", "At the kerb.")])
def test_every_method_equals_the_engine_on_minilm(client, minilm, dtype, text, pair):
    body = {"text": text, "methods": EVERY, "dtype": dtype, "return_weights": True}
    got = answer(client, {**body, "text_pair": pair} if pair else body, URL)
    encoding, out, rolled, flows = engine_run(minilm, text, pair, np.dtype(dtype).type)
    assert got["tokens"] == encoding.tokens and got["token_ids"] == encoding.ids.tolist()
    assert [entry["layer"] for entry in got["rollout"]] == [entry["layer"] for entry in got["norms"]] == list(range(6))
    for layer, entry in enumerate(got["rollout"]):
        np.testing.assert_array_equal(as_array(entry["values"], dtype), rolled[layer][0])
        np.testing.assert_allclose(as_array(entry["values"], dtype).sum(axis=-1), 1, atol=1e-5)  # a distribution
    flow = as_array(got["flow"], dtype)
    np.testing.assert_array_equal(flow, flows[0])
    assert flow.min() >= 0 and flow.max() <= 1
    for layer, entry in enumerate(got["norms"]):
        assert entry["heads"] == list(range(12))
        np.testing.assert_array_equal(as_array(entry["head_norms"], dtype), out.norms[layer].heads[0])
        np.testing.assert_array_equal(as_array(entry["layer_norms"], dtype), out.norms[layer].layer[0])
        np.testing.assert_array_equal(as_array(entry["weights"], dtype), out.weights[layer][0])


def test_layers_and_heads_select_what_comes_back_not_what_is_computed(client):
    full = answer(client, {"text": SENTENCE, "methods": ["rollout", "norms"]}, URL)
    got = answer(client, {"text": SENTENCE, "methods": ["norms", "rollout"], "layers": [4, 1], "heads": [11, 3]},
                 URL)
    assert set(got) == {"tokens", "token_ids", "rollout", "norms"}
    assert [entry["layer"] for entry in got["rollout"]] == [entry["layer"] for entry in got["norms"]] == [1, 4]
    for entry in got["rollout"]:  # after layer 4: every earlier layer still counts
        assert entry["values"] == full["rollout"][entry["layer"]]["values"]
    for entry in got["norms"]:
        whole = full["norms"][entry["layer"]]
        assert entry["heads"] == [3, 11] and "weights" not in entry
        assert entry["head_norms"] == [whole["head_norms"][3], whole["head_norms"][11]]
        assert entry["layer_norms"] == whole["layer_norms"]  # the layer's: every head, whichever are returned


def test_a_head_can_weigh_sep_heavily_and_move_little_from_it(client):
    """The docs' example (docs/analyses.md), as the service computes it: layer 0, head 3 of "the cat sat on the mat"
    gives [SEP] 26% of its weights ([CLS]'s row 0.79) but 11% of what it moves: ||f(x_[SEP])|| is 0.78, the other
    tokens' 1.87 to 2.53."""
    got = answer(client, {"text": "the cat sat on the mat", "methods": ["norms"], "layers": [0], "heads": [3],
                          "return_weights": True, "dtype": "float64"}, URL)
    weights = np.asarray(got["norms"][0]["weights"][0])                    # (n, n)
    norms = np.asarray(got["norms"][0]["head_norms"][0])                   # (n, n)
    assert got["tokens"][-1] == "[SEP]"
    assert weights[:, -1].sum() / weights.sum() > 0.26 and weights[0, -1] > 0.78
    assert norms[:, -1].sum() / norms.sum() < 0.12
    sizes = norms[0] / weights[0]                                          # ||f(x_j)||: norm per unit of weight
    assert sizes[-1] < 0.8 < 1.8 < sizes[:-1].min()


def test_the_decoder_reads_a_chat_and_a_text_and_every_method_is_causal(client, smollm):
    url = f"/v1/models/{DECODER}/explain"
    chat = [{"role": "user", "content": "Name a prime."}]
    got = answer(client, {"messages": chat, "methods": ["rollout", "norms"], "layers": [0, 29], "heads": [0, 8]},
                 url)
    ids = smollm.tokenizer.encode_chat(chat).ids
    out = smollm.llama(ids[None], logits=None, norms_of=[0, 29])
    rolled = attention.rollout(out.weights, layers=[0, 29])
    for entry, norms in zip(got["rollout"], got["norms"], strict=True):
        layer = entry["layer"]
        np.testing.assert_array_equal(as_array(entry["values"], "float32"), rolled[layer][0])
        np.testing.assert_array_equal(as_array(norms["head_norms"], "float32"), out.norms[layer].heads[0][[0, 8]])
        np.testing.assert_array_equal(as_array(norms["layer_norms"], "float32"), out.norms[layer].layer[0])
        for values in (entry["values"], norms["layer_norms"], *norms["head_norms"]):
            assert not np.triu(np.asarray(values), 1).any()  # nothing after the query, exactly
    text = answer(client, {"text": "The cat sat.", "methods": ["flow"]}, url)
    ids = smollm.tokenizer.encode("The cat sat.").ids
    flows = attention.flow(smollm.llama(ids[None], logits=None).weights)
    np.testing.assert_array_equal(as_array(text["flow"], "float32"), flows[0])
    assert not np.triu(np.asarray(text["flow"]), 1).any()


# --- refused: the request's form ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "pointers"), [
    ({"text": "hi", "methods": ["attention"]}, ["/methods/0"]),          # unknown
    ({"text": "hi", "methods": ["rollout", "rollout"]}, ["/methods/1"]),
    ({"text": "hi", "methods": []}, ["/methods"]),
    ({"text": "hi", "methods": "rollout"}, ["/methods"]),
    ({"text": "hi"}, ["/methods"]),
    ({"text": "hi", "methods": ["flow"], "heads": [0]}, ["/heads"]),      # selects nothing asked for
    ({"text": "hi", "methods": ["flow"], "layers": [0]}, ["/layers"]),
    ({"text": "hi", "methods": ["rollout"], "return_weights": True}, ["/return_weights"]),
    ({"text": "hi", "methods": ["norms"], "heads": [12]}, ["/heads/0"]),  # past the model
    ({"text": "hi", "methods": ["rollout"], "layers": [6]}, ["/layers/0"]),
    ({"text": "hi", "methods": ["rollout"], "messages": [{"role": "user", "content": "hi"}]}, ["/messages"]),
    ({"messages": [{"role": "user", "content": "hi"}], "methods": ["rollout"]}, ["/messages"]),  # an encoder
    ({"text": "hi", "methods": ["rollout"], "trace": True}, ["/trace"]),
])
def test_a_bad_request_is_a_422_at_its_member(client, never_computed, body, pointers):
    assert_problem(client.post(URL, json=body), 422, *pointers)


def test_a_pair_to_the_decoder_is_a_422_naming_its_architecture(client, never_computed):
    body = assert_problem(client.post(f"/v1/models/{DECODER}/explain",
                                      json={"text": "a", "text_pair": "b", "methods": ["rollout"]}), 422, "/text_pair")
    assert "decoder" in body["detail"]


def test_an_unknown_model_is_a_404(client):
    assert_problem(client.post("/v1/models/nope/explain", json={"text": "hi", "methods": ["flow"]}), 404)


# --- refused: the limits, before computing ------------------------------------------------------------------------

def test_flow_past_max_flow_tokens_is_a_422_naming_the_input_the_method_and_the_limit(client, never_computed):
    assert Limits().max_flow_tokens == 32
    assert client.get("/v1/limits").get_json()["max_flow_tokens"] == 32
    body = assert_problem(client.post(URL, json={"text": SENTENCE * 3, "methods": ["rollout", "flow"]}), 422,
                          "/text", "/methods/1")
    assert body["limit"]["name"] == "max_flow_tokens" and body["limit"]["maximum"] == 32
    assert body["limit"]["value"] > 32


def test_max_flow_tokens_is_a_setting_and_its_boundary_is_allowed(never_computed, monkeypatch):
    client = app_with(limits=Limits(max_flow_tokens=4)).test_client()
    assert client.get("/v1/limits").get_json()["max_flow_tokens"] == 4
    refused = assert_problem(client.post(URL, json={"text": "the dog ate", "methods": ["flow"]}), 422,
                             "/text", "/methods/0")
    assert refused["limit"] == {"name": "max_flow_tokens", "maximum": 4, "value": 5}
    assert_problem(client.post(URL, json={"messages": [{"role": "user", "content": "hi"}], "methods": ["flow"]}),
                   422, "/messages")  # an encoder reads no chat: the form first
    monkeypatch.undo()
    assert len(answer(client, {"text": "the dog", "methods": ["flow"]}, URL)["flow"]) == 4  # [CLS] the dog [SEP]


def test_the_size_model_counts_what_each_method_returns(never_computed, monkeypatch):
    """"the dog ate": 5 tokens, MiniLM 6 layers x 12 heads. Held weights 72 * 25 = 1800; rollout returns 6 * 25
    more (1950 in all), norms 6 * 13 * 25 (3750), norms of one layer and head 2 * 25 (1850)."""
    limits = Limits(max_weight_elements=2000)
    assert explain_op.maps(["rollout"], 5, 6, 12) == 150 and explain_op.maps(["norms"], 5, 6, 12) == 1950
    client = app_with(limits=limits).test_client()
    refused = assert_problem(client.post(URL, json={"text": "the dog ate", "methods": ["norms"]}), 422,
                             "/methods", "/layers", "/heads")
    assert refused["limit"] == {"name": "max_weight_elements", "maximum": 2000, "value": 3750}
    monkeypatch.undo()
    for body in ({"methods": ["rollout"]}, {"methods": ["norms"], "layers": [0], "heads": [0]}):
        assert answer(client, {"text": "the dog ate", **body}, URL)


def test_flow_counts_its_edges_in_a_batchs_budget():
    """Flow visits the L n^2 edges once per pair of tokens: L n^4 * FLOW_MACS_PER_EDGE multiply-adds; with the
    default max_batch_elements, a batch holds 4 MiniLM flows of 32 tokens and refuses 5 (413) before computing."""
    operation = OPERATIONS["model-explain"]

    def work(methods: list[str]) -> sizes.Work:
        params = operation.resolved({**operation.request().load({"text": "the dog ate", "methods": methods}),
                                     "model": MODEL})
        return operation.prepare(params, Limits()).work

    assert work(["rollout", "flow"]).macs - work(["rollout"]).macs == explain_op.FLOW_MACS_PER_EDGE * 6 * 5**4
    client = app_with().test_client()
    text = " ".join(["word"] * 30)  # [CLS], 30 words, [SEP]: 32 tokens
    for count, status in ((5, 413), (4, 200)):
        items = [{"id": str(i), "op": "model-explain", "body": {"model": MODEL, "text": text, "methods": ["flow"]}}
                 for i in range(count)]
        response = client.post("/v1/batch", json={"requests": items})
        assert response.status_code == status, response.get_data(as_text=True)
    assert {item["status"] for item in response.get_json()["responses"]} == {200}


def test_the_picture_past_max_heatmap_cells_is_a_422_at_format(never_computed):
    client = app_with(limits=Limits(max_heatmap_cells=100)).test_client()
    body = {"text": "the dog ate", "methods": ["rollout"]}  # 6 panels of 5 x 5: 150 cells
    refused = assert_problem(client.post(URL + "?format=svg", json=body), 422, "format")
    assert refused["limit"] == {"name": "max_heatmap_cells", "maximum": 100, "value": 150}


# --- the picture --------------------------------------------------------------------------------------------------

def test_the_picture_draws_rollout_flow_and_each_head_beside_its_norms_on_a_scale_each(client):
    body = {"text": "the dog ate", "methods": EVERY, "layers": [0, 5], "heads": [3]}
    svg = client.post(URL + "?format=svg", json=body)
    assert svg.status_code == 200 and svg.mimetype == "image/svg+xml"
    assert client.post(URL, json=body, headers={"Accept": "image/svg+xml"}).data == svg.data
    root = parse(svg.get_data(as_text=True))
    got = answer(client, {**body, "return_weights": True}, URL)
    norms = [entry["head_norms"] for entry in got["norms"]]
    expected = [[entry["values"] for entry in got["rollout"]], [got["flow"]],
                [entry["weights"] for entry in got["norms"]], norms]
    values = [float(cell.get("data-value")) for cell in cells(root)]
    assert values == list(np.concatenate([np.ravel(np.asarray(part, dtype=np.float32)) for part in expected]))
    legends = [[t.text for t in g.iter(SVG_NS + "text")] for g in root.iter(SVG_NS + "g") if g.get("class") == "legend"]
    headings = ["weight, fixed scale 0 to 1", "flow, fixed scale 0 to 1", "weight, fixed scale 0 to 1",
                f"scale 0 to the picture's largest norm, {np.max(norms):.3g}"]  # the norms' own scale
    assert len(legends) == len(headings)
    for legend, heading in zip(legends, headings, strict=True):  # its heading wrapped over lines, then its ticks
        assert " ".join(legend).startswith(heading)
    ids = [element.get("id") for element in root.iter() if element.get("id")]
    assert sorted(ids) == ["masked", "scale"]  # the nested pictures share one set of definitions


# --- /v1/batch and the toy encoder --------------------------------------------------------------------------------

def test_an_explain_item_of_a_batch_answers_as_its_endpoint(client):
    bodies = [{"text": "the dog ate", "methods": EVERY, "decimals": 4}, {"text": SENTENCE * 3, "methods": ["flow"]}]
    items = [{"id": str(i), "op": "model-explain", "body": {**body, "model": MODEL}} for i, body in enumerate(bodies)]
    responses = client.post("/v1/batch", json={"requests": items}).get_json()["responses"]
    assert responses[0] == {"id": "0", "status": 200, "body": answer(client, bodies[0], URL)}
    assert responses[1]["status"] == 422
    assert responses[1]["error"]["limit"]["name"] == "max_flow_tokens"
    assert [e["pointer"] for e in responses[1]["error"]["errors"]] == ["/requests/1/body/text",
                                                                       "/requests/1/body/methods/0"]


def test_the_toy_encoder_adds_rollout_and_norms_as_the_engine_computes_them(client):
    x = np.random.default_rng(7).normal(size=(2, 4, 8))
    body = {"embeddings": x.tolist(), "n_heads": 2, "n_layers": 3, "seed": 5, "causal": True}
    plain = client.post("/v1/encoder", json=body).get_json()
    got = client.post("/v1/encoder", json={**body, "methods": ["norms", "rollout"]}).get_json()
    assert {key: got[key] for key in plain} == plain  # methods add members, change none
    out = attention.Encoder(8, 2, 3, None, 5).with_norms(x, causal=True)
    rolled = attention.rollout(out.weights)
    assert [entry["layer"] for entry in got["rollout"]] == [entry["layer"] for entry in got["norms"]] == [0, 1, 2]
    for layer, (entry, norms) in enumerate(zip(got["rollout"], got["norms"], strict=True)):
        np.testing.assert_array_equal(entry["values"], rolled[layer])                 # (2, 4, 4)
        assert norms["heads"] == [0, 1]
        np.testing.assert_array_equal(norms["head_norms"], out.norms[layer].heads)    # (2, 2, 4, 4)
        np.testing.assert_array_equal(norms["layer_norms"], out.norms[layer].layer)   # (2, 4, 4)


@pytest.mark.parametrize(("body", "pointer"), [
    ({"methods": ["flow"]}, "/methods/0"),                 # a method that does not apply
    ({"methods": ["rollout", "norms", "rollout"]}, "/methods/2"),
    ({"methods": ["norms"], "trace": True}, "/methods"),
    ({"methods": ["saliency"]}, "/methods/0"),
])
def test_the_toy_encoder_refuses_what_it_does_not_offer(client, body, pointer):
    refused = assert_problem(client.post("/v1/encoder", json={"tokens": ["cat", "ate"], "n_heads": 2, **body}), 422,
                             pointer)
    if body["methods"] == ["flow"]:
        assert "does not apply" in refused["errors"][0]["detail"]


def test_the_toy_encoders_maps_count_against_max_weight_elements():
    """2 tokens, 2 heads, 6 layers: 48 weights; rollout 24 more, norms 72 more."""
    client = app_with(limits=Limits(max_weight_elements=100)).test_client()
    body = {"tokens": ["cat", "ate"], "n_heads": 2}
    assert client.post("/v1/encoder", json={**body, "methods": ["rollout"]}).status_code == 200
    refused = assert_problem(client.post("/v1/encoder", json={**body, "methods": ["norms"]}), 422,
                             "/tokens", "/methods")
    assert refused["limit"] == {"name": "max_weight_elements", "maximum": 100, "value": 120}


def test_the_served_models_offer_explain_as_a_batch_endpoint():
    from service.jobs.endpoints import endpoints

    for name in catalogue.names():
        assert endpoints()[f"/v1/models/{name}/explain"] == ("model-explain", {"model": name})
