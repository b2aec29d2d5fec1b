"""SelfAttention, MultiHeadAttention, the encoder, and every invalid argument."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attention
from attention import AttentionError


@pytest.fixture
def rng():
    return np.random.default_rng(99)


def per_head_loop(mha: attention.MultiHeadAttention, x: np.ndarray, mask=None):
    """The seed's way: one SelfAttention-style pass per head, concat, mix (2-D x only)."""
    outs, weights = [], []
    for h in range(mha.n_heads):
        single = attention.SelfAttention(mha.d_model, mha.d_k, w_q=mha.w_q[h], w_k=mha.w_k[h], w_v=mha.w_v[h])
        o, w = single(x, mask)
        outs.append(o)
        weights.append(w)
    return np.concatenate(outs, axis=-1) @ mha.w_o, np.stack(weights)


def test_multi_head_batched_equals_per_item_per_head(rng):
    mha = attention.MultiHeadAttention(12, 3, seed=4)
    x = rng.normal(size=(4, 6, 12))
    mask = rng.random((4, 6, 6)) > 0.3
    out, weights = mha(x, mask)
    assert out.shape == (4, 6, 12) and weights.shape == (4, 3, 6, 6)
    for b in range(4):
        ref_out, ref_w = per_head_loop(mha, x[b], mask[b])
        np.testing.assert_allclose(out[b], ref_out, atol=1e-12)
        np.testing.assert_allclose(weights[b], ref_w, atol=1e-12)


@pytest.mark.parametrize("mask_shape", [None, (6,), (6, 6), (3, 6, 6), (2, 1, 6, 6), (2, 3, 6, 6),   # shared by heads
                                        (1, 1, 3, 6, 6), (2, 1, 3, 6, 6), (2, 3, 3, 6, 6)])            # one per head
@pytest.mark.parametrize("return_weights", [True, False])
def test_chunks_of_batch_items_change_nothing(rng, monkeypatch, mask_shape, return_weights):
    """Items in chunks (memory) give bit for bit what one chunk gives, for masks shared by every item,
    per item over one or two batch axes, and per head; and agree with the seed's per-head loop."""
    mha = attention.MultiHeadAttention(12, 3, seed=4)
    x = rng.normal(size=(2, 3, 6, 12))                                  # two batch axes: 6 items
    mask = None if mask_shape is None else rng.random(mask_shape) > 0.3
    whole = mha(x, mask, causal=True, return_weights=return_weights)
    monkeypatch.setattr(attention.multihead, "CHUNK_BYTES", 1)           # one item per chunk
    chunked = mha(x, mask, causal=True, return_weights=return_weights)
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_array_equal(a, b)
    if mask is None:
        mask = np.ones((6, 6), bool)
    per_head = mask.ndim == x.ndim + 1
    full = np.broadcast_to(mask if per_head else np.broadcast_to(mask, (2, 3, 6, 6))[:, :, None], (2, 3, 3, 6, 6))
    full = full & np.tri(6, dtype=bool)                                 # causal=True on top
    for item in np.ndindex(2, 3):
        heads = [attention.SelfAttention(12, 4, w_q=mha.w_q[h], w_k=mha.w_k[h], w_v=mha.w_v[h])(x[item], full[item][h])
                 for h in range(3)]
        ref_out = np.concatenate([o for o, _ in heads], axis=-1) @ mha.w_o
        np.testing.assert_allclose(chunked[0][item], ref_out, atol=1e-12)
        if return_weights:
            np.testing.assert_allclose(chunked[1][item], np.stack([w for _, w in heads]), atol=1e-12)


def test_per_head_mask(rng):
    mha = attention.MultiHeadAttention(8, 2)
    x = rng.normal(size=(5, 8))
    mask = np.ones((2, 5, 5), bool)
    mask[1] = np.tri(5, dtype=bool)                      # head 1 causal, head 0 sees everything
    _, weights = mha(x, mask)
    assert (weights[0] > 0).all()
    assert (weights[1][~np.tri(5, dtype=bool)] == 0).all()


