"""Limits: served at GET /v1/limits, read from the environment, enforced at and just past the boundary."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.edge import create_app
from service.settings import Limits, from_env
from tests.conftest import app_with, assert_problem


def client_with(**limits):
    return app_with(limits=Limits(**limits)).test_client()


def test_limits_are_served_with_their_defaults(client):
    assert client.get("/v1/limits").get_json() == dataclasses.asdict(Limits())


def test_limits_come_from_the_environment(environ):
    environ.setenv("ATTENTION_MAX_HEADS", "3")
    environ.setenv("ATTENTION_MAX_BODY_BYTES", "4096")
    served = create_app({"TESTING": True}).test_client().get("/v1/limits").get_json()
    assert served["max_heads"] == 3 and served["max_body_bytes"] == 4096
    # each refused by the variable's name, not a bare int() error; and only ASCII digits (int() takes more)
    for bad in ("0", "-3", "abc", "1.5", "", "1_000", "\u0663"):
        environ.setenv("ATTENTION_MAX_LAYERS", bad)
        with pytest.raises(ValueError, match=f"ATTENTION_MAX_LAYERS must be a positive integer, got '{bad}'"):
            from_env()


def attention_of(n_q: int, n_k: int, d: int = 1, batch: int | None = None) -> dict:
    def tensor(n):
        shape = (n, d) if batch is None else (batch, n, d)
        return np.ones(shape).tolist()
    return {"query": tensor(n_q), "key": tensor(n_k), "value": tensor(n_k)}


@pytest.mark.parametrize(("limits", "path", "at", "past", "name", "pointer"), [
    ({"max_sequence_length": 4}, "/v1/attention", attention_of(4, 4), attention_of(5, 4),
     "max_sequence_length", "/query"),
    ({"max_d_model": 3}, "/v1/attention", attention_of(2, 2, d=3), attention_of(2, 2, d=4), "max_d_model", "/query"),
    ({"max_weight_elements": 12}, "/v1/attention", attention_of(2, 3, batch=2), attention_of(2, 4, batch=2),
     "max_weight_elements", "/query"),
    ({"max_output_elements": 12}, "/v1/attention", attention_of(2, 2, d=3, batch=2), attention_of(2, 2, d=4, batch=2),
     "max_output_elements", "/query"),
    ({"max_heads": 2}, "/v1/multi-head-attention", {"tokens": ["cat"], "n_heads": 2},
     {"tokens": ["cat"], "n_heads": 4}, "max_heads", "/n_heads"),
    ({"max_weight_elements": 2 * 2 * 9}, "/v1/encoder", {"tokens": ["cat"] * 3, "n_heads": 2, "n_layers": 2},
     {"tokens": ["cat"] * 3, "n_heads": 2, "n_layers": 3}, "max_weight_elements", "/tokens"),
    ({"max_layers": 2}, "/v1/encoder", {"tokens": ["cat"], "n_heads": 1, "n_layers": 2},
     {"tokens": ["cat"], "n_heads": 1, "n_layers": 3}, "max_layers", "/n_layers"),
    ({"max_d_ff": 16}, "/v1/encoder", {"tokens": ["cat"], "n_heads": 1, "d_ff": 16},
     {"tokens": ["cat"], "n_heads": 1, "d_ff": 17}, "max_d_ff", "/d_ff"),
    ({"max_d_ff": 16}, "/v1/encoder", {"tokens": ["cat"], "n_heads": 1, "d_model": 4},
     {"tokens": ["cat"], "n_heads": 1, "d_model": 5}, "max_d_ff", "/d_ff"),
    ({"max_sequence_length": 2}, "/v1/embed", {"tokens": ["cat", "it"]}, {"tokens": ["cat", "it", "the"]},
     "max_sequence_length", "/tokens"),
    ({"max_d_model": 6}, "/v1/self-attention", {"tokens": ["cat"], "d_model": 6},
     {"tokens": ["cat"], "d_model": 7}, "max_d_model", "/d_model"),
    ({"max_d_model": 6}, "/v1/self-attention", {"tokens": ["cat"], "d_k": 6},
     {"tokens": ["cat"], "d_k": 7}, "max_d_model", "/d_k"),
    # Arrays wider than the input: self-attention's Q, K, V and output (B * n * d_k), the feed-forward (B * n * d_ff)
    ({"max_output_elements": 2 * 3 * 8}, "/v1/self-attention", {"embeddings": np.ones((2, 3, 1)).tolist(), "d_k": 8},
     {"embeddings": np.ones((2, 3, 1)).tolist(), "d_k": 9}, "max_output_elements", "/d_k"),
    ({"max_output_elements": 2 * 6}, "/v1/self-attention", {"tokens": ["cat", "it"], "d_model": 6},
     {"tokens": ["cat", "it"], "d_model": 7}, "max_output_elements", "/tokens"),
    ({"max_output_elements": 2 * 40}, "/v1/encoder", {"tokens": ["cat", "it"], "n_heads": 1, "d_ff": 40},
     {"tokens": ["cat", "it"], "n_heads": 1, "d_ff": 41}, "max_output_elements", "/d_ff"),
    ({"max_output_elements": 3 * 4 * 8}, "/v1/encoder", {"embeddings": np.ones((3, 8)).tolist(), "n_heads": 1},
     {"embeddings": np.ones((4, 8)).tolist(), "n_heads": 1}, "max_output_elements", "/embeddings"),
    # what a layer returns along the positions: its output, and with trace q, k, v (and an encoder's stages)
    ({"max_output_elements": 2 * 3 * 8}, "/v1/multi-head-attention", {"embeddings": np.ones((2, 3, 8)).tolist(),
     "n_heads": 2}, {"embeddings": np.ones((2, 4, 8)).tolist(), "n_heads": 2}, "max_output_elements", "/embeddings"),
    ({"max_output_elements": 4 * 2 * 3 * 8}, "/v1/multi-head-attention", {"embeddings": np.ones((2, 3, 8)).tolist(),
     "n_heads": 2, "trace": True}, {"embeddings": np.ones((2, 4, 8)).tolist(), "n_heads": 2, "trace": True},
     "max_output_elements", ("/embeddings", "/trace")),
    ({"max_output_elements": 4 * 2 * 3 * 8}, "/v1/self-attention", {"embeddings": np.ones((2, 3, 1)).tolist(),
     "d_k": 8, "trace": True}, {"embeddings": np.ones((2, 3, 1)).tolist(), "d_k": 9, "trace": True},
     "max_output_elements", ("/d_k", "/trace")),
    ({"max_output_elements": (1 + 7 * 2) * 3 * 8}, "/v1/encoder", {"embeddings": np.ones((3, 8)).tolist(),
     "n_heads": 1, "n_layers": 2, "trace": True}, {"embeddings": np.ones((4, 8)).tolist(), "n_heads": 1,
     "n_layers": 2, "trace": True}, "max_output_elements", ("/embeddings", "/trace")),
])
def test_limits_at_and_just_past_the_boundary(limits, path, at, past, name, pointer):
    """``pointer``: the member blamed, or the members (with trace, /trace too when it makes the difference)."""
    client = client_with(**limits)
    assert client.post(path, json=at).status_code == 200
    body = assert_problem(client.post(path, json=past), 422, *(pointer if isinstance(pointer, tuple) else (pointer,)))
    assert body["limit"]["name"] == name and body["limit"]["maximum"] == next(iter(limits.values()))
    assert body["type"].endswith("limit-exceeded") and name in body["detail"]


@pytest.mark.parametrize(("url", "parameter"), [("/v1/positional-encoding?n_positions={}&d_model=2", "n_positions"),
                                                ("/v1/positional-encoding?n_positions=2&d_model={}", "d_model"),
                                                ("/v1/causal-mask?size={}", "size")])
def test_query_limits_at_and_past_the_boundary(url, parameter):
    client = client_with(max_sequence_length=8, max_d_model=8)
    assert client.get(url.format(8)).status_code == 200
    assert assert_problem(client.get(url.format(9)), 422, parameter)["limit"]["value"] == 9


def test_json_depth_at_and_past_the_limit():
    client = client_with(max_json_depth=4)
    at = {"query": [[[1.0]]], "key": [[[1.0]]], "value": [[[1.0]]]}  # object + 3 arrays = depth 4
    assert client.post("/v1/attention", json=at).get_json()["output"] == [[[1.0]]]
    deep = b'{"query": [[[[1.0]]]], "note": "[[[[[[[["}'
    assert assert_problem(client.post("/v1/attention", data=deep, content_type="application/json"),
                          422, "")["limit"] == {"name": "max_json_depth", "maximum": 4, "value": 5}


def test_orjson_depth_never_reaches_a_recursive_validator(client):
    deep = b"[" * 1000 + b"]" * 1000
    body = assert_problem(client.post("/v1/attention", data=b'{"query": ' + deep + b"}",
                                      content_type="application/json"), 422)
    assert body["limit"]["name"] == "max_json_depth"


def test_body_bytes_at_and_past_the_limit():
    body = b'{"query": [[1.0]], "key": [[1.0]], "value": [[7.0]]}'
    at, past = client_with(max_body_bytes=len(body)), client_with(max_body_bytes=len(body) - 1)
    assert at.post("/v1/attention", data=body, content_type="application/json").get_json()["output"] == [[7.0]]
    assert_problem(past.post("/v1/attention", data=body, content_type="application/json"), 413)


def test_trace_is_blamed_for_its_own_limit_only():
    """Trace takes the weights past their limit: /trace is named. Without it, another limit (the encoder's
    feed-forward width) still refuses the request, and names what it judges."""
    client = client_with(max_weight_elements=2 * 3 * 3, max_output_elements=3 * 32)
    body = {"embeddings": np.ones((3, 8)).tolist(), "n_heads": 2, "n_layers": 1, "d_ff": 33}
    traced = assert_problem(client.post("/v1/encoder", json={**body, "trace": True}), 422, "/embeddings", "/trace")
    assert traced["limit"]["name"] == "max_weight_elements"
    plain = assert_problem(client.post("/v1/encoder", json=body), 422, "/d_ff")
    assert plain["limit"]["name"] == "max_output_elements"


@pytest.mark.parametrize(("path", "options"), [("/v1/self-attention", {}), ("/v1/multi-head-attention", {"n_heads": 1}),
                                               ("/v1/encoder", {"n_heads": 1})])
def test_the_weights_limit_names_the_member_that_holds_the_sentence(path, options):
    body = {"tokens": ["the", "cat", "ate"], **options}  # 9 weights
    assert_problem(client_with(max_weight_elements=8).post(path, json=body), 422, "/tokens")
    assert_problem(client_with(max_weight_elements=8).post(path, json={"embeddings": np.ones((3, 4)).tolist(),
                                                                       **options}), 422, "/embeddings")


def test_a_per_head_mask_counts_each_head_once():
    """(h, n, n) masks: their head axis is h, not a batch axis multiplying h again."""
    client = client_with(max_weight_elements=2 * 3 * 3)
    body = {"tokens": ["the", "cat", "ate"], "n_heads": 2}
    per_head = np.ones((2, 3, 3), dtype=bool).tolist()
    assert client.post("/v1/multi-head-attention", json={**body, "mask": per_head}).status_code == 200
    assert client.post("/v1/encoder", json={**body, "n_layers": 1, "mask": per_head}).status_code == 200
    over = assert_problem(client_with(max_weight_elements=17).post("/v1/multi-head-attention",
                                                                   json={**body, "mask": per_head}), 422, "/tokens")
    assert over["limit"] == {"name": "max_weight_elements", "maximum": 17, "value": 18}


@pytest.mark.parametrize(("return_weights", "arrays"), [(True, 5), (False, 4)])
def test_a_trace_counts_its_four_score_stages_and_the_weights_beside_them(return_weights, arrays):
    request = attention_of(2, 3)  # 6 weights
    assert client_with(max_weight_elements=6).post("/v1/attention", json=request).status_code == 200
    traced = {**request, "trace": True, "return_weights": return_weights}
    answer = client_with(max_weight_elements=6 * arrays).post("/v1/attention", json=traced)
    assert answer.status_code == 200
    returned = [answer.get_json()["weights"], *answer.get_json()["trace"].values()]
    assert sum(stage is not None for stage in returned) == arrays  # what the limit counts is what is returned
    refused = assert_problem(client_with(max_weight_elements=6 * arrays - 1).post("/v1/attention", json=traced),
                             422, "/query", "/trace")
    assert refused["limit"]["value"] == 6 * arrays
    assert refused["errors"][1]["detail"] == (f"trace=true counts {arrays} x 6 numbers against max_weight_elements; "
                                              "without it, 6.")


@pytest.mark.parametrize(("path", "body", "name"), [
    ("/v1/attention", attention_of(2, 3), "max_weight_elements"),
    ("/v1/multi-head-attention", {"embeddings": np.ones((2, 3, 8)).tolist(), "n_heads": 2}, "max_output_elements"),
])
def test_trace_is_blamed_only_when_the_request_passes_without_it(path, body, name):
    """Past the limit even without trace: the input alone is blamed, trace or not."""
    plain = assert_problem(client_with(**{name: 5}).post(path, json=body), 422)
    traced = assert_problem(client_with(**{name: 5}).post(path, json={**body, "trace": True}), 422)
    assert len(plain["errors"]) == len(traced["errors"]) == 1
    assert traced["errors"][0]["pointer"] == plain["errors"][0]["pointer"]
    assert traced["limit"]["name"] == plain["limit"]["name"] == name


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/attention", attention_of(3, 3)),
    ("/v1/multi-head-attention", {"tokens": ["the", "cat", "ate"], "n_heads": 2}),
    ("/v1/encoder", {"tokens": ["the", "cat", "ate"], "n_heads": 1, "n_layers": 2}),
])
def test_a_heatmap_too_large_is_refused_before_compute(path, body, monkeypatch):
    import attention

    def refuse(*args, **kwargs):
        raise AssertionError("computed")

    for name in ("scaled_dot_product_attention", "MultiHeadAttention", "Encoder"):
        monkeypatch.setattr(attention, name, refuse)
    problem = assert_problem(client_with(max_heatmap_cells=8).post(f"{path}?format=svg", json=body), 422, "format")
    assert problem["limit"]["name"] == "max_heatmap_cells" and problem["limit"]["value"] > 8
