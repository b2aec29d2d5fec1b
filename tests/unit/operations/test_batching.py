"""service.batching without Flask: grouping, fallback to one by one, the cost of an item."""

from __future__ import annotations

import numpy as np
import pytest

from attention import AttentionError
from schemas.batch import OPS
from service.operations import batching, compute
from service.operations.limits import Limits
from service.problems import LimitExceeded, ValidationProblem


def load(op: str, body: dict) -> tuple[str, dict]:
    return op, OPS[op][0]().load(body)


def test_run_equals_each_items_compute_without_an_app():
    rng = np.random.default_rng(3)
    items = [load("multi-head-attention", {"embeddings": rng.normal(size=(4, 8)).tolist(), "n_heads": 2,
                                           "causal": bool(i % 2)}) for i in range(6)]
    for result, (op, params) in zip(batching.run(items, Limits()), items, strict=True):
        alone = compute.ENDPOINTS[op].compute(params, Limits())
        np.testing.assert_array_equal(result["output"], alone["output"])
        np.testing.assert_array_equal(result["weights"], alone["weights"])


def test_a_failing_group_is_recomputed_one_by_one():
    good = load("attention", {"query": [[1.0, 0.0]], "key": [[1.0, 0.0]], "value": [[2.0]]})
    bad = load("multi-head-attention", {"tokens": ["cat", "it"], "d_model": 6, "n_heads": 4})  # 6 % 4 != 0
    big = load("multi-head-attention", {"tokens": ["cat", "it"], "d_model": 6, "n_heads": 6})
    results = batching.run([bad, good, bad, big], Limits(max_heads=4))
    assert isinstance(results[0], AttentionError) and isinstance(results[2], AttentionError)
    assert results[1]["output"].tolist() == [[2.0]]
    assert isinstance(results[3], LimitExceeded)