def test_explicit_weights_equal_seeded_ones(rng):
    seeded = attention.MultiHeadAttention(8, 4, seed=2)
    explicit = attention.MultiHeadAttention(8, 4, w_q=seeded.w_q, w_k=seeded.w_k, w_v=seeded.w_v, w_o=seeded.w_o)
    x = rng.normal(size=(3, 8))
    for a, b in zip(seeded(x, causal=True), explicit(x, causal=True), strict=True):
        np.testing.assert_array_equal(a, b)


def test_multi_head_trace(rng):
    mha = attention.MultiHeadAttention(8, 4)
    x = rng.normal(size=(2, 5, 8))
    trace = mha.trace(x, causal=True)
    out, weights = mha(x, causal=True)
    assert trace.q.shape == (2, 4, 5, 2) and trace.scores.shape == (2, 4, 5, 5)
    np.testing.assert_array_equal(trace.weights, weights)          # a learner sees the very same numbers
    np.testing.assert_array_equal(trace.output, out)
    assert trace.masked_scores.mask[..., 0, 1:].all()


def test_self_attention_weights_off_and_float32(rng):
    layer = attention.SelfAttention(6, 3, seed=1)
    x = rng.normal(size=(4, 6))
    out, weights = layer(x)
    out_only, none = layer(x, return_weights=False)
    assert none is None and out.shape == (4, 3) and weights.shape == (4, 4)
    np.testing.assert_array_equal(out_only, out)
    out32, w32 = layer(x.astype(np.float32))
    assert out32.dtype == w32.dtype == np.float32
    np.testing.assert_allclose(out32, out, atol=1e-5)


def test_encoder_block_and_stack(rng):
    x = rng.normal(size=(2, 7, 16))
    block = attention.EncoderBlock(16, 4, d_ff=32, seed=3)
    out, weights = block(x, causal=True)
    assert out.shape == x.shape and weights.shape == (2, 4, 7, 7)
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-12)        # layer norm: mean 0, variance ~1
    np.testing.assert_allclose(out.var(-1), 1, atol=1e-4)
    attended, _ = block.attention(x, causal=True)
    middle = attention.layer_norm(x + attended)
    hidden = np.maximum(middle @ block.w_1, 0)
    np.testing.assert_allclose(out, attention.layer_norm(middle + hidden @ block.w_2), atol=1e-12)
    encoder = attention.Encoder(16, 4, n_layers=3, d_ff=32, seed=3)
    stacked, per_layer = encoder(x, causal=True)
    assert len(per_layer) == 3 and stacked.shape == x.shape
    np.testing.assert_array_equal(per_layer[0], weights)            # layer 0 is EncoderBlock(seed=3)
    again, _ = attention.Encoder(16, 4, n_layers=3, d_ff=32, seed=3)(x, causal=True)
    np.testing.assert_array_equal(again, stacked)                   # deterministic from the seed
    out32, _ = encoder(x.astype(np.float32), causal=True)
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, stacked, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), max_size=2),
    n_q=st.integers(1, 9), n_k=st.integers(1, 9), d_k=st.integers(1, 6), d_v=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1), causal=st.booleans(),
)
def test_property_weights_are_distributions(batch, n_q, n_k, d_k, d_v, seed, causal):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(*batch, n_q, d_k))
    k = rng.normal(size=(*batch, n_k, d_k))
    v = rng.normal(size=(*batch, n_k, d_v))
    mask = rng.random((*batch, n_q, n_k)) > 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, weights = attention.scaled_dot_product_attention(q, k, v, mask, causal=causal)
    visible = mask & (np.tri(n_q, n_k, dtype=bool) if causal else True)
    assert out.shape == (*batch, n_q, d_v)
    assert (weights[~visible] == 0).all() and (weights >= 0).all()
    sums = weights.sum(-1)
    np.testing.assert_allclose(sums[visible.any(-1)], 1.0, atol=1e-12)
    assert (sums[~visible.any(-1)] == 0).all()
    assert np.isfinite(out).all()


