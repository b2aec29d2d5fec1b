"""Scaled dot-product attention, the whole paper in one function (section 3.2.1):

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Two implementations of the same maths live here:

* ``attend``: the fast one. It checks and flattens its arguments and hands them to the
  tiled kernel (``attention/kernel.py``, which multi-head attention also calls on its
  already flat heads): each cache-sized tile of scores is written once, normalised in
  place and multiplied by V straight away.
* ``trace_attention``: the teaching one. It keeps every intermediate (raw scores,
  scaled scores, masked scores, weights, output) so a learner can see each stage.

Shapes: Q (..., n_q, d_k), K (..., n_k, d_k), V (..., n_k, d_v); the leading "..."
(batch, heads) broadcast against each other. Masks are boolean, True = may attend
(PyTorch's convention), broadcastable to (..., n_q, n_k).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ._checks import all_finite, as_bool_mask, as_real_array, in_working_dtype, to_working, working_dtype
from .errors import AttentionError
from .kernel import LARGEST, GroupMask, attend_groups, require_finite_scores, softmax_rows_inplace

Attended = tuple[np.ndarray, np.ndarray | None]  # (output, weights or None)


# ---------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------
def softmax(x: ArrayLike, axis: int = -1) -> np.ndarray:
    """Turn scores into probabilities along ``axis`` (each slice sums to 1).

    Subtracting the maximum first changes nothing mathematically (it cancels in the
    ratio) but keeps ``exp`` from overflowing. A slice that is entirely ``-inf`` (every
    position masked) has no probability mass to share: it comes back all zeros, not NaN.
    """
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":  # not bool (kind b), complex, strings...
        raise AttentionError("x", f"expected a real numeric array, got dtype {x.dtype}")
    if x.ndim == 0:
        raise AttentionError("x", "expected an array with at least one axis, got a scalar")
    if not (x < np.inf).all():                          # NaN or +inf (one pass)
        raise AttentionError("x", "values must not be NaN or +infinity (-infinity means 'masked')")
    x = in_working_dtype(x, "x")
    if x.size == 0:
        return x.copy()
    peak = np.max(x, axis=axis, keepdims=True)
    peak[np.isneginf(peak)] = 0.0                      # fully masked slice: avoid -inf - -inf
    with np.errstate(over="ignore"):                   # x - peak may reach -inf: exp of it is an exact 0
        e = np.exp(x - peak)
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def require_finite(array: np.ndarray, argument: str) -> None:
    """Raise when a result overflowed: finite inputs so large that their products are not."""
    if not all_finite(array):
        raise AttentionError(argument, "the computation overflowed: input values are too large")


# ---------------------------------------------------------------------------
# argument handling shared by the public entry points
# ---------------------------------------------------------------------------
def default_scale(d_k: int) -> float:
    """1/sqrt(d_k): dot products of d_k-dim vectors have variance ~d_k; this pulls it back to ~1."""
    return 1.0 / math.sqrt(d_k)


def _prepare(Q, K, V, mask, scale):
    """Checked same-dtype q, k, v (batch axes that broadcast), the checked mask and the scale."""
    q = as_real_array(Q, "query", 2)
    k = as_real_array(K, "key", 2)
    v = as_real_array(V, "value", 2)
    dtype = working_dtype(q, k, v)
    q, k, v = (to_working(a, dtype, name) for a, name in ((q, "query"), (k, "key"), (v, "value")))
    if k.shape[-1] != q.shape[-1]:
        raise AttentionError("key", f"expected last axis d_k = {q.shape[-1]} (query's), got shape {k.shape}")
    if v.shape[-2] != k.shape[-2]:
        raise AttentionError("value", f"expected n_k = {k.shape[-2]} rows (key's), got shape {v.shape}")
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise AttentionError(
            "key", f"batch axes of query {q.shape}, key {k.shape} and value {v.shape} do not broadcast"
        ) from None
    n_q, n_k = q.shape[-2], k.shape[-2]
    if mask is not None:
        mask = as_bool_mask(mask, "mask", (*batch, n_q, n_k))
    if scale is None:
        scale = default_scale(q.shape[-1])
    elif isinstance(scale, bool | np.bool_) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise AttentionError("scale", f"expected a finite number, got {scale!r}")
    if abs(scale) > LARGEST[dtype]:
        raise AttentionError("scale", f"{scale!r} is beyond the range of {dtype}")
    return q, k, v, mask, float(scale)


def _flatten(a: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    """(..., n, d) broadcast to (*batch, n, d) and flattened to (G, n, d): a view when the layout allows."""
    if a.shape[:-2] != batch:
        a = np.broadcast_to(a, (*batch, *a.shape[-2:]))
    return a.reshape(-1, *a.shape[-2:])                 # copies only what cannot be viewed so


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, *, scale: float,
           causal: bool = False, return_weights: bool = True, q_is_scratch: bool = False) -> Attended:
    """softmax(q k^T * scale) v on already-checked arrays whose batch axes broadcast (see
    ``scaled_dot_product_attention``); the output is checked for overflow ("value").

    Self-attention passes ``q_is_scratch``: q is its own temporary, scaled in place (no copy).
    """
    batch = q.shape[:-2]
    if not batch == k.shape[:-2] == v.shape[:-2]:
        batch = np.broadcast_shapes(batch, k.shape[:-2], v.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    wrapped = None if mask is None else GroupMask(np.atleast_2d(mask), batch)
    weights = np.empty((*batch, n_q, n_k), dtype=q.dtype) if return_weights else None
    q = _flatten(q, batch)
    with np.errstate(over="ignore", invalid="ignore"):      # overflow is detected and reported below
        if q_is_scratch and q.flags.writeable:
            q *= q.dtype.type(scale)                    # fold the scale into Q: n*d_k work, not n*n
        else:
            q = q * q.dtype.type(scale)
        flat_weights = None if weights is None else weights.reshape(-1, n_q, n_k)  # a view: same memory
        output = attend_groups(q, _flatten(k, batch), _flatten(v, batch), wrapped, causal, flat_weights)
    require_finite(output, "value")
    return output.reshape(*batch, n_q, v.shape[-1]), weights


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def scaled_dot_product_attention(
    Q: ArrayLike, K: ArrayLike, V: ArrayLike, mask: ArrayLike | None = None, verbose: bool = False, *,
    scale: float | None = None, causal: bool = False, return_weights: bool = True,
) -> Attended:
    """softmax(Q K^T * scale) V, with scale = 1/sqrt(d_k) unless given.

    Q (..., n_q, d_k), K (..., n_k, d_k), V (..., n_k, d_v); leading axes broadcast.
    ``mask``: boolean, True = may attend, broadcastable to (..., n_q, n_k). ``causal``
    additionally hides key j from query i when j > i. A query with no visible key gets
    all-zero weights and an all-zero output.

    Returns ``(output (..., n_q, d_v), weights (..., n_q, n_k))``; weights is None when
    ``return_weights`` is False (faster: the weights are never stored). ``verbose``
    prints the scaled scores and weights, as the seed script does.
    """
    q, k, v, mask, scale = _prepare(Q, K, V, mask, scale)
    output, weights = attend(q, k, v, mask, scale=scale, causal=causal, return_weights=return_weights or verbose)
    if verbose:
        _print_stages(trace_attention(q, k, v, mask, scale=scale, causal=causal))
    return output, (weights if return_weights else None)


@dataclass(frozen=True)
class AttentionTrace:
    """Every stage of one attention computation, for teaching.

    scores: Q K^T (..., n_q, n_k); scaled_scores: scores * scale; masked_scores: the
    scaled scores as a ``np.ma.MaskedArray`` whose hidden cells are masked (softmax
    treats them as -inf); weights: softmax of the masked scores; output: weights @ V.
    q, k, v: the projected inputs for self/multi-head attention (None for plain attention).
    """

    scores: np.ndarray
    scaled_scores: np.ndarray
    masked_scores: np.ma.MaskedArray
    weights: np.ndarray
    output: np.ndarray
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    v: np.ndarray | None = None

    def as_dict(self) -> dict[str, np.ndarray]:
        """Plain arrays by stage name; masked cells of ``masked_scores`` are NaN (JSON null)."""
        stages = {
            "scores": self.scores,
            "scaled_scores": self.scaled_scores,
            "masked_scores": self.masked_scores.filled(np.nan),
            "weights": self.weights,
            "output": self.output,
        }
        extra = {name: a for name, a in (("q", self.q), ("k", self.k), ("v", self.v)) if a is not None}
        return {**extra, **stages}


def trace_attention(Q: ArrayLike, K: ArrayLike, V: ArrayLike, mask: ArrayLike | None = None, *,
                    scale: float | None = None, causal: bool = False) -> AttentionTrace:
    """The same computation as ``scaled_dot_product_attention``, keeping every intermediate."""
    q, k, v, mask, scale = _prepare(Q, K, V, mask, scale)
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = np.ones((n_q, n_k), dtype=bool) if mask is None else mask
    if causal:
        allowed = allowed & np.tri(n_q, n_k, dtype=bool)
    full = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], allowed.shape[:-2]), n_q, n_k)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected and reported
        scores = np.broadcast_to(q @ k.swapaxes(-1, -2), full)            # (..., n_q, n_k) raw similarity
        scaled = np.broadcast_to((q * scale) @ k.swapaxes(-1, -2), full)  # as the fast path, bit for bit
        require_finite_scores(scores)
        require_finite_scores(scaled)
        hidden = ~np.broadcast_to(allowed, full)
        weights = np.where(hidden, -np.inf, scaled)     # -inf: softmax gives these exactly 0
        softmax_rows_inplace(weights)
        output = weights @ v
    require_finite(output, "value")
    return AttentionTrace(scores, scaled, np.ma.masked_array(scaled, mask=hidden), weights, output)


def _print_stages(trace: AttentionTrace) -> None:
    """What the seed's ``verbose=True`` prints, with each stage named for what it is."""
    print("  scaled scores (QK^T / sqrt(d_k)):\n", trace.scaled_scores)
    print("  attention weights (each row sums to 1):\n", trace.weights)
    print("  row sums:", trace.weights.sum(axis=-1))
