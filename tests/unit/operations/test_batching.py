"""service.operations.batching and .sizes without Flask: grouping, fallback to one by one, the cost of an item."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attention import AttentionError
from service.operations import answers, batching, sizes
from service.operations.registry import BATCH_OPERATIONS, OPERATIONS
from service.problems import LimitExceeded, ValidationProblem
from service.settings import Limits


def load(op: str, body: dict) -> tuple[str, dict]:
    return op, BATCH_OPERATIONS[op].batch_request().load(body)


def cost(op: str, params: dict, limits: Limits | None = None) -> int:
    """The item's share of a batch's budget, once it is within its own limits (as /v1/batch counts it)."""
    return sizes.cost(OPERATIONS[op].prepare(params, limits or Limits()).work)


def alone(op: str, params: dict, limits: Limits | None = None) -> dict:
    """What the item's single endpoint computes."""
    return OPERATIONS[op].compute(OPERATIONS[op].prepare(params, limits or Limits()))


def run(items: list[tuple[str, dict]], limits: Limits | None = None) -> list:
    """batching.run of ``items``, each prepared first as /v1/batch prepares it: one refused there is its error."""
    results, prepared = {}, []
    for index, (op, params) in enumerate(items):
        try:
            prepared.append((index, op, OPERATIONS[op].prepare(params, limits or Limits())))
        except Exception as error:
            results[index] = error
    computed = batching.run([(op, item) for _, op, item in prepared])
    results.update((index, result) for (index, _, _), result in zip(prepared, computed, strict=True))
    return [results[index] for index in range(len(items))]


def test_run_equals_each_items_compute_without_an_app():
    rng = np.random.default_rng(3)
    items = [load("multi-head-attention", {"embeddings": rng.normal(size=(4, 8)).tolist(), "n_heads": 2,
                                           "causal": bool(i % 2)}) for i in range(6)]
    for result, (op, params) in zip(run(items), items, strict=True):
        single = alone(op, params)
        np.testing.assert_array_equal(result["output"], single["output"])
        np.testing.assert_array_equal(result["weights"], single["weights"])


def test_a_failing_group_is_recomputed_one_by_one():
    good = load("attention", {"query": [[1.0, 0.0]], "key": [[1.0, 0.0]], "value": [[2.0]]})
    bad = load("multi-head-attention", {"tokens": ["cat", "it"], "d_model": 6, "n_heads": 4})  # 6 % 4 != 0
    big = load("multi-head-attention", {"tokens": ["cat", "it"], "d_model": 6, "n_heads": 6})
    results = run([bad, good, bad, big], Limits(max_heads=4))
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
    ("encoder", {"tokens": ["cat"] * 2, "d_model": 8, "n_heads": 1, "n_layers": 2, "trace": True},  # 7 arrays a layer
     (1 + 3) * (5 * 2 * 4 + 2 * 8 + 2 * 7 * 8 * 2) + 2 * 2 * 32 + 2 * 2 * (4 * 8 * 8 + 2 * 8 * 32) // 1024),
    ("multi-head-attention", {"tokens": ["cat"] * 2, "d_model": 8, "n_heads": 2, "trace": True},  # q, k, v, W
     (1 + 3) * (5 * 2 * 4 + 2 * 8 + 2 * 3 * 8 + 4 * 8 * 8) + 2 * 4 * 8 * 8 // 1024),
])
def test_cost_counts_what_is_computed_and_three_more_for_what_is_returned(op, body, expected):
    assert cost(*load(op, body)) == expected


