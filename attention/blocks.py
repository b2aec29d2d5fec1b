"""The building blocks a *trained* encoder has and the toy one does without.

The toy encoder (``attention/encoder.py``) is the paper's block with nothing learned: projections
without biases, a layer norm of unit scale and zero shift, ReLU. A real checkpoint (BERT and its
family) learned all of these, so computing it exactly needs each one:

* a projection with a bias: ``x W + b`` (the bias lets a unit fire on no input at all);
* a layer norm with a learned scale (gamma) and shift (beta) per feature, applied after normalising;
* GELU, ``x * Phi(x)``: a smooth ReLU that weighs each value by how likely it is to be positive.
  BERT uses the exact form with the Gaussian CDF, ``Phi(x) = (1 + erf(x / sqrt 2)) / 2``; the tanh
  approximation differs by up to ~1e-3 and would not reproduce the checkpoint's numbers.

Every function keeps its input's dtype (float32 in, float32 out), as the rest of the engine does.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf  # numpy has no erf; scipy's keeps float32 as float32

from .errors import AttentionError

SQRT_HALF = 1 / math.sqrt(2)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """x (..., d_in) @ weight (d_in, d_out) + bias (d_out,) -> (..., d_out)."""
    out = x @ weight
    out += bias                                        # in place: no second (..., d_out) array
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
    mean = x.mean(axis=-1, keepdims=True)              # (..., 1)
    centred = x - mean                                 # (..., d)
    var = np.mean(np.square(centred), axis=-1, keepdims=True)
    if not np.isfinite(var).all():
        raise AttentionError("X", "the layer norm overflowed: input values are too large")
    centred /= np.sqrt(var + x.dtype.type(eps))
    centred *= scale
    centred += shift
    return centred
