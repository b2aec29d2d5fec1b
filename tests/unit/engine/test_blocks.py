"""attention/blocks.py: the learned pieces of a trained encoder (a biased projection, exact GELU, a layer norm with
scale and shift), each against an independent computation of the same formula."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from attention import AttentionError
from attention.blocks import gelu, learned_layer_norm, linear

GRID = np.linspace(-8.0, 8.0, 3201)  # steps of 0.005, through 0 and both tails


def test_gelu_is_x_times_the_gaussian_cdf_in_float64():
    ours = gelu(GRID)
    assert ours.dtype == np.float64
    np.testing.assert_allclose(ours, GRID * norm.cdf(GRID), rtol=0, atol=1e-15)
    by_math_erf = np.array([x * (1 + math.erf(x / math.sqrt(2))) / 2 for x in GRID])
    np.testing.assert_allclose(ours, by_math_erf, rtol=0, atol=1e-15)


def test_gelu_keeps_float32_and_matches_torch_exact_gelu():
    x = GRID.astype(np.float32)
    ours = gelu(x)
    assert ours.dtype == np.float32 and ours.shape == x.shape
    np.testing.assert_allclose(ours, GRID * norm.cdf(GRID), rtol=0, atol=1e-6)
    torch_exact = torch.nn.functional.gelu(torch.from_numpy(x), approximate="none").numpy()
    np.testing.assert_allclose(ours, torch_exact, rtol=0, atol=1e-6)


def test_gelu_of_zero_is_zero_and_is_not_the_tanh_approximation():
    assert gelu(np.zeros(3))[0] == 0.0 and gelu(np.zeros(3, np.float32))[0] == 0.0
    tanh_form = 0.5 * GRID * (1 + np.tanh(math.sqrt(2 / math.pi) * (GRID + 0.044715 * GRID**3)))
    assert np.abs(gelu(GRID) - tanh_form).max() > 1e-4  # measured 4.7e-4 near |x| = 2


def test_gelu_leaves_its_input_unchanged():
    x = GRID.copy()
    gelu(x)
    np.testing.assert_array_equal(x, GRID)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_rows_take_the_constant_scale_and_shift(dtype):
    x = np.random.default_rng(1).normal(3.0, 7.0, size=(2, 5, 64)).astype(dtype)
    out = learned_layer_norm(x, np.full(64, 2.5, dtype), np.full(64, -1.0, dtype), 1e-12)
    assert out.dtype == dtype and out.shape == x.shape
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out.mean(axis=-1), -1.0, atol=tolerance)
    np.testing.assert_allclose(out.std(axis=-1), 2.5, atol=tolerance)  # the biased std, as the norm divides by d


@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("eps", [1e-12, 1e-5, 0.5])
def test_layer_norm_equals_torch_layer_norm(dtype, tolerance, eps):
    rng = np.random.default_rng(2)
    x, scale, shift = (rng.normal(size=shape).astype(dtype) for shape in ((3, 4, 32), (32,), (32,)))
    x[0, 0] = 0.25                                    # a constant row: variance 0, only eps keeps it finite
    expected = torch.nn.functional.layer_norm(torch.from_numpy(x), (32,), torch.from_numpy(scale),
                                              torch.from_numpy(shift), eps).numpy()
    ours = learned_layer_norm(x, scale, shift, eps)
    assert ours.dtype == dtype
    np.testing.assert_allclose(ours, expected, rtol=0, atol=tolerance)


def test_layer_norm_refuses_a_row_too_large_to_square():
    x = np.ones((2, 4), np.float32)
    x[1] = [1e30, -1e30, 1e30, -1e30]                 # squares overflow float32 to inf
    with np.errstate(over="ignore"), pytest.raises(AttentionError, match="overflowed") as caught:
        learned_layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), 1e-12)
    assert caught.value.argument == "X"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_is_x_w_plus_the_bias(dtype):
    rng = np.random.default_rng(3)
    x, w, b = (rng.normal(size=shape).astype(dtype) for shape in ((2, 3, 4), (4, 5), (5,)))
    out = linear(x, w, b)
    assert out.dtype == dtype and out.shape == (2, 3, 5)
    np.testing.assert_allclose(out, np.einsum("bni,io->bno", x, w) + b, rtol=1e-6 if dtype == np.float32 else 1e-13)
    np.testing.assert_array_equal(linear(np.zeros_like(x), w, b), np.broadcast_to(b, (2, 3, 5)))  # bias alone