@settings(max_examples=30, deadline=None)
@given(n_heads=st.sampled_from([1, 2, 4]), n=st.integers(1, 7), seed=st.integers(0, 1000))
def test_property_permutation_equivariance(n_heads, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8))
    perm = rng.permutation(n)
    mha = attention.MultiHeadAttention(8, n_heads, seed=seed)
    out, _ = mha(x)
    out_p, _ = mha(x[perm])
    np.testing.assert_allclose(out_p, out[perm], atol=1e-10)


# ---------------------------------------------------------------------------
# invalid arguments: a ValueError subclass naming the argument and what was expected
# ---------------------------------------------------------------------------
Q = np.ones((3, 4))
INVALID = [
    ("query rank", lambda: attention.scaled_dot_product_attention(np.ones(4), Q, Q), "query", "rank"),
    ("key d_k", lambda: attention.scaled_dot_product_attention(Q, np.ones((3, 5)), Q), "key", "d_k = 4"),
    ("value n_k", lambda: attention.scaled_dot_product_attention(Q, Q, np.ones((2, 4))), "value", "n_k = 3"),
    ("batch", lambda: attention.scaled_dot_product_attention(np.ones((2, 3, 4)), np.ones((3, 3, 4)), Q),
     "key", "do not broadcast"),
    ("mask dtype", lambda: attention.scaled_dot_product_attention(Q, Q, Q, np.ones((3, 3))), "mask", "boolean"),
    ("mask shape", lambda: attention.scaled_dot_product_attention(Q, Q, Q, np.ones((2, 3), bool)), "mask",
     "(3, 3)"),
    ("nan", lambda: attention.scaled_dot_product_attention(Q * np.nan, Q, Q), "query", "finite"),
    ("bool input", lambda: attention.scaled_dot_product_attention(Q > 0, Q, Q), "query", "numeric"),
    ("scale", lambda: attention.scaled_dot_product_attention(Q, Q, Q, scale=float("inf")), "scale", "finite"),
    ("heads divide", lambda: attention.MultiHeadAttention(8, 3), "n_heads", "divisible"),
    ("heads zero", lambda: attention.MultiHeadAttention(8, 0), "n_heads", "positive"),
    ("seed negative", lambda: attention.MultiHeadAttention(8, 2, seed=-1), "seed", "non-negative"),
    ("seed fraction", lambda: attention.SelfAttention(4, 4, seed=1.5), "seed", "non-negative integer"),
    ("seed bool", lambda: attention.SelfAttention(4, 4, seed=True), "seed", "non-negative integer"),
    ("heads bool", lambda: attention.MultiHeadAttention(8, True), "n_heads", "positive integer"),
    ("heads numpy negative", lambda: attention.MultiHeadAttention(8, np.int64(-2)), "n_heads", "positive integer"),
    ("x width", lambda: attention.MultiHeadAttention(8, 2)(np.ones((3, 5))), "X", "d_model=8"),
    ("w_q shape", lambda: attention.MultiHeadAttention(8, 2, w_q=np.ones((2, 8, 3)), w_k=np.ones((2, 8, 4)),
                                                       w_v=np.ones((2, 8, 4)), w_o=np.ones((8, 8))),
     "w_q", "(n_heads, d_model, d_k) = (2, 8, 4)"),
    ("w_o shape", lambda: attention.MultiHeadAttention(4, 2, w_q=np.ones((2, 4, 2)), w_k=np.ones((2, 4, 2)),
                                                       w_v=np.ones((2, 4, 2)), w_o=np.ones((4, 3))),
     "w_o", "(4, 4)"),
    ("partial weights", lambda: attention.SelfAttention(4, 4, w_q=np.ones((4, 4))), "weights", "all of"),
    ("self w_v", lambda: attention.SelfAttention(4, 2, w_q=np.ones((4, 2)), w_k=np.ones((4, 2)),
                                                 w_v=np.ones((4, 3))), "w_v", "(d_model, d_k) = (4, 2)"),
    ("mha mask", lambda: attention.MultiHeadAttention(8, 2)(np.ones((3, 8)), np.ones((4, 4), bool)), "mask",
     "(3, 3)"),
    ("unknown token", lambda: attention.embed(["cat", "dog"]), "tokens", "'dog'"),
    ("empty tokens", lambda: attention.embed([]), "tokens", "non-empty"),
    ("narrow d_model", lambda: attention.embed(["cat"], 3), "d_model", "at least 4"),
    ("positions", lambda: attention.positional_encoding(0, 4), "n_positions", "positive"),
    ("causal size", lambda: attention.causal_mask(-2), "n", "positive"),
    ("lengths", lambda: attention.padding_mask([1, 9], 4), "lengths", "[0, 4]"),
    ("softmax nan", lambda: attention.softmax(np.array([np.nan])), "x", "NaN"),
    ("layers", lambda: attention.Encoder(8, 2, n_layers=0), "n_layers", "positive"),
]


