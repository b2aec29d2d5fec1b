"""The engine's float32 erf (a rational function, for speed) against scipy's, ulp by ulp; GELU built on it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from attention.blocks import ERF_BLOCK, erf, gelu

# Every float32 from 0 up to past the clip (4.0) is a bit pattern below this one; erf is 1 beyond.
TOP = int(np.float32(4.5).view(np.int32))


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many float32 steps apart a and b are, elementwise (same signs: both from the same inputs)."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def test_within_one_ulp_of_scipy_on_a_dense_sweep_of_float32():
    # Every 61st bit pattern in [0, 4.5]: ~17.8 M values, each binade from the subnormals up. (Every one of the
    # 1.08 G patterns was checked once, in ~100 s: max 1 ulp, 3.0% differ; the stride is odd so that
    # it walks every mantissa residue.)
    x = np.arange(0, TOP + 1, 61, dtype=np.int32).view(np.float32)
    got, want = erf(x), special.erf(x)
    distance = ulps(got, want)
    assert distance.max() == 1
    assert distance.mean() < 0.05                     # the fit's error is a tenth of a half ulp: mostly equal
    assert got.dtype == np.float32


def test_odd_saturated_and_special_values_as_scipy():
    x = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-38, 3.9, 3.95, 4.0, 4.5, 10.0, 3.4e38, np.inf, -np.inf,
                  np.nan], np.float32)
    got = erf(x)
    np.testing.assert_array_equal(got, special.erf(x))   # NaN where NaN; +-1 where saturated; signed zeros
    assert np.signbit(got[1]) and not np.signbit(got[0])
    sweep = np.random.default_rng(5).uniform(0, 5, 10_000).astype(np.float32)
    np.testing.assert_array_equal(erf(-sweep), -erf(sweep))


@pytest.mark.parametrize("shape", [(0,), (3, 5), (2, ERF_BLOCK + 7), (ERF_BLOCK,)])
def test_any_shape_including_several_blocks_and_a_short_last_one(shape):
    x = np.random.default_rng(1).normal(scale=2, size=shape).astype(np.float32)
    got = erf(x)
    assert got.shape == shape and got.dtype == np.float32
    assert ulps(got, special.erf(x)).max(initial=0) <= 1
    transposed = x.T if x.ndim == 2 else x                # not contiguous: reshape copies, the values hold
    assert ulps(erf(transposed), special.erf(transposed)).max(initial=0) <= 1


def test_float64_is_scipys_exactly():
    x = np.random.default_rng(2).normal(scale=3, size=1000)
    np.testing.assert_array_equal(erf(x), special.erf(x))


def test_gelu_float32_matches_the_float64_formula():
    x = np.random.default_rng(3).normal(scale=3, size=(64, 257)).astype(np.float32)
    exact = x.astype(np.float64) * (1 + special.erf(x.astype(np.float64) / np.sqrt(2))) / 2
    got = gelu(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gelu(x.astype(np.float64)), exact, rtol=1e-15, atol=1e-15)  # float64: scipy's erf