@pytest.mark.parametrize(("op", "body", "expected"), [  # (computed + returned) + 3 * returned (+ hidden, macs)
    ("attention", {"query": np.ones((2, 3, 4)).tolist(), "key": np.ones((5, 4)).tolist(),
                   "value": np.ones((5, 6)).tolist()}, 4 * (2 * 3 * 5 + 2 * 3 * 6)),
    ("attention", {"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], "trace": True}, 4 * (5 * 1 + 1)),  # 4 stages
    ("attention", {"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], "trace": True, "return_weights": False},
     4 * (4 * 1 + 1)),                                                                    # and the weights, or not
    ("self-attention", {"tokens": ["cat"] * 3, "d_k": 2}, 4 * (3 * 3 + 3 * 2)),
    ("multi-head-attention", {"embeddings": np.ones((2, 3, 4)).tolist(), "n_heads": 2}, 4 * (2 * 2 * 9 + 2 * 3 * 4)),
    ("multi-head-attention", {"embeddings": np.ones((2, 3, 4)).tolist(), "n_heads": 2, "return_weights": False},
     2 * 2 * 9 + 4 * (2 * 3 * 4)),  # weights computed, not returned
    ("encoder", {"tokens": ["cat"] * 3, "d_model": 8, "n_heads": 2, "n_layers": 3},
     4 * (2 * 9 * 3 + 3 * 8) + 3 * 3 * 32 + 3 * 3 * (4 * 8 * 8 + 2 * 8 * 32) // 1024),  # + hidden, macs / 1024
    ("embed", {"tokens": ["cat"] * 3, "d_model": 6}, 4 * 18),
    ("positional-encoding", {"n_positions": 3, "d_model": 4}, 4 * 12),
    ("positional-encoding", {"n_positions": 10**9, "d_model": 10**9}, 4 * 1024 * 512),  # counted up to its limits
    ("self-attention", {"tokens": ["cat"] * 2, "d_k": 10**7},  # d_k counts as max_d_model
     4 * (2 * 2 + 2 * 512) + 2 * 3 * 4 * 512 // 1024),
    ("multi-head-attention", {"tokens": ["cat"] * 2, "d_model": 10**7, "n_heads": 2},
     4 * (2 * 4 + 2 * 512) + 2 * 4 * 512 * 512 // 1024),
    ("encoder", {"tokens": ["cat"] * 2, "d_model": 8, "n_heads": 10**9, "n_layers": 10**9},  # max_heads, max_layers
     4 * (16 * 4 * 6 + 2 * 8) + 6 * 2 * 32 + 2 * 6 * (4 * 8 * 8 + 2 * 8 * 32) // 1024),
    ("encoder", {"tokens": ["cat"] * 2, "d_model": 8, "n_heads": 1, "n_layers": 2, "trace": True},  # 7 arrays a layer
     (1 + 3) * (5 * 2 * 4 + 2 * 8 + 2 * 7 * 8 * 2) + 2 * 2 * 32 + 2 * 2 * (4 * 8 * 8 + 2 * 8 * 32) // 1024),
    ("multi-head-attention", {"tokens": ["cat"] * 2, "d_model": 8, "n_heads": 2, "trace": True},  # q, k, v
     (1 + 3) * (5 * 2 * 4 + 2 * 8 + 2 * 3 * 8) + 2 * 4 * 8 * 8 // 1024),
])
def test_cost_counts_what_is_computed_and_three_more_for_what_is_returned(op, body, expected):
    assert batching.cost(*load(op, body), Limits()) == expected


def test_cost_counts_an_output_wider_than_the_input_up_to_its_limit():
    """65 one-number positions, d_k 512: the item answers its own 422; it counts max_output_elements, at most."""
    item = load("self-attention", {"embeddings": np.ones((65, 1, 1)).tolist(), "d_k": 512})
    limits = Limits(max_weight_elements=64, max_output_elements=100)
    assert batching.cost(*item, limits) == 4 * (64 + 100) + 64 * 3 * 1 * 512 // 1024


def test_cost_counts_no_more_sentences_than_the_weights_limit_allows():
    """9 sentences of 2 heads * 2 * 2 weights, 64 weights allowed: counted as 8 (the item answers its own 422)."""
    item = load("multi-head-attention", {"embeddings": np.ones((9, 2, 4)).tolist(), "n_heads": 2})
    expected = 4 * (8 * 2 * 2 * 2 + 8 * 2 * 4) + 8 * 2 * 4 * 4 * 4 // 1024  # + multiply-adds per 1024
    assert batching.cost(*item, Limits(max_weight_elements=64)) == expected


def test_a_trace_past_the_weights_limit_counts_no_more_sentences_than_its_five_arrays_allow():
    """9 traced sentences of 8 weights, 5 arrays each (4 stages and the weights): 320 allowed is 8 sentences."""
    item = load("multi-head-attention", {"embeddings": np.ones((9, 2, 4)).tolist(), "n_heads": 2, "trace": True})
    weights, output = 8 * 8 * 5, 8 * 2 * (4 + 3 * 4)  # output and q, k, v along the positions
    expected = weights + output + 8 * 2 * 4 * 4 * 4 // 1024 + 3 * (weights + output)
    assert batching.cost(*item, Limits(max_weight_elements=320)) == expected


def test_keys_tell_apart_what_compares_equal():
    def key(**options):
        return batching.prepare(*load("attention", {"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], **options}),
                                Limits()).key

    assert key(scale=0.0) != key(scale=-0.0)
    assert key(mask=[True]) != key() != key(trace=True) is None
    assert key(decimals=3) == key()


def test_token_items_are_embedded_as_one_group_and_an_unknown_word_fails_alone(monkeypatch):
    words = ["the", "cat", "ate", "food", "it"]
    items = [load("multi-head-attention", {"tokens": words[i:] + words[:i], "d_model": 8, "n_heads": 4,
                                           "positional_encoding": True}) for i in range(4)]
    typo = load("multi-head-attention", {"tokens": ["the", "dgo", "ate", "food", "it"], "d_model": 8, "n_heads": 4,
                                         "positional_encoding": True})
    calls = []
    endpoint = compute.ENDPOINTS["multi-head-attention"]
    monkeypatch.setitem(compute.ENDPOINTS, "multi-head-attention",
                        endpoint._replace(compute=lambda params, limits: calls.append(params) or
                                          endpoint.compute(params, limits)))
    results = batching.run([items[0], typo, *items[1:]], Limits())
    assert [len(params.get("embeddings", ())) for params in calls] == [4, 0]  # one stacked call, the typo alone
    assert isinstance(results[1], ValidationProblem) and "dgo" in results[1].description
    for result, (_, params) in zip([results[0], *results[2:]], items, strict=True):
        alone = endpoint.compute(params, Limits())
        np.testing.assert_array_equal(result["output"], alone["output"])
        np.testing.assert_array_equal(result["weights"], alone["weights"])


@pytest.mark.parametrize("op", ["self-attention", "multi-head-attention", "encoder"])
def test_a_d_model_that_differs_from_the_embeddings_fails_its_item_in_any_order(op):
    """d_model must be part of the group key: the group's call checks it against the embeddings for
    its first item only, so a mismatching item grouped behind a good one would have answered 200."""
    body = {"embeddings": [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]], "n_heads": 2, "n_layers": 1}
    body = {key: value for key, value in body.items() if key in OPS[op][0]().fields}
    good, bad = load(op, body), load(op, {**body, "d_model": 8})
    for items, bad_at in (([good, bad], 1), ([bad, good], 0)):
        results = batching.run(items, Limits())
        assert isinstance(results[bad_at], ValidationProblem), results[bad_at]
        assert not isinstance(results[1 - bad_at], Exception)


def test_a_stacked_result_splits_into_items_keeping_its_structure():
    stacked = {"output": np.arange(6).reshape(3, 2), "weights": None,
               "layers": [{"weights": np.ones((3, 1, 1)) * np.arange(3)[:, None, None]}], "empty": []}
    items = batching._split(stacked, 3)
    assert len(items) == 3 and [item["output"].tolist() for item in items] == [[0, 1], [2, 3], [4, 5]]
    assert all(item["weights"] is None and item["empty"] == [] for item in items)
    assert [item["layers"][0]["weights"].tolist() for item in items] == [[[0.0]], [[1.0]], [[2.0]]]


def test_a_stack_within_g_times_every_size_limit_is_computed_as_one_call(monkeypatch):
    """Each item is within max_output_elements; their stack must not be refused for being G times that."""
    rng = np.random.default_rng(5)
    items = [load("attention", {"query": rng.normal(size=(2, 3, 2)).tolist(), "key": [[1.0, 0.0]],
                                "value": rng.normal(size=(1, 4)).tolist()}) for _ in range(8)]
    monkeypatch.setattr(batching, "_alone", lambda job, limits: pytest.fail("computed alone"))
    results = batching.run(items, Limits(max_output_elements=2 * 3 * 4))
    assert [result["output"].shape for result in results] == [(2, 3, 4)] * 8


def test_seeded_draws_count_each_distinct_layer_once():
    def mha(seed: int, **extra) -> tuple[str, dict]:
        return load("multi-head-attention", {"tokens": ["cat"], "d_model": 8, "n_heads": 2, "seed": seed, **extra})

    explicit = {"w_q": np.ones((2, 8, 4)).tolist(), "w_k": np.ones((2, 8, 4)).tolist(),
                "w_v": np.ones((2, 8, 4)).tolist(), "w_o": np.ones((8, 8)).tolist()}
    assert batching.seeded_draws([mha(0), mha(0), mha(0, causal=True)], Limits()) == 4 * 8 * 8
    assert batching.seeded_draws([mha(0), mha(1)], Limits()) == 2 * 4 * 8 * 8
    assert batching.seeded_draws([mha(0, weights=explicit)], Limits()) == 0
    encoder = load("encoder", {"tokens": ["cat"], "d_model": 8, "n_heads": 2, "n_layers": 2, "d_ff": 16})
    assert batching.seeded_draws([encoder, encoder], Limits()) == 2 * (4 * 8 * 8 + 2 * 8 * 16)
    self_attention = load("self-attention", {"tokens": ["cat"], "d_model": 8, "d_k": 3})
    assert batching.seeded_draws([self_attention], Limits()) == 3 * 8 * 3
