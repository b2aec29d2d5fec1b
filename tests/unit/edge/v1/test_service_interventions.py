"""POST /v1/models/{model}/explain's methods knockout and occlusion (service.operations.interventions): MiniLM's
against transformers with the head zeroed by a hook, the decoder's against single runs; the tables, the positions
each kind of model occludes, the pictures, /v1/batch; every bad or too large request a 422 naming its member and
the limit, before anything is computed."""

from __future__ import annotations

import numpy as np
import pytest

import attention
from service.operations import catalogue, interventions
from service.settings import Limits
from tests.conftest import app_with, assert_problem
from tests.unit.edge.v1.test_service_explain import DECODER, MODEL, URL
from tests.unit.edge.v1.test_service_models import answer
from tests.unit.engine.interventions_reference import kl_by_definition, knocked_by_hook, plain_run, shift_by_loops
from tests.unit.operations.test_heatmap import SVG_NS, cells, parse

DECODER_URL = f"/v1/models/{DECODER}/explain"
TEXT = "The cat sat on the mat."
CHAT = [{"role": "user", "content": "Name a colour."}]


def table(values: list) -> np.ndarray:
    """An (L, H) answer table as float32, null as NaN."""
    return np.array([[np.nan if v is None else v for v in row] for row in values], dtype=np.float32)


# --- the numbers --------------------------------------------------------------------------------------------------

def test_minilm_knockout_equals_transformers_with_the_head_zeroed(client, minilm, hf_bert):
    knock = [[0, 3], [2, 11], [5, 0]]
    got = answer(client, {"text": TEXT, "methods": ["knockout"], "knock": knock}, URL)["knockout"]
    assert got["heads"] == knock and set(got) == {"heads", "cosine_distance", "largest_change"}
    distance, change = table(got["cosine_distance"]), table(got["largest_change"])
    assert distance.shape == (6, 12) and np.isnan(distance).sum() == 72 - 3
    encoding = minilm.tokenizer.encode(TEXT)
    model = hf_bert[np.float32]
    full = plain_run(model, encoding.ids[None])
    for layer, head in knock:
        theirs = knocked_by_hook(model, model.encoder.layer[layer].attention.output.dense, encoding.ids[None], head, 32)
        cosine, largest = shift_by_loops(full, theirs)
        assert distance[layer, head] == pytest.approx(cosine, abs=1e-6)
        assert change[layer, head] == pytest.approx(largest, rel=1e-4, abs=1e-5)


def test_every_head_by_default_and_a_chosen_head_answers_as_in_the_whole_table(client):
    every = answer(client, {"text": TEXT, "methods": ["knockout"]}, URL)["knockout"]
    assert every["heads"] == [[layer, head] for layer in range(6) for head in range(12)]
    assert not np.isnan(table(every["cosine_distance"])).any()
    one = answer(client, {"text": TEXT, "methods": ["knockout"], "knock": [[4, 7]]}, URL)["knockout"]
    assert one["cosine_distance"][4][7] == every["cosine_distance"][4][7]
    assert one["largest_change"][4][7] == every["largest_change"][4][7]


def test_minilm_occlusion_masks_each_word_piece_and_equals_a_run_of_the_masked_text(client, minilm):
    got = answer(client, {"text": TEXT, "methods": ["occlusion"], "dtype": "float64"}, URL)
    encoding = minilm.tokenizer.encode(TEXT)
    assert got["occlusion"]["positions"] == list(range(1, len(encoding.tokens) - 1))  # not [CLS], not [SEP]
    full = minilm.bert(encoding.ids[None], encoding.type_ids[None], dtype=np.float64).output[0]
    mask = minilm.tokenizer.token_id("[MASK]")
    for i, position in enumerate(got["occlusion"]["positions"]):
        ids = encoding.ids.copy()
        ids[position] = mask
        run = minilm.bert(ids[None], encoding.type_ids[None], dtype=np.float64).output[0]
        cosine, largest = shift_by_loops(full, run)
        assert got["occlusion"]["cosine_distance"][i] == pytest.approx(cosine, abs=1e-12)
        assert got["occlusion"]["largest_change"][i] == pytest.approx(largest, rel=1e-10)


def test_decoder_knockout_and_occlusion_equal_single_runs(client, smollm):
    knock = [[0, 0], [17, 4], [29, 8]]
    got = answer(client, {"text": "The capital of France is", "methods": ["knockout", "occlusion"],
                          "knock": knock, "dtype": "float64"}, DECODER_URL)
    ids = smollm.tokenizer.encode("The capital of France is").ids
    full = smollm.llama(ids[None], dtype=np.float64, return_weights=False).logits[0]
    top = int(full.argmax())
    assert got["knockout"]["next_token"] == got["occlusion"]["next_token"] == {
        "id": top, "token": smollm.tokenizer.decode([top])}
    runs = smollm.llama.knockout(ids[None], knock, dtype=np.float64)[1:]  # the engine's, proven by its own tests
    for (layer, head), run in zip(knock, runs, strict=True):
        assert got["knockout"]["kl"][layer][head] == pytest.approx(kl_by_definition(full, run), abs=1e-10)
        assert got["knockout"]["top_changed"][layer][head] == (int(run.argmax()) != top)
    assert got["knockout"]["top_changed"][1][1] is None  # not knocked out
    assert got["occlusion"]["positions"] == [0, 1, 2, 3]  # every token but the last, which predicts
    for i, position in enumerate(got["occlusion"]["positions"]):
        shorter = np.delete(ids, position)
        run = smollm.llama(shorter[None], dtype=np.float64, return_weights=False).logits[0]
        assert got["occlusion"]["kl"][i] == pytest.approx(kl_by_definition(full, run), abs=1e-10)
        assert got["occlusion"]["top_changed"][i] == (int(run.argmax()) != top)


