"""POST /v1/models/{model}/census (JSON, /v1/batch, batch jobs): the answer equals a loop over transformers'
attentions, one query row at a time (tests/unit/engine/interventions_reference.py), and the engine's per-text
censuses combined, however the texts are batched; every bad or too large request is a 4xx naming its member and the
limit, before anything is computed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import attention
from service.operations import catalogue, sizes
from service.operations import census as census_op
from service.settings import Limits, from_env
from tests.conftest import app_with, assert_problem
from tests.unit.edge.v1.test_service_models import SENTENCE, answer
from tests.unit.engine.interventions_reference import census_by_loops

MODEL = "all-minilm-l6-v2"
DECODER = "smollm2-135m-instruct"
URL = f"/v1/models/{MODEL}/census"
TEXTS = ["Short.", "The cat sat on the mat.", SENTENCE, "Commas, semicolons; and -- dashes!", "Where did it go?"]
STATISTICS = ["first", "separators", "self", "previous", "next", "punctuation", "entropy"]
# Means against the loops over transformers' attentions: measured at most 2.9e-7 (MiniLM, float32), 1.1e-15 (MiniLM,
# float64), 1.1e-6 (the decoder, whose weights agree with transformers' to 8e-6); the bounds of the engine's tests.
BOUND = {"float32": 1e-6, "float64": 1e-12}


def means(got: dict) -> dict[str, np.ndarray]:
    return {name: np.asarray(entry["mean"], np.float64) for name, entry in got["statistics"].items()}


def loops_over(attentions_of, encodings, separators: bool) -> tuple[dict, dict]:
    """Per statistic the sums and counts over every text, from transformers' attentions one row at a time."""
    sums, counts = {}, {}
    for encoding in encodings:
        marks = attention.punctuation_marks(encoding.tokens, ("##",) if separators else ())
        seps = np.array([token == "[SEP]" for token in encoding.tokens]) if separators else None
        text_sums, text_counts = census_by_loops(attentions_of(encoding.ids), marks, seps)
        for name in text_sums:
            sums[name] = sums.get(name, 0) + text_sums[name]
            counts[name] = counts.get(name, 0) + text_counts[name]
    return sums, counts


# --- the numbers ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_minilm_census_equals_a_loop_over_transformers_attentions(client, minilm, hf_bert, dtype):
    got = answer(client, {"texts": TEXTS, "dtype": dtype}, URL)
    encodings = [minilm.tokenizer.encode(text) for text in TEXTS]
    model = hf_bert[np.dtype(dtype).type]

    def attentions_of(ids):
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(ids[None]), output_attentions=True)
        return [a[0].numpy() for a in out.attentions]

    sums, counts = loops_over(attentions_of, encodings, separators=True)
    assert list(got["statistics"]) == STATISTICS
    assert got["texts"] == len(TEXTS) and got["tokens"] == sum(len(e.tokens) for e in encodings)
    assert {name: entry["count"] for name, entry in got["statistics"].items()} == counts
    assert counts["next"] == got["tokens"] - len(TEXTS)
    for name, mean in means(got).items():
        assert mean.shape == (6, 12)
        assert np.abs(mean - sums[name] / counts[name]).max() <= BOUND[dtype], name


def test_the_decoder_has_no_separators_and_equals_transformers(client, smollm, hf_smollm):
    texts = TEXTS[:3]
    got = answer(client, {"texts": texts}, f"/v1/models/{DECODER}/census")
    encodings = [smollm.tokenizer.encode(text) for text in texts]

    def attentions_of(ids):
        with torch.no_grad():
            out = hf_smollm(input_ids=torch.from_numpy(ids[None]), output_attentions=True)
        return [a[0].numpy() for a in out.attentions]

    sums, counts = loops_over(attentions_of, encodings, separators=False)
    assert list(got["statistics"]) == [name for name in STATISTICS if name != "separators"]
    assert {name: entry["count"] for name, entry in got["statistics"].items()} == counts
    for name, mean in means(got).items():
        assert mean.shape == (30, 9)
        assert np.abs(mean - sums[name] / counts[name]).max() <= 10 * BOUND["float32"], name
    assert not means(got)["next"].any()  # causal: never a weight on the next token


