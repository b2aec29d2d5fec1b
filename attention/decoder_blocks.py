"""The building blocks a modern decoder (Llama and its family) has where the paper's encoder had others.

The seed script builds the paper's block: sine waves added to the embeddings, multi-head attention with its
own K and V per head, add & LayerNorm, a ReLU feed-forward. A trained Llama changes four of these, each for a
reason, and adds one thing a decoder needs to run fast:

* RMSNorm instead of LayerNorm, *before* each sub-layer instead of after it;
* rotary position embeddings, turning q and k in every layer, instead of sine waves added once at the bottom;
* grouped-query attention: several query heads share one key/value head;
* SwiGLU, a gated feed-forward, instead of ReLU;
* a key/value cache, so generating a token computes only that token's row.

Every function keeps its input's dtype (float32 in, float32 out), as the rest of the engine does.
"""

from __future__ import annotations

import numpy as np

from ._checks import all_finite
from .errors import AttentionError
from .masks import causal_mask


# ---------------------------------------------------------------------------
# RMSNorm. LayerNorm centres each vector (subtracts its mean), divides by its standard deviation, then scales
# and shifts. RMSNorm keeps only the division, by the root mean square, and the scale: cheaper, and as good in
# practice. Llama normalises the *input* of each sub-layer ("pre-norm"), so the residual stream itself is never
# normalised and its values grow through the stack (this model's reach ~25,000).
# ---------------------------------------------------------------------------
def rms_norm(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    """x (..., d) / sqrt(mean(x^2) + eps) * scale (d,) -> a new (..., d) array. A row too large to square is
    an error (AttentionError "X"), not a row of zeros."""
    mean_square = np.vecdot(x, x)[..., None]            # (..., 1): sums of squares without a (..., d) square
    mean_square /= x.shape[-1]
    if not all_finite(mean_square):
        raise AttentionError("X", "the RMS norm overflowed: input values are too large")
    mean_square += x.dtype.type(eps)
    out = x / np.sqrt(mean_square, out=mean_square)     # (..., d) / (..., 1)
    out *= scale
    return out


# ---------------------------------------------------------------------------
# Rotary position embeddings (RoPE). The seed ADDS sine waves to the embeddings once, before the first layer
# (its stage 5): position is mixed into the content and must survive every layer. RoPE instead ROTATES q and k,
# in every layer, by angles proportional to the position: dimension i of a head turns together with dimension
# i + d_k/2 by pos * theta_i, theta_i = base^(-2i/d_k), from fast (i = 0) to slow. A dot product of two rotated
# vectors depends only on the angle between them, so q at position m scores k at position n through m - n:
# attention sees relative distance, and v, the content handed over, is never rotated.
# ---------------------------------------------------------------------------
def rotary_angles(positions: np.ndarray, d_k: int, base: float, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of pos * theta_i for positions (n,) and the d_k/2 frequencies: each (n, d_k/2) in ``dtype``.

    The frequencies are computed in float64 and rounded to ``dtype``, the angles multiplied in ``dtype``: float32
    gives transformers' float32 angles, float64 exact ones."""
    theta = (1.0 / base ** (np.arange(0, d_k, 2) / d_k)).astype(dtype)       # (d_k/2,) radians per position
    angles = positions.astype(dtype)[:, None] * theta                        # (n, d_k/2)
    return np.cos(angles), np.sin(angles)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (B, n, heads, d_k) with each head's dimensions i and i + d_k/2 turned by the angle of its position:
    cos, sin (n, d_k/2). A new contiguous (B, n, heads, d_k) array."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]                             # (B, n, heads, d_k/2) views
    cos, sin = cos[:, None], sin[:, None]                                    # (n, 1, d_k/2): every head alike
    out = np.empty_like(x)
    np.multiply(first, cos, out=out[..., :half])                             # the 2-D rotation of each pair:
    out[..., :half] -= second * sin                                          #   x' = x cos - y sin
    np.multiply(second, cos, out=out[..., half:])
    out[..., half:] += first * sin                                           #   y' = y cos + x sin
    return out


# ---------------------------------------------------------------------------
# Grouped-query attention (GQA). Multi-head attention gives every head its own K and V. GQA lets a group of
# query heads share one key/value head (here 9 query heads, 3 key/value heads: groups of 3): the keys and
# values a decoder keeps per token shrink 3x, at little cost in quality. No K or V is copied: the 3 query heads
# of a group are stacked as rows of one query matrix, (3n, d_k), and meet their shared K in one matmul,
# (3n, d_k) @ (d_k, n). Under that stacking, row r is position r mod n, hence the tiled causal mask below.
# ---------------------------------------------------------------------------
def grouped_causal_mask(n: int, past: int, group: int) -> np.ndarray | None:
    """(group * n, past + n) boolean, True = may attend, for ``group`` query heads stacked by rows over the
    ``past`` cached keys and n new ones: each new token sees every cached key, and the new ones causally (the
    seed's lower triangle). None for one new token: it may see every key."""
    if n == 1:
        return None
    new = causal_mask(n)                                                     # (n, n) lower triangle
    seen = np.concatenate([np.ones((n, past), dtype=bool), new], axis=1)     # (n, past + n)
    return np.tile(seen, (group, 1))                                         # (group n, past + n)


# ---------------------------------------------------------------------------
# SwiGLU. The paper's feed-forward is ReLU(x W_1) W_2. SwiGLU projects up twice: one projection, through SiLU
# (x * sigmoid(x), a smooth ReLU), gates the other elementwise, then the product is projected down. Each hidden
# unit learns how much of its value to let through.
# ---------------------------------------------------------------------------
def swiglu(gate_up: np.ndarray) -> np.ndarray:
    """gate_up (..., 2 d_ff), the gate's projection and the up projection side by side ->
    SiLU(gate) * up (..., d_ff), a new array."""
    gate, up = np.split(gate_up, 2, axis=-1)                                 # (..., d_ff) views
    with np.errstate(over="ignore"):                                         # exp(-gate) -> inf: SiLU is 0
        out = np.exp(-gate)
    out += 1
    np.divide(gate, out, out=out)                                            # SiLU(gate) = gate / (1 + e^-gate)
    out *= up
    return out
