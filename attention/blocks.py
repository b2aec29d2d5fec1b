"""The building blocks a *trained* encoder has and the toy one does without.

The toy encoder (``attention/encoder.py``) is the paper's block with nothing learned: projections
without biases, a layer norm of unit scale and zero shift, ReLU. A real checkpoint (BERT and its
family) learned all of these, so computing it exactly needs each one:

* a projection with a bias: ``x W + b`` (the bias lets a unit fire on no input at all);
* a layer norm with a learned scale (gamma) and shift (beta) per feature, applied after normalising;
* GELU, ``x * Phi(x)``: a smooth ReLU that weighs each value by how likely it is to be positive.
  BERT uses the exact form with the Gaussian CDF, ``Phi(x) = (1 + erf(x / sqrt 2)) / 2``; the tanh
  approximation differs by up to ~1e-3 and would not reproduce the checkpoint's numbers. numpy has no
  erf; scipy's is exact but a scalar loop (~16 ns a value: most of a feed-forward's time), so float32
  takes :func:`erf`'s vectorised rational function, within 1 ulp of scipy's.

Every function keeps its input's dtype (float32 in, float32 out), as the rest of the engine does.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ._checks import all_finite
from .errors import AttentionError

SQRT_HALF = 1 / math.sqrt(2)

# erf(u) = u P(u^2) / Q(u^2) for |u| <= ERF_CLIP, coefficients from z^0 up. Fitted to scipy's float64 erf:
# a linearised least-squares fit of the relative error (Sanathanan-Koerner: P - f Q weighed by 1 / (f Q) of
# the previous round, Q(0) = 1) on 6000 Chebyshev nodes in z = u^2 in [0, 16]; max relative error 2.6e-9
# on 2 M points, a tenth of float32's half ulp (2^-25 = 3e-8), so rounding gives scipy's value or its
# neighbour. Q's roots are all off [0, 16] (real ones negative). Past 4, erf rounds to 1 in float32
# (it does from ~3.92): clipping u there keeps the fit on its interval and the saturation exact.
ERF_CLIP = 4.0
ERF_P = (1.1283791699738899, 0.1928788446567805, 0.055749621438865596, 0.004226502042280556,
         0.0004112810585628093, 6.791476425329869e-06)
ERF_Q = (1.0, 0.5042678593461286, 0.11749545338171764, 0.016295174348288453, 0.0014212136511118259,
         7.256472383783448e-05, 2.604916723027463e-07)
# Values per block of erf's float64 work: four scratch rows of 256 KiB stay in the core's cache, where a
# whole (128, 1536) array per pass would stream through memory (measured: 3x slower end to end).
ERF_BLOCK = 1 << 15


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """x (..., d_in) @ weight (d_in, d_out) + bias (d_out,) -> (..., d_out)."""
    # As one 2-D gemm over every row: numpy's stacked matmul, (B, n, d_in) @ W, runs one product per batch
    # item (measured 6x slower at (8, 16, 384) @ (384, 1536)).
    out = x.reshape(-1, x.shape[-1]) @ weight          # (rows, d_out)
    out += bias                                        # in place: no second array
    return out.reshape(*x.shape[:-1], weight.shape[-1])


def erf(a: np.ndarray) -> np.ndarray:
    """The error function elementwise: a new array of a's shape and dtype.

    float32: ``u P(u^2) / Q(u^2)`` in float64, rounded to float32, in cache-sized blocks; within 1 ulp of
    ``scipy.special.erf`` on every float32 (``tests/unit/engine/test_blocks_erf.py``), ~4x faster. Other
    dtypes: scipy's (float64 must stay exact to ~1e-16).
    """
    if a.dtype != np.float32:
        return special.erf(a)
    flat = a.reshape(-1)                               # (N,): a view when a is contiguous
    out = np.empty_like(flat)                          # (N,) float32
    scratch = np.empty((4, min(ERF_BLOCK, flat.size)))  # float64 rows, reused by every block
    for start in range(0, flat.size, ERF_BLOCK):
        block = flat[start:start + ERF_BLOCK]          # (m,)
        u, z, p, q = scratch[:, :block.size]
        np.clip(block, -ERF_CLIP, ERF_CLIP, out=u)
        np.multiply(u, u, out=z)
        ratio = _polynomial(ERF_P, z, p)
        ratio /= _polynomial(ERF_Q, z, q)
        np.multiply(ratio, u, out=out[start:start + block.size], casting="same_kind")  # odd: u brings the sign
    return out.reshape(a.shape)


def _polynomial(coefficients: tuple[float, ...], z: np.ndarray, out: np.ndarray) -> np.ndarray:
    """sum_k coefficients[k] z^k by Horner's rule, into ``out`` (z's shape)."""
    np.multiply(z, coefficients[-1], out=out)
    out += coefficients[-2]
    for c in coefficients[-3::-1]:
        out *= z
        out += c
    return out


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * (1 + erf(x / sqrt 2)) / 2, elementwise; a new array of x's shape and dtype."""
    half = x.dtype.type(0.5)
    out = erf(x * x.dtype.type(SQRT_HALF))             # (...): Phi(x) = (1 + erf(x / sqrt 2)) / 2
    out += 1
    out *= half
    out *= x
    return out


def learned_layer_norm(x: np.ndarray, scale: np.ndarray, shift: np.ndarray, eps: float) -> np.ndarray:
    """Normalise each row of x (..., d) to mean 0 and variance 1, then ``* scale + shift`` (each (d,)).

    The variance is the biased one (divided by d), as BERT's LayerNorm computes it; ``eps`` comes from
    the model's config (1e-12 for BERT). A row too large to square is an error, not a row of zeros.
    """
    d = x.shape[-1]
    mean = np.add.reduce(x, axis=-1, keepdims=True)    # (..., 1); add.reduce: x.mean adds Python calls
    mean /= d
    centred = x - mean                                 # (..., d)
    var = np.vecdot(centred, centred)[..., None]       # (..., 1): sums of squares without a (..., d) square
    var /= d
    if not all_finite(var):
        raise AttentionError("X", "the layer norm overflowed: input values are too large")
    var += x.dtype.type(eps)
    centred /= np.sqrt(var, out=var)                   # (..., d) / (..., 1)
    centred *= scale
    centred += shift
    return centred