@pytest.mark.parametrize(("op", "body", "limits", "limit", "blamed"), [
    ("positional-encoding", {"n_positions": 10**9, "d_model": 10**9}, Limits(), "max_sequence_length", ["n_positions"]),
    ("self-attention", {"tokens": ["cat"] * 2, "d_k": 10**7}, Limits(), "max_d_model", ["/d_k"]),
    ("multi-head-attention", {"tokens": ["cat"] * 2, "d_model": 10**7, "n_heads": 2}, Limits(), "max_d_model",
     ["/d_model"]),
    ("encoder", {"tokens": ["cat"] * 2, "d_model": 8, "n_heads": 2, "n_layers": 10**9}, Limits(), "max_layers",
     ["/n_layers"]),
    # 65 one-number positions, d_k 512: the output is wider than the input
    ("self-attention", {"embeddings": np.ones((65, 1, 1)).tolist(), "d_k": 512},
     Limits(max_weight_elements=64, max_output_elements=100), "max_weight_elements", ["/embeddings"]),
    ("self-attention", {"embeddings": np.ones((64, 1, 1)).tolist(), "d_k": 512},
     Limits(max_weight_elements=64, max_output_elements=100), "max_output_elements", ["/d_k"]),
    # 9 sentences of 2 heads * 2 * 2 weights, 64 allowed
    ("multi-head-attention", {"embeddings": np.ones((9, 2, 4)).tolist(), "n_heads": 2},
     Limits(max_weight_elements=64), "max_weight_elements", ["/embeddings"]),
    # 9 traced sentences of 8 weights, 5 arrays each (4 stages and the weights): one copy would fit, 5 do not
    ("multi-head-attention", {"embeddings": np.ones((9, 2, 4)).tolist(), "n_heads": 2, "trace": True},
     Limits(max_weight_elements=320), "max_weight_elements", ["/embeddings", "/trace"]),
])
def test_an_item_past_its_limits_is_refused_by_the_check_its_single_endpoint_makes(op, body, limits, limit, blamed):
    """One size model: the check /v1/batch makes before counting an item is the one its endpoint makes (so the
    item answers that 422 and counts nothing), raised before any compute."""
    params = load(op, body)[1]
    with pytest.raises(LimitExceeded) as checked:
        OPERATIONS[op].prepare(params, limits)
    [refused], sized = answers.size([(op, body)], limits, lambda index: ())
    assert not sized and refused.members["limit"] == checked.value.members["limit"]  # a batch item's pointers
    assert [e["detail"] for e in refused.members["errors"]] == [e["detail"] for e in checked.value.members["errors"]]
    assert checked.value.members["limit"]["name"] == limit
    assert [e.get("pointer", e.get("parameter")) for e in checked.value.members["errors"]] == blamed


def test_keys_tell_apart_what_compares_equal():
    def key(**options):
        op, params = load("attention", {"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], **options})
        return batching.grouped(op, OPERATIONS[op].prepare(params, Limits())).key

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
    endpoint = OPERATIONS["multi-head-attention"]
    monkeypatch.setitem(OPERATIONS, "multi-head-attention",
                        dataclasses.replace(endpoint, compute=lambda prepared: calls.append(prepared.params) or
                                            endpoint.compute(prepared)))
    results = run([items[0], typo, *items[1:]])
    assert [len(params.get("embeddings", ())) for params in calls] == [4, 0]  # one stacked call, the typo alone
    assert isinstance(results[1], ValidationProblem) and "dgo" in results[1].description
    for result, (_, params) in zip([results[0], *results[2:]], items, strict=True):
        single = alone("multi-head-attention", params)
        np.testing.assert_array_equal(result["output"], single["output"])
        np.testing.assert_array_equal(result["weights"], single["weights"])


@pytest.mark.parametrize("op", ["self-attention", "multi-head-attention", "encoder"])
def test_a_d_model_that_differs_from_the_embeddings_fails_its_item_in_any_order(op):
    """d_model must be part of the group key: the group's call checks it against the embeddings for
    its first item only, so a mismatching item grouped behind a good one would have answered 200."""
    body = {"embeddings": [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]], "n_heads": 2, "n_layers": 1}
    body = {key: value for key, value in body.items() if key in OPERATIONS[op].request().fields}
    good, bad = load(op, body), load(op, {**body, "d_model": 8})
    for items, bad_at in (([good, bad], 1), ([bad, good], 0)):
        results = run(items)
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
    monkeypatch.setattr(batching, "_alone", lambda job: pytest.fail("computed alone"))
    results = run(items, Limits(max_output_elements=2 * 3 * 4))
    assert [result["output"].shape for result in results] == [(2, 3, 4)] * 8


def draws(items: list[tuple[str, dict]]) -> int:
    return sizes.draws(OPERATIONS[op].prepare(params, Limits()).work for op, params in items)


def test_seeded_draws_count_each_distinct_layer_once():
    def mha(seed: int, **extra) -> tuple[str, dict]:
        return load("multi-head-attention", {"tokens": ["cat"], "d_model": 8, "n_heads": 2, "seed": seed, **extra})

    explicit = {"w_q": np.ones((2, 8, 4)).tolist(), "w_k": np.ones((2, 8, 4)).tolist(),
                "w_v": np.ones((2, 8, 4)).tolist(), "w_o": np.ones((8, 8)).tolist()}
    assert draws([mha(0), mha(0), mha(0, causal=True)]) == 4 * 8 * 8
    assert draws([mha(0), mha(1)]) == 2 * 4 * 8 * 8
    assert draws([mha(0, weights=explicit)]) == 0
    encoder = load("encoder", {"tokens": ["cat"], "d_model": 8, "n_heads": 2, "n_layers": 2, "d_ff": 16})
    assert draws([encoder, encoder]) == 2 * (4 * 8 * 8 + 2 * 8 * 16)
    self_attention = load("self-attention", {"tokens": ["cat"], "d_model": 8, "d_k": 3})
    assert draws([self_attention]) == 3 * 8 * 3
