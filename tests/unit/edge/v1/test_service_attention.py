"""POST /v1/attention, /v1/self-attention, /v1/multi-head-attention, /v1/encoder through HTTP."""

from __future__ import annotations

import numpy as np
import pytest

import attention as engine
from service.edge.v1 import examples
from service.operations.registry import OPERATIONS
from service.settings import Limits
from tests.conftest import assert_problem

SENTENCE = ["the", "cat", "ate", "food", "it"]


def test_attention_matches_the_formula(client):
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    body = client.post("/v1/attention", json={"query": q.tolist(), "key": k.tolist(), "value": v.tolist()}).get_json()
    scores = q @ k.T / 2.0
    weights = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(body["weights"], weights, rtol=1e-12)
    np.testing.assert_allclose(body["output"], weights @ v, rtol=1e-12)
    assert "trace" not in body


def test_attention_batched_masked_scaled_with_trace(client):
    q = [[[1.0, 0.0], [0.0, 1.0]]] * 2
    mask = [[[True, False], [True, True]], [[True, True], [False, True]]]
    body = client.post("/v1/attention", json={"query": q, "key": q, "value": q, "mask": mask, "scale": 2.0,
                                              "trace": True}).get_json()
    weights = np.asarray(body["weights"])
    assert weights.shape == (2, 2, 2)
    assert weights[0, 0].tolist() == [1.0, 0.0] and weights[1, 1].tolist() == [0.0, 1.0]
    e = np.exp(2.0)
    np.testing.assert_allclose(weights[0, 1], [1 / (1 + e), e / (1 + e)])
    trace = body["trace"]
    assert trace["scores"][0] == [[1.0, 0.0], [0.0, 1.0]]
    assert trace["scaled_scores"][0] == [[2.0, 0.0], [0.0, 2.0]]
    assert trace["masked_scores"][0] == [[2.0, None], [0.0, 2.0]]
    assert trace["weights"] == body["weights"]


