"""scaled_dot_product_attention, softmax, masks and the trace: numbers and properties."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import attention
from attention import _checks, kernel
from attention._checks import SMALL_CHECK


def reference(q, k, v, mask=None):
    """The textbook formula, one 2-D problem at a time (slow, obviously right)."""
    scores = q @ k.T / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = np.zeros_like(scores)
    for i, row in enumerate(scores):
        if np.isfinite(row).any():
            e = np.exp(row - row[np.isfinite(row)].max())
            weights[i] = e / e.sum()
    return weights @ v, weights


@pytest.fixture(autouse=True)
def numpy_warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(params=[None, 257], ids=["one-tile", "many-tiles"])
def tile_elements(request, monkeypatch):
    """Run each test once as a single tile and once split into many small tiles."""
    if request.param:
        monkeypatch.setattr(kernel, "TILE_BYTES", request.param * 8)
    return request.param


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_matches_reference_batched_and_masked(rng, batch, tile_elements):
    n_q, n_k, d_k, d_v = 7, 11, 5, 3
    q = rng.normal(size=(*batch, n_q, d_k))
    k = rng.normal(size=(*batch, n_k, d_k))
    v = rng.normal(size=(*batch, n_k, d_v))
    mask = rng.random((*batch, n_q, n_k)) > 0.4
    out, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (*batch, n_q, d_v) and weights.shape == (*batch, n_q, n_k)
    for index in np.ndindex(*batch):
        ref_out, ref_w = reference(q[index], k[index], v[index], mask[index])
        np.testing.assert_allclose(out[index], ref_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(weights[index], ref_w, rtol=1e-12, atol=1e-12)


def test_rows_sum_to_one_and_masked_weights_are_exactly_zero(rng, tile_elements):
    q, k, v = rng.normal(size=(4, 9, 6)), rng.normal(size=(4, 13, 6)), rng.normal(size=(4, 13, 2))
    mask = rng.random((4, 9, 13)) > 0.5
    mask[..., 0] = True                                  # every row keeps one key
    _, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert (weights[~mask] == 0.0).all()
    assert (weights[mask] > 0).all()


def test_causal_upper_triangle_is_exactly_zero(rng, tile_elements):
    x = rng.normal(size=(2, 8, 4))
    _, weights = attention.scaled_dot_product_attention(x, x, x, causal=True)
    upper = np.triu(np.ones((8, 8), bool), 1)
    assert (weights[:, upper] == 0.0).all()
    _, with_mask = attention.scaled_dot_product_attention(x, x, x, attention.causal_mask(8))
    np.testing.assert_array_equal(weights, with_mask)


def test_fully_masked_rows_give_zero_weights_and_zero_output(rng, tile_elements):
    q, k, v = rng.normal(size=(5, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 3))
    mask = np.ones((5, 6), bool)
    mask[1] = False
    out, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    assert (weights[1] == 0).all() and (out[1] == 0).all()
    assert np.isfinite(out).all()
    trace = attention.trace_attention(q, k, v, mask)
    assert (trace.weights[1] == 0).all() and trace.masked_scores.mask[1].all()


def test_padding_mask_hides_keys_past_each_length(rng, tile_elements):
    q, k, v = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 6, 3)), rng.normal(size=(2, 6, 2))
    mask = attention.padding_mask([2, 6], 6)
    assert mask.shape == (2, 1, 6)
    _, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    assert (weights[0, :, 2:] == 0).all() and (weights[1] > 0).all()
    _, short = attention.scaled_dot_product_attention(q[:1], k[:1, :2], v[:1, :2])
    np.testing.assert_allclose(weights[0, :, :2], short[0], atol=1e-15)


def test_mask_broadcast_over_batch_matches_explicit_copy(rng, tile_elements):
    q, k, v = rng.normal(size=(3, 2, 5, 4)), rng.normal(size=(3, 2, 7, 4)), rng.normal(size=(3, 2, 7, 4))
    mask = rng.random((3, 1, 5, 7)) > 0.3
    broadcast = attention.scaled_dot_product_attention(q, k, v, mask)
    explicit = attention.scaled_dot_product_attention(q, k, v, np.broadcast_to(mask, (3, 2, 5, 7)).copy())
    for a, b in zip(broadcast, explicit, strict=True):
        np.testing.assert_array_equal(a, b)


def test_custom_scale_and_weights_off(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    out, weights = attention.scaled_dot_product_attention(q, k, v, scale=1.0)
    ref_w = np.exp(q @ k.T) / np.exp(q @ k.T).sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, ref_w, rtol=1e-12)
    out_only, none = attention.scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=False)
    assert none is None
    np.testing.assert_array_equal(out_only, out)


def test_permutation_equivariance_without_positional_encoding(rng):
    x = rng.normal(size=(6, 8))
    perm = rng.permutation(6)
    mha = attention.MultiHeadAttention(8, 2, seed=3)
    out, weights = mha(x)
    out_p, weights_p = mha(x[perm])
    np.testing.assert_allclose(out_p, out[perm], atol=1e-12)
    np.testing.assert_allclose(weights_p, weights[:, perm][:, :, perm], atol=1e-12)


def test_float32_stays_float32_and_agrees_with_float64(rng, tile_elements):
    q, k, v = (rng.normal(size=(2, 16, 8)) for _ in range(3))
    mask = rng.random((16, 16)) > 0.2
    out64, w64 = attention.scaled_dot_product_attention(q, k, v, mask)
    out32, w32 = attention.scaled_dot_product_attention(*(a.astype(np.float32) for a in (q, k, v)), mask)
    assert out32.dtype == w32.dtype == np.float32
    np.testing.assert_allclose(out32, out64, atol=1e-5)
    np.testing.assert_allclose(w32, w64, atol=1e-5)
    trace = attention.trace_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    assert all(a.dtype == np.float32 for a in trace.as_dict().values())


def test_mixed_or_integer_inputs_compute_in_float64():
    q = np.ones((2, 2), dtype=np.float32)
    out, weights = attention.scaled_dot_product_attention(q, np.ones((2, 2)), np.arange(4).reshape(2, 2))
    assert out.dtype == weights.dtype == np.float64


def test_softmax_matches_formula_and_handles_masked_rows():
    x = np.array([[1.0, 2.0, 3.0], [-np.inf, -np.inf, -np.inf], [1000.0, 1000.0, -np.inf]])
    result = attention.softmax(x)
    e = np.exp([1.0, 2.0, 3.0])
    np.testing.assert_allclose(result[0], e / e.sum(), rtol=1e-15)
    np.testing.assert_array_equal(result[1], [0, 0, 0])
    np.testing.assert_array_equal(result[2], [0.5, 0.5, 0])
    np.testing.assert_allclose(attention.softmax(np.arange(6.0).reshape(2, 3), axis=0).sum(0), 1.0)


def test_trace_names_each_stage(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    mask = np.tri(3, 5, dtype=bool)
    trace = attention.trace_attention(q, k, v, mask)
    np.testing.assert_allclose(trace.scores, q @ k.T, rtol=1e-15)
    np.testing.assert_allclose(trace.scaled_scores, q @ k.T / 2.0, rtol=1e-15)
    np.testing.assert_array_equal(trace.masked_scores.mask, ~mask)
    out, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(trace.weights, weights, atol=1e-15)
    np.testing.assert_allclose(trace.output, out, atol=1e-15)
    stages = trace.as_dict()
    assert list(stages) == ["scores", "scaled_scores", "masked_scores", "weights", "output"]
    assert np.isnan(stages["masked_scores"][~mask]).all()


def test_verbose_prints_stages_named_correctly(rng, capsys):
    x = np.eye(3)
    attention.scaled_dot_product_attention(x, x, x, verbose=True)
    text = capsys.readouterr().out
    assert "scaled scores (QK^T / sqrt(d_k))" in text and "row sums: [1. 1. 1.]" in text


def test_positional_encoding_values():
    pe = attention.positional_encoding(50, 6)
    pos = np.arange(50)
    np.testing.assert_allclose(pe[:, 0], np.sin(pos), atol=1e-15)
    np.testing.assert_allclose(pe[:, 1], np.cos(pos), atol=1e-15)
    np.testing.assert_allclose(pe[:, 4], np.sin(pos / 10000 ** (4 / 6)), atol=1e-15)
    assert attention.positional_encoding(3, 4, dtype=np.float32).dtype == np.float32


def test_embed_pads_to_d_model():
    x = attention.embed(["cat", "it"], 6)
    np.testing.assert_array_equal(x, [[1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]])
    assert attention.embed(["the"]).shape == (1, 4)


def test_overflowing_scores_are_reported_not_nan():
    q = np.full((2, 4), 1e200)
    with pytest.raises(attention.AttentionError, match="overflow"):
        attention.scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize("layer", [attention.SelfAttention(4, 4), attention.MultiHeadAttention(4, 2)])
def test_a_trace_reports_projections_that_overflow_as_an_overflow(layer):
    """Not "values must be finite": the input is finite, its projections (or scores) overflowed."""
    with pytest.raises(attention.AttentionError, match="overflowed"):
        layer.trace(np.full((3, 4), 1.7e308))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_scores_overflowing_to_minus_infinity_are_not_taken_for_masked(dtype):
    big = 1e200 if dtype == np.float64 else 1e30
    q = np.array([[big, 1.0], [1.0, 1.0]], dtype=dtype)
    k = np.array([[-big, 1.0], [1.0, 1.0]], dtype=dtype)
    with pytest.raises(attention.AttentionError, match="overflow"):
        attention.scaled_dot_product_attention(q, k, k)
    with pytest.raises(attention.AttentionError, match="overflow"):
        attention.trace_attention(q, k, k)
    with pytest.raises(attention.AttentionError, match="overflow"):
        attention.SelfAttention(2, 2)(np.array([[1e200, 1], [1, 1]]))


# --- found by an audit of the engine -------------------------------------------------------------
def test_layer_norm_of_rows_too_large_to_square_is_an_error_not_zeros():
    x = np.random.default_rng(0).normal(size=(1, 8))
    with pytest.raises(attention.AttentionError, match="layer norm overflowed"):
        attention.EncoderBlock(8, 2)(x * 1e154)
    with pytest.raises(attention.AttentionError, match="layer norm overflowed"):
        attention.layer_norm(np.array([1e200, -1e200]))


def test_the_trace_checks_its_raw_scores_too():
    with pytest.raises(attention.AttentionError, match="overflowed"):
        attention.SelfAttention(8).trace(np.full((3, 8), 8e18, np.float32))


def test_the_trace_broadcasts_like_the_fast_path_over_the_batch_of_value_and_mask():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(2, 5, 6))
    for mask in (None, rng.random((2, 3, 5)) < 0.7):
        trace = attention.trace_attention(q, k, v, mask)
        output, weights = attention.scaled_dot_product_attention(q, k, v, mask)
        assert trace.weights.shape == weights.shape == (2, 3, 5)
        np.testing.assert_array_equal(trace.weights, weights)
        np.testing.assert_array_equal(trace.output, output)


def test_extreme_but_legal_values_raise_no_numpy_warning():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(attention.softmax([1.7e308, -1.7e308]), [1.0, 0.0])
        attention.scaled_dot_product_attention(q, k, v, scale=1e300)
        with pytest.raises(attention.AttentionError, match="scale: 1e\\+39 is beyond the range of float32"):
            attention.scaled_dot_product_attention(*(a.astype(np.float32) for a in (q, k, v)), scale=1e39)
        heads = {name: rng.normal(size=(2, 8, 4)) for name in ("w_q", "w_k", "w_v")}
        layer = attention.MultiHeadAttention(8, 2, **heads, w_o=rng.normal(size=(8, 8)) * 1e39)
        with pytest.raises(attention.AttentionError, match="w_o: values beyond the range of float32"):
            layer(rng.normal(size=(3, 8)).astype(np.float32))


@pytest.mark.parametrize(("call", "argument"), [
    (lambda: attention.scaled_dot_product_attention(np.zeros((0, 4)), np.ones((2, 4)), np.ones((2, 3))), "query"),
    (lambda: attention.scaled_dot_product_attention(np.ones((2, 0)), np.ones((2, 0)), np.ones((2, 3))), "query"),
    (lambda: attention.scaled_dot_product_attention(np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 3)), scale="2"),
     "scale"),
    (lambda: attention.scaled_dot_product_attention(np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 3)), scale=1j),
     "scale"),
    (lambda: attention.softmax(3.0), "x"),
])
def test_invalid_arguments_are_attention_errors_naming_them(call, argument):
    with pytest.raises(attention.AttentionError) as raised:
        call()
    assert raised.value.argument == argument


def test_softmax_of_an_empty_array_is_empty():
    assert attention.softmax(np.zeros((2, 0))).shape == (2, 0)


def test_explicit_weights_are_copied_so_later_changes_to_them_change_nothing():
    rng = np.random.default_rng(3)
    w, x = rng.normal(size=(8, 4)), rng.normal(size=(3, 8))
    layer = attention.SelfAttention(8, 4, w_q=w, w_k=w, w_v=w)
    before, before32 = layer(x)[0], layer(x.astype(np.float32))[0]
    w *= 2
    np.testing.assert_array_equal(layer(x)[0], before)
    np.testing.assert_array_equal(layer(x.astype(np.float32))[0], before32)


@pytest.mark.parametrize("call", [
    lambda x: attention.scaled_dot_product_attention(x, x, x),
    lambda x: attention.SelfAttention(8, 4)(x),
    lambda x: attention.MultiHeadAttention(8, 2)(x),
    lambda x: attention.softmax(x),
])
def test_a_long_double_beyond_float64_is_refused_by_name_without_a_warning(call):
    """float64 is the working precision: wider floats whose values it cannot hold are an error, not inf
    (numpy warnings are errors in this module: the cast must not warn either)."""
    with pytest.raises(attention.AttentionError, match="beyond the range of float64"):
        call(np.full((3, 8), np.longdouble("1e400")))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1, SMALL_CHECK // 8, SMALL_CHECK // 8 + 1])  # rows of 8: both sides of the switch
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_one_non_finite_value_is_found_wherever_it_is_small_or_large_inputs(dtype, size, bad):
    """Small arrays are checked by a byte search, large ones by a reduction: both see the last value."""
    for where in (0, size - 1):
        x = np.ones((size, 8), dtype)
        x[where, -1] = bad
        with pytest.raises(attention.AttentionError, match="finite") as raised:
            attention.scaled_dot_product_attention(x, x[:2], x[:2])
        assert raised.value.argument == "query"
    assert _checks.all_finite(np.ones((size, 8), dtype))


@pytest.mark.parametrize("size", [3, SMALL_CHECK + 1])
def test_all_finite_sees_the_values_a_masked_array_hides_whatever_its_size(size):
    """The byte search and the reduction agree: the data is checked, not what the mask shows."""
    values = np.ones(size)
    values[1] = np.nan
    assert not _checks.all_finite(np.ma.masked_array(values, mask=np.arange(size) == 1))
