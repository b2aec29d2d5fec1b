"""Vocabulary, embeddings, positional encoding, causal mask, demos and health through HTTP."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from tests.conftest import ROOT, assert_problem

DEMO_NAMES = ["lookup", "scaling", "positional-encoding", "causal-mask", "multi-head"]


def test_vocabulary_is_the_seed_s(client, seed_script):
    body = client.get("/v1/vocabulary").get_json()
    assert body["dimensions"] == ["animal", "action", "food", "pronoun"]
    assert body["tokens"] == {word: vector.tolist() for word, vector in seed_script.EMBEDDINGS.items()}


def test_embed_pads_and_adds_positions(client, seed_script):
    body = client.post("/v1/embed", json={"tokens": ["cat", "it"], "d_model": 6, "positional_encoding": True})
    expected = np.pad(seed_script.embed(["cat", "it"]), ((0, 0), (0, 2))) + seed_script.positional_encoding(2, 6)
    np.testing.assert_allclose(body.get_json()["embeddings"], expected, rtol=1e-15)
    assert client.post("/v1/embed", json={"tokens": ["food"]}).get_json() == {"embeddings": [[0.0, 0.0, 1.0, 0.0]]}


def test_positional_encoding_is_the_seed_s(client, seed_script):
    body = client.get("/v1/positional-encoding?n_positions=7&d_model=6").get_json()
    np.testing.assert_allclose(body["encoding"], seed_script.positional_encoding(7, 6), rtol=1e-15)
    rounded = client.get("/v1/positional-encoding?n_positions=2&d_model=2&decimals=3").get_json()
    assert rounded == {"encoding": [[0.0, 1.0], [0.841, 0.54]]}


def test_causal_mask(client):
    assert client.get("/v1/causal-mask?size=3").get_json() == {
        "mask": [[True, False, False], [True, True, False], [True, True, True]]}


def test_demo_list(client):
    demos = client.get("/v1/demos").get_json()["demos"]
    assert [d["name"] for d in demos] == DEMO_NAMES
    assert all(d["title"] and d["summary"] for d in demos)


@pytest.mark.parametrize("name", DEMO_NAMES)
def test_each_demo_runs(client, name):
    body = client.get(f"/v1/demos/{name}").get_json()
    assert body["name"] == name and isinstance(body["result"], dict) and body["result"]


def test_demo_numbers_are_the_seed_s(client, seed_script):
    tokens = ["the", "cat", "ate", "food", "it"]
    x = seed_script.embed(tokens)
    _, lookup = seed_script.scaled_dot_product_attention(x[-1:], x, x)
    np.testing.assert_allclose(client.get("/v1/demos/lookup").get_json()["result"]["weights"], lookup, rtol=1e-12)
    x = seed_script.embed(tokens) + seed_script.positional_encoding(5, 4)
    _, causal = seed_script.SelfAttention(4, 4, seed=3)(x, mask=seed_script.causal_mask(5))
    result = client.get("/v1/demos/causal-mask").get_json()["result"]
    np.testing.assert_allclose(result["weights"], causal, rtol=1e-12, atol=1e-15)
    assert result["mask"] == seed_script.causal_mask(5).tolist()
    positional = client.get("/v1/demos/positional-encoding").get_json()["result"]
    assert positional["identical_without_positional_encoding"] is True
    assert positional["identical_with_positional_encoding"] is False


def test_the_documented_demo_answer_is_the_real_one_cut_short(client):
    """The spec's example for GET /v1/demos/{name}: causal-mask's own numbers, its first two tokens, rounded."""
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    example = spec["paths"]["/v1/demos/{name}"]["get"]["responses"]["200"]["content"]["application/json"]["example"]
    real = client.get("/v1/demos/causal-mask").get_json()
    assert example["name"] == "causal-mask" and example["result"]["tokens"] == real["result"]["tokens"][:2]
    assert example["result"]["mask"] == [row[:2] for row in real["result"]["mask"][:2]]
    np.testing.assert_allclose(example["result"]["weights"], np.array(real["result"]["weights"])[:2, :2], atol=5e-5)


def test_unknown_demo_is_404_naming_the_demos(client):
    assert "multi-head" in assert_problem(client.get("/v1/demos/nope"), 404)["detail"]


def test_health_and_readiness(client, monkeypatch):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    assert client.get("/readyz").get_json() == {"status": "ready"}

    def broken(*args, **kwargs):
        raise RuntimeError("engine down")

    monkeypatch.setattr("attention.scaled_dot_product_attention", broken)
    assert_problem(client.get("/readyz"), 503)
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(("size", "detail"), [("-1", "Must be greater than or equal to 1."),
                                              ("+3", "Not a valid integer."), ("1_000", "Not a valid integer.")])
def test_query_integers_are_ascii_digits_and_their_range_is_named(client, size, detail):
    problem = assert_problem(client.get(f"/v1/causal-mask?size={size}"), 422, "size")
    assert problem["errors"][0]["detail"] == detail