def test_a_chats_occlusion_removes_only_the_users_words(client, smollm):
    got = answer(client, {"messages": CHAT, "methods": ["occlusion"]}, DECODER_URL)
    occluded = "".join(got["tokens"][p] for p in got["occlusion"]["positions"])
    assert occluded == "Name a colour."
    assert got["occlusion"]["positions"] == smollm.tokenizer.chat_positions(CHAT).tolist()


def test_knockout_beside_the_analyses_changes_none_of_them(client):
    alone = answer(client, {"text": TEXT, "methods": ["rollout"]}, URL)
    both = answer(client, {"text": TEXT, "methods": ["rollout", "knockout"], "knock": [[1, 1]]}, URL)
    assert both["rollout"] == alone["rollout"] and both["knockout"]["heads"] == [[1, 1]]


# --- refused ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "pointers"), [
    ({"methods": ["knockout"], "knock": [[6, 0]]}, ["/knock/0"]),               # past the model's layers
    ({"methods": ["knockout"], "knock": [[0, 0], [0, 12]]}, ["/knock/1"]),      # past its heads
    ({"methods": ["knockout"], "knock": [[0, 1], [0, 1]]}, ["/knock/1"]),       # repeated
    ({"methods": ["knockout"], "knock": [[0]]}, ["/knock/0"]),
    ({"methods": ["knockout"], "knock": [[0, 1, 2]]}, ["/knock/0"]),
    ({"methods": ["knockout"], "knock": [[-1, 0]]}, ["/knock/0/0"]),
    ({"methods": ["knockout"], "knock": [[True, 0]]}, ["/knock/0/0"]),
    ({"methods": ["knockout"], "knock": [["0", 1]]}, ["/knock/0/0"]),
    ({"methods": ["knockout"], "knock": []}, ["/knock"]),
    ({"methods": ["knockout"], "knock": [0, 1]}, ["/knock/0", "/knock/1"]),
    ({"methods": ["occlusion"], "knock": [[0, 1]]}, ["/knock"]),                # selects nothing asked for
    ({"methods": ["knockout"], "heads": [0]}, ["/heads"]),
    ({"methods": ["knockout", "knockout"]}, ["/methods/1"]),
])
def test_a_bad_request_is_a_422_at_its_member(client, never_computed, body, pointers):
    assert_problem(client.post(URL, json={"text": TEXT, **body}), 422, *pointers)


def test_a_one_token_prompt_has_nothing_to_occlude(client, never_computed):
    body = {"text": "Hello", "methods": ["rollout", "occlusion"]}
    refused = assert_problem(client.post(DECODER_URL, json=body), 422, "/methods/1")
    assert "has none" in refused["detail"]


def test_the_toy_encoder_offers_no_intervention(client):
    body = {"embeddings": [[[0.0, 1.0], [1.0, 0.0]]], "n_heads": 1, "methods": ["knockout"]}
    assert_problem(client.post("/v1/encoder", json=body), 422, "/methods/0")


def test_max_knockouts_counts_the_heads_and_names_knock(never_computed):
    client = app_with(limits=Limits(max_knockouts=71)).test_client()
    assert client.get("/v1/limits").get_json()["max_knockouts"] == 71
    every = assert_problem(client.post(URL, json={"text": TEXT, "methods": ["rollout", "knockout"]}), 422,
                           "/methods/1", "/knock")
    assert every["limit"] == {"name": "max_knockouts", "maximum": 71, "value": 72}
    listed = [[layer, head] for layer in range(6) for head in range(12)]
    refused = assert_problem(client.post(URL, json={"text": TEXT, "methods": ["knockout"], "knock": listed}), 422,
                             "/knock")
    assert refused["limit"]["value"] == 72