@pytest.mark.parametrize(("case", "call", "argument", "words"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_arguments_raise_clear_errors(case, call, argument, words):
    with pytest.raises(AttentionError) as caught:
        call()
    assert isinstance(caught.value, ValueError)
    assert caught.value.argument == argument
    assert words in str(caught.value)


def test_unknown_token_error_lists_both_sides():
    with pytest.raises(attention.UnknownTokenError) as caught:
        attention.embed(["the", "dog", "ran"])
    assert caught.value.unknown == ["dog", "ran"]
    assert caught.value.known == ["the", "cat", "ate", "food", "it"]


def test_encoder_trace_matches_the_forward_pass(rng):
    x = rng.normal(size=(6, 8))
    encoder = attention.Encoder(8, 2, n_layers=2, d_ff=16, seed=1)
    output, per_layer = encoder(x, causal=True)
    layers = encoder.trace(x, causal=True)
    assert len(layers) == 2
    np.testing.assert_allclose(layers[-1].output, output, atol=1e-12)
    for traced, weights in zip(layers, per_layer, strict=True):
        np.testing.assert_allclose(traced.attention.weights, weights, atol=1e-13)
    first = layers[0]
    np.testing.assert_allclose(first.add_norm_1, attention.layer_norm(x + first.attention.output), atol=1e-12)
    np.testing.assert_allclose(first.output, attention.layer_norm(first.add_norm_1 + first.feed_forward), atol=1e-12)
    stages = first.as_dict()
    assert list(stages) == ["attention", "add_norm_1", "feed_forward", "output"]
    assert stages["attention"]["q"].shape == (2, 6, 4)


def test_numpy_integers_are_accepted_as_sizes_and_seeds():
    layer = attention.MultiHeadAttention(np.int64(8), np.int32(2), seed=np.uint8(3))
    assert (layer.d_model, layer.n_heads, layer.d_k) == (8, 2, 4) and type(layer.n_heads) is int
    np.testing.assert_array_equal(layer.w_q, attention.MultiHeadAttention(8, 2, seed=3).w_q)


def test_seeded_weights_are_memoised_and_read_only():
    first, again = attention.MultiHeadAttention(512, 8, seed=11), attention.MultiHeadAttention(512, 8, seed=11)
    assert first.w_o is again.w_o                                    # drawn once, shared
    assert not first.w_q.flags.writeable and not first.w_o.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        first.w_q[0, 0, 0] = 1.0
    np.testing.assert_array_equal(first.w_k[3], attention.SelfAttention(512, 64, seed=14).W_k)


def test_seeded_feed_forward_weights_are_memoised_and_read_only():
    first, again = attention.EncoderBlock(64, 4, seed=5), attention.EncoderBlock(64, 4, seed=5)
    assert first.w_1 is again.w_1 and first.w_2 is again.w_2         # drawn once, shared
    assert not first.w_1.flags.writeable and not first.w_2.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        first.w_2[0, 0] = 1.0
    rng = np.random.default_rng(5 + 200)                             # the documented draw, in its order
    np.testing.assert_array_equal(first.w_1, rng.normal(0, 1 / np.sqrt(64), (64, 256)))
    np.testing.assert_array_equal(first.w_2, rng.normal(0, 1 / np.sqrt(256), (256, 64)))
    assert attention.EncoderBlock(64, 4, d_ff=128, seed=5).w_1.shape == (64, 128)  # the key has d_ff


def test_integer_inputs_are_normalised_and_fed_forward_as_float64():
    """In an integer dtype eps would be 0 (a constant row: 0/0) and the weights would round to 0."""
    ints = np.array([[1, 1, 1, 1], [1, 2, 3, 4]])
    np.testing.assert_array_equal(attention.layer_norm(ints), attention.layer_norm(ints.astype(float)))
    assert not attention.layer_norm(ints)[0].any()
    block = attention.EncoderBlock(4, 2, seed=1)
    np.testing.assert_array_equal(block.feed_forward(ints), block.feed_forward(ints.astype(float)))
    assert block.feed_forward(ints).any()
    with pytest.raises(attention.AttentionError, match="d_model=4"):
        block.feed_forward(np.ones((2, 5)))


def test_explicit_weights_are_copied_not_frozen(rng):
    w = {name: rng.normal(size=(2, 4, 2)) for name in ("w_q", "w_k", "w_v")}
    w_o = rng.normal(size=(4, 4))
    mha = attention.MultiHeadAttention(4, 2, **w, w_o=w_o)
    w_o[0, 0] = 99.0                                                  # the caller's array stays theirs
    assert w_o.flags.writeable and mha.w_o[0, 0] != 99.0


def test_byte_budget_memo_evicts_least_recently_used():
    from attention._memo import ByteBudgetMemo

    built = []
    memo = ByteBudgetMemo(lambda n: built.append(n) or np.zeros(n), lambda a: a.nbytes, max_bytes=8 * 10)
    memo(4), memo(4), memo(5)
    assert built == [4, 5]                                           # the second call was a hit
    memo(4)                                                          # 4 is now the most recent
    memo(3)                                                          # 4 + 5 + 3 > 10 elements: evict 5
    memo(5)
    assert built == [4, 5, 3, 5]
    memo(11)                                                         # larger than the budget: never kept
    memo(11)
    assert built[-2:] == [11, 11]


def test_byte_budget_memo_keeps_one_of_two_builds_of_a_key_at_once():
    """Two threads missing the same key both build it; counting both made phantom bytes that evicted
    everything for good. (Simulated without threads: the build itself asks for its key once.)"""
    from attention._memo import ByteBudgetMemo

    built = []

    def build(n: int) -> np.ndarray:
        built.append(n)
        if len(built) == 1:
            memo(n)                                                  # "another thread" builds the same key now
        return np.zeros(n)

    memo = ByteBudgetMemo(build, lambda a: a.nbytes, max_bytes=8 * 10)
    first = memo(4)
    assert memo(4) is first and built == [4, 4]
    memo(5)                                                          # 4 + 5 <= 10 elements: both kept
    memo(4), memo(5)
    assert built == [4, 4, 5]


def test_weights_cast_for_float32_are_shared_read_only_like_the_float64_ones():
    block = attention.EncoderBlock(8, 2, seed=4)
    block(np.ones((3, 8), dtype=np.float32))                         # casts the weights once
    for cache in (block._cast, block.attention._cast):
        assert all(not w.flags.writeable for w in cache[np.dtype(np.float32)].values())


def test_feed_forward_takes_one_token_as_a_vector():
    block = attention.EncoderBlock(4, 2, seed=1)
    np.testing.assert_array_equal(block.feed_forward(np.arange(4.0)), block.feed_forward(np.arange(4.0)[None])[0])
