"""The engine reproduces the seed script: same demo printouts, same numbers to 1e-12."""

from __future__ import annotations

import re

import numpy as np
import pytest

import attention
from tests.seed_reference import load_seed, printed

SEED_NAMES = ["EMBEDDINGS", "embed", "softmax", "scaled_dot_product_attention", "SelfAttention",
              "MultiHeadAttention", "positional_encoding", "causal_mask"]
DEMO_FUNCTIONS = ["demo_1_hand_built_lookup", "demo_2_scaling_matters", "demo_3_position_matters",
                  "demo_4_causal_mask", "demo_5_multihead"]
NUMBER = re.compile(r"-?\d+\.?\d*(?:e[-+]?\d+)?|True|False")


@pytest.fixture
def seed():
    saved = np.get_printoptions()
    try:
        yield load_seed()                      # the seed sets global print options on import
    finally:
        np.set_printoptions(**saved)


@pytest.fixture
def seed_on_engine():
    """The seed script's own demo code, with every function it calls taken from the engine."""
    saved = np.get_printoptions()
    module = load_seed()
    for name in SEED_NAMES:
        setattr(module, name, getattr(attention, name))
    yield module
    np.set_printoptions(**saved)


@pytest.mark.parametrize("demo", DEMO_FUNCTIONS)
def test_seed_demo_code_prints_the_same_numbers_on_the_engine(seed, seed_on_engine, demo):
    expected = printed(getattr(seed, demo))
    actual = printed(getattr(seed_on_engine, demo))
    assert NUMBER.findall(actual) == NUMBER.findall(expected)
    assert "raw scores" not in actual          # the engine names the scaled scores correctly


def test_lookup_demo_data(seed):
    data = attention.DEMOS["lookup"].run()
    x = seed.embed(seed_tokens())
    out, weights = seed.scaled_dot_product_attention(x[-1:], x, x)
    np.testing.assert_allclose(data["weights"], weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(data["output"], out[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(data["scaled_scores"], [[0, 0, 0, 0, 0.5]], atol=1e-15)
    np.testing.assert_allclose(data["scores"], [[0, 0, 0, 0, 1.0]], atol=1e-15)
    assert data["query_token"] == "it"


def test_scaling_demo_data(seed):
    rng = np.random.default_rng(1)
    rows = attention.DEMOS["scaling"].run()["rows"]
    for row, d_k in zip(rows, (4, 64, 512), strict=True):
        q, k = rng.normal(0, 1, (1, d_k)), rng.normal(0, 1, (10, d_k))
        raw = (q @ k.T)[0]
        assert row["d_k"] == d_k
        assert row["raw_std"] == pytest.approx(raw.std(), abs=1e-12)
        assert row["scaled_std"] == pytest.approx((raw / np.sqrt(d_k)).std(), abs=1e-12)
        assert row["raw_max_weight"] == pytest.approx(seed.softmax(raw).max(), abs=1e-12)
        assert row["scaled_max_weight"] == pytest.approx(seed.softmax(raw / np.sqrt(d_k)).max(), abs=1e-12)
    assert [round(r["raw_std"], 2) for r in rows] == [1.24, 5.73, 25.12]


def test_positional_demo_data(seed):
    data = attention.DEMOS["positional-encoding"].run()
    assert data["identical_without_positional_encoding"] is True
    assert data["identical_with_positional_encoding"] is False
    np.testing.assert_allclose(data["positional_encoding"], seed.positional_encoding(3, 4), rtol=0, atol=1e-12)


def test_causal_demo_data(seed):
    data = attention.DEMOS["causal-mask"].run()
    tokens = seed_tokens()
    x = seed.embed(tokens) + seed.positional_encoding(5, 4)
    _, weights = seed.SelfAttention(4, 4, seed=3)(x, mask=seed.causal_mask(5))
    np.testing.assert_allclose(data["weights"], weights, rtol=0, atol=1e-12)
    assert (data["mask"] == seed.causal_mask(5)).all()


def test_multi_head_demo_data(seed):
    data = attention.DEMOS["multi-head"].run()
    tokens = seed_tokens()
    x = np.pad(seed.embed(tokens), ((0, 0), (0, 4))) + seed.positional_encoding(5, 8)
    out, heads = seed.MultiHeadAttention(8, 4)(x, mask=seed.causal_mask(5))
    np.testing.assert_allclose(data["weights"], np.stack(heads), rtol=0, atol=1e-12)
    np.testing.assert_allclose(data["output"], out, rtol=0, atol=1e-12)
    assert data["strongest_links"] == [[tokens[int(np.argmax(row))] for row in w] for w in heads]
    assert data["output_shape"] == [5, 8]


def test_seeded_weights_are_the_seeds(seed):
    ours, theirs = attention.MultiHeadAttention(8, 4), seed.MultiHeadAttention(8, 4)
    for i, head in enumerate(theirs.heads):
        np.testing.assert_array_equal(ours.w_q[i], head.W_q)
        np.testing.assert_array_equal(ours.w_k[i], head.W_k)
        np.testing.assert_array_equal(ours.w_v[i], head.W_v)
    np.testing.assert_array_equal(ours.w_o, theirs.W_o)
    single = attention.SelfAttention(4, 4, seed=7)
    np.testing.assert_array_equal(single.W_q, seed.SelfAttention(4, 4, seed=7).W_q)


def test_shifted_seed_uses_consecutive_head_seeds():
    mha = attention.MultiHeadAttention(8, 2, seed=5)
    np.testing.assert_array_equal(mha.w_k[1], attention.SelfAttention(8, 4, seed=6).W_k)
    np.testing.assert_array_equal(mha.w_o, np.random.default_rng(104).normal(0, 0.5, (8, 8)))


def test_cli_prints_every_demo(capsys):
    from attention.__main__ import main

    main()
    text = capsys.readouterr().out
    for number, demo in enumerate(attention.DEMOS.values(), start=1):
        assert f"DEMO {number}: {demo.title}" in text
    assert "head 3 -- what each token attends to" in text
    assert "it    -> strongest link: food   weights: [0.042 0.024 0.042 0.619 0.272]" in text
    assert "raw    score std:  25.12  ->  max softmax weight: 1.0000" in text


def seed_tokens() -> list[str]:
    return ["the", "cat", "ate", "food", "it"]
