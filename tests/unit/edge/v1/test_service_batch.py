"""POST /v1/batch: every item answers exactly as its single endpoint; envelope errors; limits; real HTTP."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from service.edge import create_app
from service.edge.v1 import examples
from service.operations.registry import OPERATIONS
from service.settings import Limits
from tests.conftest import app_with, assert_problem

OPS = ["attention", "self-attention", "multi-head-attention", "encoder", "embed", "positional-encoding"]


def single(client, op: str, body: dict):
    """The single endpoint's response to ``body``."""
    if op == "positional-encoding":
        return client.get("/v1/positional-encoding", query_string=body)
    return client.post(f"/v1/{op}", json=body)


def rooted(problem: dict, index: int) -> dict:
    """A single endpoint's problem as a batch item reports it: pointers from the batch root (also
    where the validation summary in ``detail`` quotes them); query parameters become pointers."""
    root, detail, errors = f"/requests/{index}/body", problem["detail"], []
    for error in problem.get("errors", []):
        where = error.get("pointer") or "/" + error["parameter"]
        detail = detail.replace(f"{where}: ", f"{root}{where}: ")
        errors.append({"pointer": root + where, "detail": error["detail"]})
    problem = {key: value for key, value in problem.items() if key != "request_id"}  # per HTTP request
    return {**problem, "detail": detail, **({"errors": errors} if errors else {})}


def batch_of(client, items: list[tuple[str, dict]]):
    return client.post("/v1/batch", json={"requests": [{"id": f"item-{i}", "op": op, "body": body}
                                                       for i, (op, body) in enumerate(items)]})


def assert_same_as_singles(client, items: list[tuple[str, dict]]) -> list[dict]:
    """Each item's answer equals its single endpoint's answer (body, or status and problem)."""
    response = batch_of(client, items)
    assert response.status_code == 200, response.get_data(as_text=True)
    answers = response.get_json()["responses"]
    assert [a["id"] for a in answers] == [f"item-{i}" for i in range(len(items))]
    for index, ((op, body), answer) in enumerate(zip(items, answers, strict=True)):
        expected = single(client, op, body)
        assert answer["status"] == expected.status_code, (index, answer)
        if expected.status_code == 200:
            assert answer["body"] == expected.get_json(), (index, op)
        else:
            assert answer["error"] == rooted(expected.get_json(), index), (index, op)
    return answers


def test_mixed_ops_in_one_batch_equal_their_single_endpoints(client):
    items = [(op, examples.request(op)) for op in OPS]
    items += [("multi-head-attention", {**examples.request("multi-head-attention"), "trace": True}),
              ("encoder", {**examples.request("encoder"), "return_weights": False, "decimals": None})]
    assert_same_as_singles(client, items)