def test_attention_options_decimals_float32_no_weights(client):
    request = {"query": [[1.0, 2.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [3.0]]}
    full = client.post("/v1/attention", json=request).get_json()
    rounded = client.post("/v1/attention", json={**request, "decimals": 2, "return_weights": False}).get_json()
    assert rounded["weights"] is None
    assert rounded["output"] == [[round(full["output"][0][0], 2)]]
    single = client.post("/v1/attention", json={**request, "dtype": "float32"}).get_json()
    assert single["output"][0][0] == pytest.approx(full["output"][0][0], rel=1e-6)
    value = single["output"][0][0]
    assert repr(value) == str(np.float32(value)) != repr(float(np.float32(value)))  # float32's shortest digits


@pytest.mark.parametrize(("dtype", "big"), [("float64", 1e300), ("float32", 1e30), ("float32", 3e38)])
def test_decimals_never_turn_a_large_finite_number_into_null(client, dtype, big):
    """np.round scales by 10**decimals: a value that large overflowed to inf and was written as null."""
    request = {"query": [[0.0, 0.0]], "key": [[0.0, 0.0]], "value": [[big, 1.0]], "dtype": dtype, "decimals": 15,
               "trace": True}
    body = client.post("/v1/attention", json=request).get_json()
    assert body["output"] == [[pytest.approx(big, rel=1e-6), 1.0]]
    assert None not in body["trace"]["masked_scores"][0]


def test_attention_causal_and_fully_masked_row(client):
    x = [[1.0], [2.0], [3.0]]
    body = client.post("/v1/attention", json={"query": x, "key": x, "value": x, "causal": True}).get_json()
    assert np.triu(np.asarray(body["weights"]), 1).tolist() == np.zeros((3, 3)).tolist()
    masked = client.post("/v1/attention", json={"query": x, "key": x, "value": x,
                                                "mask": [False, False, False]}).get_json()
    assert masked["weights"] == [[0.0] * 3] * 3 and masked["output"] == [[0.0]] * 3


def test_attention_shape_mismatch_points_at_the_argument(client):
    response = client.post("/v1/attention", json={"query": [[1.0, 2.0]], "key": [[1.0]], "value": [[1.0]]})
    assert "d_k" in assert_problem(response, 422, "/key")["detail"]


def test_self_attention_matches_seed_demo_4(client, seed_script):
    """Demo 4: SelfAttention(4, 4, seed=3) on the position-encoded sentence with a causal mask."""
    x = seed_script.embed(SENTENCE) + seed_script.positional_encoding(5, 4)
    _, expected = seed_script.SelfAttention(4, 4, seed=3)(x, mask=seed_script.causal_mask(5))
    body = client.post("/v1/self-attention", json={"tokens": SENTENCE, "seed": 3, "positional_encoding": True,
                                                   "causal": True}).get_json()
    np.testing.assert_allclose(body["weights"], expected, rtol=1e-12, atol=1e-15)


def test_self_attention_explicit_weights_and_trace(client):
    eye = np.eye(2).tolist()
    body = client.post("/v1/self-attention", json={"embeddings": [[1.0, 0.0], [0.0, 1.0]], "trace": True,
                                                   "weights": {"w_q": eye, "w_k": eye, "w_v": eye}}).get_json()
    assert body["trace"]["q"] == body["trace"]["k"] == body["trace"]["v"] == eye
    e = np.exp(1 / np.sqrt(2))
    np.testing.assert_allclose(body["weights"], [[e / (e + 1), 1 / (e + 1)], [1 / (e + 1), e / (e + 1)]])


def test_multi_head_returns_the_seed_demo_5_weights(client, seed_script):
    x = np.pad(seed_script.embed(SENTENCE), ((0, 0), (0, 4))) + seed_script.positional_encoding(5, 8)
    out, heads = seed_script.MultiHeadAttention(8, 4)(x, mask=seed_script.causal_mask(5))
    body = client.post("/v1/multi-head-attention", json={"tokens": SENTENCE, "d_model": 8, "n_heads": 4,
                                                         "positional_encoding": True, "causal": True}).get_json()
    np.testing.assert_allclose(body["weights"], np.stack(heads), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(body["output"], out, rtol=1e-12, atol=1e-15)


def test_multi_head_trace_is_per_head(client):
    body = client.post("/v1/multi-head-attention", json={"tokens": SENTENCE, "d_model": 8, "n_heads": 2,
                                                         "trace": True}).get_json()
    assert np.asarray(body["trace"]["q"]).shape == (2, 5, 4)
    assert np.asarray(body["trace"]["scores"]).shape == (2, 5, 5)
    assert body["trace"]["weights"] == body["weights"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_multi_head_trace_holds_the_weights_that_check_every_stage_by_hand(client, seed_script, dtype):
    """Q = X W_q per head and output = concat(weights @ V) W_o, from the trace alone; the weights are the seed
    script's (head i from seed i, W_o from seed 99), in the request's precision."""
    request = {"tokens": SENTENCE, "d_model": 8, "n_heads": 2, "positional_encoding": True, "trace": True,
               "dtype": dtype}
    body = client.post("/v1/multi-head-attention", json=request).get_json()
    trace = {name: np.asarray(value) for name, value in body["trace"].items()}
    x = np.asarray(client.post("/v1/embed", json={key: request[key] for key in ("tokens", "d_model",
                                                  "positional_encoding", "dtype")}).get_json()["embeddings"])
    tolerance = {"float64": 1e-12, "float32": 1e-5}[dtype]
    assert trace["w_q"].shape == trace["w_k"].shape == trace["w_v"].shape == (2, 8, 4)
    assert trace["w_o"].shape == (8, 8)
    for name in ("q", "k", "v"):
        np.testing.assert_allclose(x @ trace[f"w_{name}"], trace[name], atol=tolerance)  # (h, n, d_k)
    concat = (trace["weights"] @ trace["v"]).transpose(1, 0, 2).reshape(5, 8)           # (n, h*d_k)
    np.testing.assert_allclose(concat @ trace["w_o"], body["output"], atol=tolerance)
    reference = seed_script.MultiHeadAttention(8, 2)
    np.testing.assert_allclose(trace["w_o"], reference.W_o, atol=tolerance)


def test_a_self_attention_trace_holds_its_projections_and_no_w_o(client):
    body = client.post("/v1/self-attention", json={"tokens": SENTENCE, "d_model": 8, "d_k": 4,
                                                   "trace": True}).get_json()
    trace = body["trace"]
    assert np.asarray(trace["w_q"]).shape == (8, 4) and "w_o" not in trace
    x = np.asarray(client.post("/v1/embed", json={"tokens": SENTENCE, "d_model": 8}).get_json()["embeddings"])
    np.testing.assert_allclose(x @ np.asarray(trace["w_q"]), trace["q"], atol=1e-12)


def test_multi_head_indivisible_heads_is_422(client):
    response = client.post("/v1/multi-head-attention", json={"tokens": ["cat"], "d_model": 6, "n_heads": 4})
    body = assert_problem(response, 422, "/n_heads")
    # The field is named once: by the detail's prefix, and by the item's pointer (its detail does not repeat it).
    assert body["detail"] == "n_heads: d_model=6 must be divisible by n_heads=4"
    assert body["errors"] == [{"pointer": "/n_heads", "detail": "d_model=6 must be divisible by n_heads=4"}]


def test_encoder_layers_and_shapes(client):
    body = client.post("/v1/encoder", json={"embeddings": np.eye(4).tolist(), "n_heads": 2, "n_layers": 3,
                                            "causal": True}).get_json()
    output = np.asarray(body["output"])
    assert output.shape == (4, 4)
    np.testing.assert_allclose(output.mean(axis=-1), 0, atol=1e-9)  # ends with a layer norm
    assert len(body["layers"]) == 3
    for layer in body["layers"]:
        weights = np.asarray(layer["weights"])
        assert weights.shape == (2, 4, 4) and np.triu(weights, 1).max() == 0.0
    quiet = client.post("/v1/encoder", json={"embeddings": np.eye(4).tolist(), "n_heads": 2, "n_layers": 3,
                                             "causal": True, "return_weights": False}).get_json()
    assert quiet["layers"] == [{"weights": None}] * 3
    assert quiet["output"] == body["output"]


@pytest.mark.parametrize("batched", [False, True])
def test_encoder_takes_a_mask_per_head_as_multi_head_attention_does(client, batched):
    """(h, n, n), or (B, h, n, n) with a batch: head i of every layer attends through mask i."""
    x = np.random.default_rng(3).standard_normal((2, 3, 4) if batched else (3, 4))
    per_head = np.ones((*x.shape[:-2], 2, 3, 3), dtype=bool)
    per_head[..., 0, :, 1:] = False                                  # head 0: every query sees key 0 only
    body = client.post("/v1/encoder", json={"embeddings": x.tolist(), "n_heads": 2, "n_layers": 2,
                                            "mask": per_head.tolist()})
    assert body.status_code == 200, body.get_json()
    expected, weights = engine.Encoder(4, 2, 2)(x, mask=per_head)
    np.testing.assert_allclose(body.get_json()["output"], expected, rtol=1e-12, atol=1e-15)
    for layer, w in zip(body.get_json()["layers"], weights, strict=True):
        got = np.asarray(layer["weights"])                           # (B?, h, n, n)
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-15)
        assert (got[..., 0, :, 0] == 1.0).all() and (got[..., 0, :, 1:] == 0.0).all()
        assert (got[..., 1, :, :] > 0).all()                         # head 1: nothing masked


def test_encoder_trace_shows_every_layer_stage(client):
    request = {"tokens": SENTENCE, "d_model": 8, "n_heads": 4, "n_layers": 2, "causal": True}
    plain = client.post("/v1/encoder", json=request).get_json()
    body = client.post("/v1/encoder", json={**request, "trace": True}).get_json()
    np.testing.assert_allclose(body["output"], plain["output"], atol=1e-12)
    first, second = (layer["trace"] for layer in body["layers"])
    assert np.asarray(first["attention"]["q"]).shape == (4, 5, 2)
    assert first["attention"]["masked_scores"][0][0][1] is None             # causal: masked cells are null
    np.testing.assert_allclose(first["attention"]["weights"], plain["layers"][0]["weights"], atol=1e-12)
    np.testing.assert_allclose(second["output"], body["output"], atol=1e-12)
    assert set(first) == {"attention", "add_norm_1", "feed_forward", "output"}


def test_encoder_trace_type_is_checked(client):
    response = client.post("/v1/encoder", json={"tokens": ["cat"], "n_heads": 1, "trace": "yes"})
    assert_problem(response, 422, "/trace")


def _same_shape(dumped, result, where="") -> None:
    """``dumped`` (the schema's dump of ``result``) has the same keys and items at every level, and
    the very same arrays: the schema would drop or change nothing."""
    if isinstance(result, dict):
        assert isinstance(dumped, dict) and dumped.keys() == result.keys(), (where, dumped.keys(), result.keys())
        for key in result:
            _same_shape(dumped[key], result[key], f"{where}/{key}")
    elif isinstance(result, list):
        assert isinstance(dumped, list) and len(dumped) == len(result), where
        for i, (d, r) in enumerate(zip(dumped, result, strict=True)):
            _same_shape(d, r, f"{where}/{i}")
    else:
        assert dumped is result, where


RESPONSES = {name: operation.response for name, operation in OPERATIONS.items()}
ATTENTION_VARIANTS = [{}, {"trace": True}, {"return_weights": False}, {"trace": True, "return_weights": False},
                      {"causal": True, "trace": True}]


@pytest.mark.parametrize(("op", "variant"), [
    *[(op, variant) for op in ("attention", "self-attention", "multi-head-attention", "encoder")
      for variant in ATTENTION_VARIANTS],
    ("embed", {}), ("positional-encoding", {}), ("causal-mask", {}),
])
def test_results_have_exactly_their_response_schemas_shape(op, variant):
    """The compute endpoints and batch items write their results without a dump through the response
    schema (it only copied them): so no result may hold anything the schema would drop or change."""
    operation = OPERATIONS[op]
    result = operation.compute(operation.prepare(operation.request().load({**examples.request(op), **variant}),
                                                 Limits()))
    _same_shape(RESPONSES[op]().dump(result), result)


def _weights_of(w_o_value: float) -> dict:
    heads = np.ones((4, 8, 2)).tolist()
    return {"w_q": heads, "w_k": heads, "w_v": heads, "w_o": (np.ones((8, 8)) * w_o_value).tolist()}


@pytest.mark.parametrize(("path", "body", "where"), [
    ("/v1/attention", {"query": [[0.0, 0.0]], "key": [[0.0, 0.0]], "value": [[1.0, 1.0]], "scale": 1e39}, "/scale"),
    ("/v1/multi-head-attention", {"tokens": ["cat", "it"], "d_model": 8, "n_heads": 4, "weights": _weights_of(1e39)},
     "/weights/w_o"),
])
def test_float32_overflow_points_at_the_number_that_does_not_fit(client, path, body, where):
    """A scale or an explicit weight beyond float32 used to surface as an overflow blamed on the query."""
    assert_problem(client.post(path, json={**body, "dtype": "float32"}), 422, where)


@pytest.mark.parametrize(("extra", "culprits"), [
    ({"scale": 1e308}, ("/query", "/key", "/scale")),      # small q and k: only the scale made them overflow
    ({"scale": 1e-300, "dtype": "float32"}, None),        # below float32's range it is 0: no overflow at all
    ({}, ("/query", "/key")),
])
def test_attention_scores_that_overflow_point_at_query_key_and_a_given_scale(client, extra, culprits):
    big = 1e200 if "scale" not in extra else 2.0
    body = {"query": [[big, 2.0]], "key": [[big, 0.0]], "value": [[1.0]], **extra}
    response = client.post("/v1/attention", json=body)
    if culprits is None:
        assert response.status_code == 200
        return
    problem = assert_problem(response, 422, *culprits)
    assert problem["detail"] == "the attention scores overflowed: input values are too large"


# Layers whose projections overflow embeddings of 1.7e308 (seed 0's self-attention weights are all below 1 in size).
OVERFLOWING = [("/v1/self-attention", {"seed": 1}), ("/v1/multi-head-attention", {"n_heads": 2}),
               ("/v1/encoder", {"n_heads": 2, "n_layers": 1})]


@pytest.mark.parametrize(("path", "options"), OVERFLOWING)
def test_a_trace_whose_projections_overflow_says_so(client, path, options):
    """Finite embeddings whose projections overflow: with trace too, an overflow, not "values must be finite"."""
    body = {"embeddings": (np.eye(3, 4) * 1.7e308).tolist(), **options}
    for trace in (False, True):
        problem = assert_problem(client.post(path, json={**body, "trace": trace}), 422, "/embeddings")
        assert "overflowed" in problem["detail"], (trace, problem["detail"])


@pytest.mark.parametrize(("path", "options"), OVERFLOWING)
def test_a_bad_mask_is_named_before_an_overflow_with_or_without_trace(client, path, options):
    """The trace checked its projections for overflow before the mask: the same request named another error."""
    body = {"embeddings": (np.eye(3, 4) * 1.7e308).tolist(), "mask": [[True, True]] * 2, **options}
    answers = [assert_problem(client.post(path, json={**body, "trace": trace}), 422, "/mask")
               for trace in (False, True)]
    assert answers[0]["detail"] == answers[1]["detail"]


def test_an_overflow_with_explicit_weights_points_at_the_input_and_the_weights(client):
    body = {"tokens": ["cat", "it"], "d_model": 8, "n_heads": 4, "weights": _weights_of(1e308)}
    problem = assert_problem(client.post("/v1/multi-head-attention", json=body), 422, "/tokens", "/weights")
    assert problem["detail"] == "the computation overflowed: input values are too large"  # no engine argument name