def engine_alone(minilm, texts: list[str]) -> attention.Census:
    """The engine's census of each text alone (no padding), combined."""
    total = None
    for text in texts:
        encoding = minilm.tokenizer.encode(text)
        seps = np.array([[token == "[SEP]" for token in encoding.tokens]])
        census = attention.head_census(minilm.bert(encoding.ids[None], dtype=np.float64).weights,
                                       attention.punctuation_marks(encoding.tokens)[None], None, seps)
        total = census if total is None else total.combined(census)
    return total


@pytest.mark.parametrize("cap", [None, 72 * 16 * 16, 72 * 3 * 16 * 16])
def test_the_census_is_the_texts_alone_combined_however_they_are_batched(client, minilm, cap):
    """The texts (4 to 16 tokens, each thrice) in one padded batch (the default limits), in batches within one
    16-token text's weights (the longest texts alone) or three times that: the census is the engine's of each text
    alone, combined."""
    texts = TEXTS * 3
    limits = Limits() if cap is None else Limits(max_weight_elements=cap)
    batches = census_op.prepare({"model": catalogue.lookup(MODEL), "texts": texts, "dtype": "float64"},
                                limits).found.batches
    assert [len(batch) for batch in batches] == {None: [15], 72 * 16 * 16: [5, 3, 1, 1, 1, 1, 1, 1, 1],
                                                 72 * 3 * 16 * 16: [9, 3, 3]}[cap]
    served = client if cap is None else app_with(limits=limits).test_client()
    got = answer(served, {"texts": texts, "dtype": "float64"}, URL)
    alone = engine_alone(minilm, texts)
    assert {name: entry["count"] for name, entry in got["statistics"].items()} == alone.counts
    for name, mean in means(got).items():
        assert np.abs(mean - alone.means[name]).max() <= 1e-12, name


def test_the_texts_are_batched_by_length_within_the_weights_and_the_hidden_numbers(minilm):
    model = catalogue.lookup(MODEL)
    lengths = [10, 3, 7, 20, 5, 7]
    limits = Limits(max_weight_elements=72 * 3 * 10 * 10)  # 3 texts of 10 tokens, 4 of 8, ...
    batches = census_op.batched(model, lengths, limits)
    assert [i for batch in batches for i in batch] == [1, 4, 2, 5, 0, 3]           # by increasing length
    for batch in batches:
        longest = lengths[batch[-1]]
        assert len(batch) == 1 or 72 * len(batch) * longest**2 <= limits.max_weight_elements
    # 4 x 7^2 = 196 <= 300, 5 x 10^2 > 300; 20 tokens alone (past the cap even alone: work() refuses it)
    assert batches == [[1, 4, 2, 5], [0], [3]]
    hidden = Limits(max_output_elements=2 * 7 * 1536)  # two texts of 7 tokens through the feed-forward
    assert census_op.batched(model, lengths, hidden) == [[1, 4], [2, 5], [0], [3]]


def test_dtype_and_decimals(client):
    full = answer(client, {"texts": TEXTS[:2], "dtype": "float64"}, URL)
    narrow = answer(client, {"texts": TEXTS[:2]}, URL)
    rounded = answer(client, {"texts": TEXTS[:2], "decimals": 2}, URL)
    for name, mean in means(full).items():
        assert np.abs(means(narrow)[name] - mean).max() < 1e-5
        float32 = [np.asarray(got["statistics"][name]["mean"], np.float32) for got in (rounded, narrow)]
        np.testing.assert_array_equal(float32[0], np.round(float32[1], 2))


# --- bad requests: 4xx with pointers, before computing -------------------------------------------------------------

@pytest.mark.parametrize(("body", "pointer"), [
    ({}, "/texts"),
    ({"texts": []}, "/texts"),
    ({"texts": "a text"}, "/texts"),
    ({"texts": ["fine", 3]}, "/texts/1"),
    ({"texts": ["fine", None]}, "/texts/1"),
    ({"texts": ["fine", "", "also fine"]}, "/texts/1"),
    ({"texts": ["fine"], "dtype": "float16"}, "/dtype"),
    ({"texts": ["fine"], "decimals": "2"}, "/decimals"),
    ({"texts": ["fine"], "layers": [0]}, "/layers"),  # not a census's member: every layer and head is counted
])
def test_a_malformed_request_is_a_422_at_its_member(client, never_computed, body, pointer):
    assert_problem(client.post(URL, json=body), 422, pointer)