def test_bad_items_fail_alone_with_the_single_endpoints_problem(client):
    good = examples.request("multi-head-attention")
    items = [
        ("multi-head-attention", good),
        ("attention", {"query": [[1.0, True]], "key": [[1.0, 2.0]], "value": [[1.0]]}),  # boolean leaf
        ("multi-head-attention", {**good, "tokens": ["the", "dog"]}),  # unknown token, found at compute
        ("multi-head-attention", {**good, "n_heads": 3}),  # 8 is not divisible by 3: the engine says so
        ("self-attention", {"embeddings": [[1.0, 2.0]], "d_model": 3}),  # d_model != embeddings' width
        ("encoder", {"tokens": ["cat"], "n_heads": 1, "n_layers": 7}),  # past max_layers
        ("positional-encoding", {"n_positions": 5000, "d_model": 4}),  # past max_sequence_length
        ("multi-head-attention", good),
        ("embed", {"tokens": ["cat"], "surprise": 1}),  # unknown field
        ("attention", {"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], "mask": [[True, False]]}),  # engine
        ("self-attention", {"tokens": ["cat", "ate"], "d_k": 10**7}),  # past max_d_model: counts as at it
        ("multi-head-attention", {"tokens": ["cat"], "d_model": 10**7, "n_heads": 10**9}),  # past two limits
    ]
    answers = assert_same_as_singles(client, items)
    assert [a["status"] for a in answers] == [200, 422, 422, 422, 422, 422, 422, 200, 422, 422, 422, 422]
    assert answers[1]["error"]["errors"][0]["pointer"] == "/requests/1/body/query/0/1"
    assert answers[2]["error"]["errors"][0]["pointer"] == "/requests/2/body/tokens/1"
    assert answers[6]["error"]["errors"][0]["pointer"] == "/requests/6/body/n_positions"
    assert answers[0]["body"] == answers[7]["body"]


def test_positional_encoding_body_takes_json_integers_only(client):
    answers = batch_of(client, [("positional-encoding", {"n_positions": 3.5, "d_model": 4}),
                                ("positional-encoding", {"n_positions": "3", "d_model": 4})]).get_json()["responses"]
    assert [a["status"] for a in answers] == [422, 422]
    assert answers[0]["error"]["errors"] == [{"pointer": "/requests/0/body/n_positions",
                                              "detail": "Not a valid integer."}]


@pytest.mark.parametrize(("body", "pointers"), [
    ([{"id": "a", "op": "embed", "body": {}}], [""]),
    ("requests", [""]),
    ({}, ["/requests"]),
    ({"requests": []}, ["/requests"]),
    ({"requests": {"id": "a"}}, ["/requests"]),
    ({"requests": [{"op": "embed", "body": {}}]}, ["/requests/0/id"]),
    ({"requests": [{"id": 7, "op": "embed", "body": {}}]}, ["/requests/0/id"]),
    ({"requests": [{"id": "", "op": "embed", "body": {}}]}, ["/requests/0/id"]),
    ({"requests": [{"id": "a", "op": "embed", "body": {}}, {"id": "b", "op": "embed", "body": {}},
                   {"id": "a", "op": "embed", "body": {}}, {"id": "b", "op": "embed", "body": {}}]},
     ["/requests/2/id", "/requests/3/id"]),
    ({"requests": [{"id": str(i), "op": "embed", "body": {}} for i in range(3)] + [{"id": "z", "op": "x", "body": {}}]},
     ["/requests/3/op"]),
    ({"requests": [{"id": "a", "op": "causal-mask", "body": {"size": 2}}]}, ["/requests/0/op"]),
    ({"requests": [{"id": "a", "op": "embed"}]}, ["/requests/0/body"]),
    ({"requests": [{"id": "a", "op": "embed", "body": {}, "extra": 1}]}, ["/requests/0/extra"]),
    ({"requests": [{"id": "a", "op": "embed", "body": {}}], "more": []}, ["/more"]),
    ({"requests": ["a"]}, ["/requests/0"]),
])
def test_envelope_errors_are_422_for_the_whole_batch(client, body, pointers):
    assert_problem(client.post("/v1/batch", json=body), 422, *pointers)


@pytest.mark.parametrize(("requests_", "where", "detail"), [
    ("x", "/requests", "Not a valid list."),
    ({"id": "a"}, "/requests", "Not a valid list."),
    ([None], "/requests/0", "Not an object: each request is {id, op, body}."),
    ([{"id": "a", "op": "embed", "body": {}}, 3], "/requests/1", "Not an object: each request is {id, op, body}."),
])
def test_envelope_errors_say_what_was_expected(client, requests_, where, detail):
    problem = assert_problem(client.post("/v1/batch", json={"requests": requests_}), 422, where)
    assert problem["errors"] == [{"pointer": where, "detail": detail}]


def test_body_errors_are_the_usual_400_415_413():
    client = app_with(limits=Limits(max_body_bytes=100)).test_client()
    assert_problem(client.post("/v1/batch", data=b"{", content_type="application/json"), 400)
    assert_problem(client.post("/v1/batch", data=b"{}", content_type="text/plain"), 415)
    assert_problem(client.post("/v1/batch", json={"requests": [{"id": "x" * 100, "op": "embed", "body": {}}]}), 413)


def test_an_item_body_that_is_not_an_object_fails_alone(client):
    answers = batch_of(client, [("embed", ["cat"]), ("embed", {"tokens": ["cat"]})]).get_json()["responses"]
    assert answers[0]["status"] == 422 and answers[0]["error"]["errors"][0]["pointer"] == "/requests/0/body"
    assert answers[1]["status"] == 200


def items_of(count: int) -> dict:
    return {"requests": [{"id": str(i), "op": "embed", "body": {"tokens": ["cat"]}} for i in range(count)]}


def test_max_batch_items_at_and_past_the_boundary():
    client = app_with(limits=Limits(max_batch_items=3)).test_client()
    assert client.get("/v1/limits").get_json()["max_batch_items"] == 3
    assert len(client.post("/v1/batch", json=items_of(3)).get_json()["responses"]) == 3
    problem = assert_problem(client.post("/v1/batch", json=items_of(4)), 413)
    assert problem["limit"] == {"name": "max_batch_items", "maximum": 3, "value": 4}


def test_max_batch_items_defaults_to_256_and_comes_from_the_environment(client, environ):
    assert client.get("/v1/limits").get_json()["max_batch_items"] == 256
    assert client.post("/v1/batch", json=items_of(256)).status_code == 200
    assert_problem(client.post("/v1/batch", json=items_of(257)), 413)
    environ.setenv("ATTENTION_MAX_BATCH_ITEMS", "2")
    assert create_app({"TESTING": True}).test_client().get("/v1/limits").get_json()["max_batch_items"] == 2


MHA = {"embeddings": np.ones((2, 3, 4)).tolist(), "n_heads": 2}  # weights 2*2*3*3 = 36, output 2*3*4 = 24: 4*60


def test_max_batch_elements_at_and_past_the_boundary():
    items = {"requests": [{"id": str(i), "op": "multi-head-attention", "body": MHA} for i in range(3)]}
    budget = 3 * 240 + 4 * 4 * 4  # the items, and the weights of their one seeded layer (W_q, W_k, W_v, W_o: 4 x 4)
    at = app_with(limits=Limits(max_batch_elements=budget)).test_client()
    assert [a["status"] for a in at.post("/v1/batch", json=items).get_json()["responses"]] == [200] * 3
    past = app_with(limits=Limits(max_batch_elements=budget - 1)).test_client()
    problem = assert_problem(past.post("/v1/batch", json=items), 413, "/requests/0", "/requests/1", "/requests/2")
    assert problem["limit"] == {"name": "max_batch_elements", "maximum": budget - 1, "value": budget}
    assert [error["detail"] for error in problem["errors"]] == ["240 units of work"] * 3


def test_a_batch_past_its_budget_names_its_costliest_items_first():
    """Where to split it: the five costliest items, by their pointers; a bad item (its own 422) counts nothing."""
    small, large = {"embeddings": np.ones((3, 4)).tolist(), "n_heads": 2}, {"embeddings": np.ones((9, 4)).tolist(),
                                                                          "n_heads": 2}
    bodies = [small, large, {"n_heads": 2}, small, large, small, small, small]
    items = {"requests": [{"id": str(i), "op": "multi-head-attention", "body": body} for i, body in enumerate(bodies)]}
    client = app_with(limits=Limits(max_batch_elements=100)).test_client()
    assert_problem(client.post("/v1/batch", json=items), 413, "/requests/1", "/requests/4", "/requests/0",
                   "/requests/3", "/requests/5")


def test_a_batch_whose_answer_would_not_fit_a_worker_is_refused_before_compute(client):
    """9 items each returning a million weights (1024 tokens): ~200 MB of JSON and more to hold; the default
    budget counts 4 per returned number and refuses it (31 such items answered 713 MB before)."""
    words = ["the", "cat", "ate", "food", "it"] * 205
    item = {"op": "self-attention", "body": {"tokens": words[:1024], "positional_encoding": True}}
    problem = assert_problem(client.post("/v1/batch", json={"requests": [{"id": str(i), **item} for i in range(9)]}),
                             413)
    assert problem["limit"]["name"] == "max_batch_elements" and problem["limit"]["value"] > 2**25


def test_an_item_past_its_own_limits_gets_its_422_and_counts_only_up_to_them():
    # The big item counts as the 2 sentences its limit allows, 4 * (36 weights + 24 outputs) = 240 (360 if it
    # counted fully), like each other item: 720, and 64 for the seeded layer they share: 784 in all.
    client = app_with(limits=Limits(max_weight_elements=36, max_batch_elements=784))
    huge = {**MHA, "embeddings": np.ones((3, 3, 4)).tolist()}  # 54 weights: past max_weight_elements alone
    answers = client.test_client().post("/v1/batch", json={"requests": [
        {"id": "a", "op": "multi-head-attention", "body": MHA}, {"id": "b", "op": "multi-head-attention", "body": huge},
        {"id": "c", "op": "multi-head-attention", "body": MHA}]}).get_json()["responses"]
    assert [a["status"] for a in answers] == [200, 422, 200]
    assert answers[1]["error"]["limit"]["name"] == "max_weight_elements"


def test_order_is_request_order_not_group_order(client):
    rng = np.random.default_rng(1)
    ops = rng.choice(["attention", "embed", "self-attention"], size=40)
    items = [(op, examples.request(op) if op != "embed" else {"tokens": ["cat"] * (i % 3 + 1)})
             for i, op in enumerate(ops)]
    answers = assert_same_as_singles(client, items)
    assert [len(a["body"]["embeddings"]) for a, op in zip(answers, ops, strict=True) if op == "embed"] == \
        [i % 3 + 1 for i, op in enumerate(ops) if op == "embed"]






def test_grouping_never_mixes_items_up(client, monkeypatch):
    """Interleaved items that differ only in seed, mask values, mask presence, causal, dtype, shape,
    explicit weights (same shape, other numbers) or per-head masks: each answer equals its single
    endpoint's, and the stacked calls are exactly the expected groups (so grouping really ran)."""
    rng = np.random.default_rng(7)
    tokens = ["the", "cat", "ate", "food", "it"]

    def mha(**extra):
        return ("multi-head-attention", {"tokens": tokens, "d_model": 8, "n_heads": 4, **extra})

    def weights():
        return {"w_q": rng.normal(size=(4, 8, 2)).tolist(), "w_k": rng.normal(size=(4, 8, 2)).tolist(),
                "w_v": rng.normal(size=(4, 8, 2)).tolist(), "w_o": rng.normal(size=(8, 8)).tolist()}

    def mask(*shape):
        return (rng.random(shape) < 0.6).tolist()

    def attention(n=3, batch=(), **extra):
        q, k, v = rng.normal(size=(*batch, n, 2)), rng.normal(size=(n, 2)), rng.normal(size=(n, 2))
        return ("attention", {"query": q.tolist(), "key": k.tolist(), "value": v.tolist(), **extra})

    def encoder(**extra):
        return ("encoder", {"tokens": tokens, "d_model": 8, "n_heads": 2, "n_layers": 2, **extra})

    def self_attention(**extra):
        return ("self-attention", {"tokens": tokens, "d_k": 2, "seed": 4, **extra})

    w1, w2 = weights(), weights()
    batched = [{"tokens": None, "embeddings": rng.normal(size=(2, 5, 8)).tolist()} for _ in range(2)]
    # (label, (op, body)): items with the same label must form one stacked call.
    labelled = [
        ("seed0", mha()), ("seed1", mha(seed=1)), ("causal", mha(causal=True)), ("f32", mha(dtype="float32")),
        ("mask", mha(mask=mask(5, 5))), ("seed0", mha(tokens=tokens[::-1])), ("mask", mha(mask=mask(5, 5))),
        ("seed1-pe", mha(seed=1, positional_encoding=True)), ("causal", mha(causal=True, decimals=3)),
        ("f32", mha(dtype="float32", causal=False)), ("batched", mha(**batched[0])),
        ("w1", mha(weights=w1)), ("w2", mha(weights=w2)), ("w1", mha(weights=w1, tokens=[*tokens[1:], "cat"])),
        ("batched", mha(**batched[1])), ("head-mask", mha(mask=mask(4, 5, 5))),
        ("seed1-pe", mha(seed=1, positional_encoding=True, tokens=tokens[::-1])),
        ("row-mask", mha(mask=mask(5))), ("head-mask", mha(mask=mask(4, 5, 5))), ("row-mask", mha(mask=mask(5))),
        # G == n == 3 with (n,) masks: stacked without alignment they would broadcast as one (n, n) mask.
        ("att-key-mask", attention(mask=mask(3))), ("att-key-mask", attention(mask=mask(3))),
        ("att-key-mask", attention(mask=mask(3))), ("att-batched", attention(batch=(2,), causal=True)),
        ("att-scale", attention(scale=0.5)), ("att-batched", attention(batch=(2,), causal=True)),
        ("att-scale", attention(scale=0.5)), ("att-plain", attention()), ("att-4", attention(n=4)),
        ("self", self_attention()), ("self", self_attention(tokens=tokens[:2] + tokens[:3])),
        ("self-d3", self_attention(d_k=3)),
        ("enc", encoder()), ("enc", encoder(tokens=tokens[::-1])), ("enc-seed", encoder(seed=9)),
    ]
    items = [(op, {k: v for k, v in body.items() if v is not None}) for _, (op, body) in labelled]
    calls = []
    for op in ("attention", "self-attention", "multi-head-attention", "encoder"):
        operation = OPERATIONS[op]

        def counted(prepared, compute_fn=operation.compute, op=op):
            calls.append(op)
            return compute_fn(prepared)

        monkeypatch.setitem(OPERATIONS, op, dataclasses.replace(operation, compute=counted))
    answers = assert_same_as_singles(client, items)
    assert all(answer["status"] == 200 for answer in answers)
    assert len(calls) == len({label for label, _ in labelled})  # one call per group, no fallback


WORDS = ["the", "cat", "ate", "food", "it"]


@pytest.mark.parametrize(("body", "items"), [
    # each its own seed: 256 encoders of d_model 512 draw ~5 G weights (past the worker timeout, from 36 KB)
    (lambda i: {"tokens": ["cat"], "d_model": 512, "n_heads": 1, "n_layers": 6, "return_weights": False,
                "seed": i}, 256),
    # traces: q, k, v, add & norm, feed-forward and output of every layer are returned too (~280 MB of JSON)
    (lambda i: {"tokens": (WORDS * 6)[:27], "d_model": 512, "n_heads": 1, "n_layers": 6, "trace": True}, 100),
    # one-number positions: the feed-forward's hidden layer is what is large (64 stacked: 1 GB, 4.6 s, from 0.5 MB)
    (lambda i: {"embeddings": [[[1.0]]] * 1024, "n_heads": 1, "n_layers": 6, "d_ff": 2048, "return_weights": False,
                "decimals": 0, "seed": 3}, 64),
])
def test_batches_whose_work_the_items_shapes_hide_are_413_before_any_compute(client, body, items):
    started = time.monotonic()
    response = client.post("/v1/batch", json={"requests": [{"id": str(i), "op": "encoder", "body": body(i)}
                                                            for i in range(items)]})
    problem = assert_problem(response, 413)
    assert problem["limit"]["name"] == "max_batch_elements" and time.monotonic() - started < 2
    assert len(problem["errors"]) == 5 and "of them the random weights its seeded layers draw" in problem["detail"]