def test_max_rerun_tokens_counts_each_run_and_its_boundary_is_allowed(monkeypatch, never_computed):
    """"The cat sat on the mat." is 9 MiniLM tokens: the full run 9 x 6 tokens through a layer, a knockout of a
    head of layer 4 re-runs layers 4 and 5 (18), an occlusion all six for the 9 tokens (54) per occluded token (7)."""
    assert Limits().max_rerun_tokens == 3 * 2**16
    runs = interventions.Plan([(4, 0), (4, 1)], np.arange(1, 8), 103)
    client = app_with(limits=Limits(max_rerun_tokens=54 + 2 * 18 + 54 + 7 * 54 - 1)).test_client()
    body = {"text": TEXT, "methods": ["knockout", "occlusion"], "knock": [[4, 0], [4, 1]]}
    refused = assert_problem(client.post(URL, json=body), 422, "/text", "/knock", "/methods/1")
    assert refused["limit"] == {"name": "max_rerun_tokens", "maximum": 521, "value": 522}
    assert interventions.rerun_tokens(catalogue.lookup(MODEL), 9, runs) == 522
    monkeypatch.undo()
    wider = app_with(limits=Limits(max_rerun_tokens=522)).test_client()
    assert answer(wider, body, URL)["occlusion"]["positions"] == list(range(1, 8))


def test_a_decoders_logits_count_in_its_reruns(never_computed):
    """SmolLM2 (30 layers, d_model 576, vocabulary 49,152): each run's next-token logits count as
    576 * 49152 / a token's multiply-adds in a layer (2 * 576^2 + 2 * 576 * 192 + 3 * 576 * 1536) = 8 tokens
    through a layer."""
    client = app_with(limits=Limits(max_rerun_tokens=1)).test_client()
    refused = assert_problem(client.post(DECODER_URL, json={"text": "Hello world", "methods": ["knockout"],
                                                            "knock": [[29, 0]]}), 422, "/text", "/knock")
    assert refused["limit"]["value"] == (2 * 30 + 8) + (2 * 1 + 8)  # the full run, then layer 29 again


# --- the picture and /v1/batch ------------------------------------------------------------------------------------

def test_the_picture_draws_knockout_as_a_table_and_occlusion_as_bars(client):
    body = {"text": TEXT, "methods": ["knockout", "occlusion"], "knock": [[0, 1], [5, 11]]}
    svg = client.post(URL + "?format=svg", json=body)
    assert svg.status_code == 200 and svg.mimetype == "image/svg+xml"
    root = parse(svg.get_data(as_text=True))
    got = answer(client, body, URL)
    drawn = cells(root)
    assert len(drawn) == 72
    hatched = [(int(c.get("data-row")), int(c.get("data-col"))) for c in drawn if "masked" in c.get("class")]
    assert len(hatched) == 70 and (0, 1) not in hatched and (5, 11) not in hatched
    shown = {(int(c.get("data-row")), int(c.get("data-col"))): c.get("data-value") for c in drawn}
    assert float(shown[5, 11]) == np.float32(got["knockout"]["cosine_distance"][5][11])
    bars = [element for element in root.iter(SVG_NS + "rect") if element.get("class") == "bar"]
    assert [float(bar.get("data-value")) for bar in bars] == got["occlusion"]["cosine_distance"]
    titles = [bar.find(SVG_NS + "title").text for bar in bars]
    assert [title.split(":")[0] for title in titles] == [got["tokens"][p] for p in got["occlusion"]["positions"]]
    texts = " ".join(t.text or "" for t in root.iter(SVG_NS + "text"))
    assert "layers ↓" in texts and "heads →" in texts and "not knocked out" in texts


def test_the_picture_of_every_head_past_max_heatmap_cells_is_a_422_at_format(never_computed):
    client = app_with(limits=Limits(max_heatmap_cells=71)).test_client()
    refused = assert_problem(client.post(URL + "?format=svg", json={"text": TEXT, "methods": ["knockout"]}), 422,
                             "format")
    assert refused["limit"] == {"name": "max_heatmap_cells", "maximum": 71, "value": 72}


def test_a_batch_item_answers_as_the_endpoint_and_a_bad_one_spoils_none(client):
    good = {"text": TEXT, "methods": ["knockout"], "knock": [[2, 2]], "decimals": 6}
    items = [{"id": "good", "op": "model-explain", "body": {**good, "model": MODEL}},
             {"id": "bad", "op": "model-explain", "body": {"text": TEXT, "methods": ["knockout"], "knock": [[9, 9]],
                                                            "model": MODEL}}]
    responses = client.post("/v1/batch", json={"requests": items}).get_json()["responses"]
    assert responses[0] == {"id": "good", "status": 200, "body": answer(client, good, URL)}
    assert responses[1]["status"] == 422
    assert [e["pointer"] for e in responses[1]["error"]["errors"]] == ["/requests/1/body/knock/0"]


def test_the_engine_measures_are_those_answered(client, minilm):
    """The service adds nothing to the engine's numbers: the same call, the same float32 values."""
    encoding = minilm.tokenizer.encode(TEXT)
    shift = attention.encoder_knockout(minilm.bert, encoding.ids, encoding.type_ids, [[3, 3]])
    got = answer(client, {"text": TEXT, "methods": ["knockout"], "knock": [[3, 3]]}, URL)["knockout"]
    assert np.float32(got["cosine_distance"][3][3]) == shift.cosine_distance[0]
    assert np.float32(got["largest_change"][3][3]) == shift.largest_change[0]