def test_every_empty_text_is_named(client, never_computed):
    problem = assert_problem(client.post(URL, json={"texts": ["fine", "", "also fine", " \t\n"]}), 422,
                             "/texts/1", "/texts/3")
    assert "whitespace" in problem["errors"][0]["detail"]


def test_an_unknown_model_is_a_404_before_the_body_is_read(client, never_computed):
    problem = assert_problem(client.post("/v1/models/nope/census", json={"texts": 5}), 404)
    assert problem["known"] == [MODEL, DECODER]


def test_max_census_texts_is_served_a_setting_and_its_boundary_is_allowed(client, never_computed, environ):
    assert Limits().max_census_texts == 64 and client.get("/v1/limits").get_json()["max_census_texts"] == 64
    environ.setenv("ATTENTION_MAX_CENSUS_TEXTS", "7")
    assert from_env().limits.max_census_texts == 7
    problem = assert_problem(client.post(URL, json={"texts": ["a"] * 65}), 422, "/texts")
    assert problem["limit"] == {"name": "max_census_texts", "maximum": 64, "value": 65}


def test_max_census_texts_boundary(minilm):
    small = app_with(limits=Limits(max_census_texts=2)).test_client()
    assert answer(small, {"texts": ["one", "two"]}, URL)["texts"] == 2
    problem = assert_problem(small.post(URL, json={"texts": ["one", "two", "three"]}), 422, "/texts")
    assert problem["limit"] == {"name": "max_census_texts", "maximum": 2, "value": 3}


@pytest.mark.parametrize(("limits", "texts", "name", "pointer"), [
    ({"max_text_chars": 20}, ["short", "x" * 21], "max_text_chars", "/texts/1"),
    ({}, ["short", "word " * 600], "max_positions", "/texts/1"),          # 602 tokens, past MiniLM's 512
    ({"max_sequence_length": 8}, ["short", SENTENCE, "ok"], "max_sequence_length", "/texts/1"),
    ({}, ["short", "ok", "word " * 200], "max_weight_elements", "/texts/2"),   # 6 x 12 x 202^2 weights at once
])
def test_a_text_too_long_is_refused_at_its_pointer_naming_the_limit(never_computed, limits, texts, name, pointer):
    client = app_with(limits=Limits(**limits)).test_client()
    problem = assert_problem(client.post(URL, json={"texts": texts}), 422, pointer)
    assert problem["limit"]["name"] == name
    if name == "max_weight_elements":
        assert problem["limit"]["value"] == 6 * 12 * 202**2
        assert "6 x 12 x 202^2" in problem["errors"][0]["detail"]


def test_a_text_of_only_specials_is_refused(client, never_computed):
    assert_problem(client.post(URL, json={"texts": ["fine", "\x07"]}), 422, "/texts/1")


# --- the size model, /v1/batch and the batch jobs -------------------------------------------------------------------

def test_the_work_counts_every_batch_and_checks_the_largest(minilm):
    model = catalogue.lookup(MODEL)
    limits = Limits(max_weight_elements=72 * 2 * 15 * 15)
    prepared = census_op.prepare({"model": model, "texts": TEXTS * 2, "dtype": "float32"}, limits)
    found = prepared.found
    lengths = [len(e.tokens) for e in found.encodings]
    shapes = [(len(batch), max(lengths[i] for i in batch)) for batch in found.batches]
    assert len(shapes) > 1 and sorted(i for batch in found.batches for i in batch) == list(range(10))
    work = prepared.work
    assert work.weights == max(72 * b * n * n for b, n in shapes) <= limits.max_weight_elements
    computed = sum(a.size * a.arrays * a.repeat for a in work.along if not a.returned)
    assert work.weights + computed == sum(72 * b * n * n + 6 * b * n * 1536 for b, n in shapes)
    assert work.macs == sum(b * n for b, n in shapes) * 6 * (4 * 384**2 + 2 * 384 * 1536)
    assert sizes.cost(work) > sizes.cost(census_op.prepare({"model": model, "texts": TEXTS[:1],
                                                             "dtype": "float32"}, limits).work)


def test_a_census_item_of_a_batch_answers_as_its_endpoint_and_counts_in_the_budget(client):
    bodies = [{"texts": TEXTS, "decimals": 4}, {"texts": ["a"] * 65}, {"texts": TEXTS[:2]}]
    items = [{"id": str(i), "op": "census", "body": {**body, "model": model}}
             for i, (body, model) in enumerate(zip(bodies, [MODEL, MODEL, DECODER], strict=True))]
    responses = client.post("/v1/batch", json={"requests": items}).get_json()["responses"]
    assert responses[0] == {"id": "0", "status": 200, "body": answer(client, bodies[0], URL)}
    assert responses[1]["status"] == 422 and responses[1]["error"]["limit"]["name"] == "max_census_texts"
    assert [e["pointer"] for e in responses[1]["error"]["errors"]] == ["/requests/1/body/texts"]
    assert responses[2]["body"] == answer(client, bodies[2], f"/v1/models/{DECODER}/census")
    tight = app_with(limits=Limits(max_batch_elements=1000)).test_client()
    problem = assert_problem(tight.post("/v1/batch", json={"requests": items[:1]}), 413, "/requests/0")
    assert problem["limit"]["name"] == "max_batch_elements"


def test_the_limits_list_max_census_texts(client):
    assert client.get("/v1/limits").get_json() == dataclasses.asdict(Limits())
    assert "max_census_texts" in dataclasses.asdict(Limits())


DOCS_TEXTS = ["The animal didn't cross the street because it was too tired.", "The cat sat on the mat.",
              "Where did it go?", "It rained all day, so we stayed in and read.",
              "She said: \"Call me tomorrow, please!\"", "Paris is the capital of France.",
              "After the meeting, the team went home.", "A bird in the hand is worth two in the bush."]


def test_the_docs_minilm_census(client):
    """docs/census.md's figures, as the service computes them."""
    got = answer(client, {"texts": DOCS_TEXTS}, URL)
    m = means(got)
    assert got["tokens"] == 93 and got["statistics"]["previous"]["count"] == 85
    assert round(m["first"].mean(), 2) == 0.50 and (m["first"] > 0.5).sum() == 36
    assert [round(m["first"][layer, head], 3) for layer, head in ((2, 9), (2, 7), (4, 5))] == [0.875, 0.868, 0.857]
    assert round(m["first"][0].mean(), 2) == 0.25
    assert round(m["separators"].mean(), 3) == 0.041
    assert np.unravel_index(m["separators"].argmax(), (6, 12)) == (0, 0)
    assert [round(m["separators"][0, head], 3) for head in (0, 5, 3)] == [0.177, 0.158, 0.152]
    assert round(m["previous"][0, 2], 4) == 0.9998 and round(m["entropy"][0, 2], 4) == 0.0014
    assert round(m["previous"][2, 11], 3) == 0.432 and round(m["previous"][1, 9], 3) == 0.376
    assert np.unravel_index(m["next"].argmax(), (6, 12)) == (1, 8) and round(m["next"][1, 8], 3) == 0.634
    assert round(m["self"].max(), 3) == 0.196 and np.unravel_index(m["self"].argmax(), (6, 12)) == (0, 8)
    assert round(m["punctuation"][3, 11], 3) == 0.290 == round(m["punctuation"].max(), 3)
    assert round(m["punctuation"].mean(), 3) == 0.080
    assert round(m["entropy"].mean(), 2) == 1.41 and round(m["entropy"][0].mean(), 2) == 1.86
    assert round(m["entropy"][0, 0], 2) == 2.21
    decoder = means(answer(client, {"texts": DOCS_TEXTS}, f"/v1/models/{DECODER}/census"))
    assert round(decoder["first"].mean(), 2) == 0.68 and (decoder["first"] > 0.5).sum() == 219
