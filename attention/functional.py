"""Scaled dot-product attention, the whole paper in one function (section 3.2.1):

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Two implementations of the same maths live here:

* ``attend`` (and its kernel ``attend_groups``, which multi-head attention calls on its
  already flat heads): the fast one. It walks the queries in tiles so each tile of scores
  is written once, normalised in place while it is still in cache, and multiplied by V
  straight away. With ``return_weights`` the tiles are the returned weights array
  itself; without, one scratch tile is reused. No Python loop over heads or batch
  items: the loop is over cache-sized tiles, and small problems are a single tile.
* ``trace_attention``: the teaching one. It keeps every intermediate (raw scores,
  scaled scores, masked scores, weights, output) so a learner can see each stage.

Shapes: Q (..., n_q, d_k), K (..., n_k, d_k), V (..., n_k, d_v); the leading "..."
(batch, heads) broadcast against each other. Masks are boolean, True = may attend
(PyTorch's convention), broadcastable to (..., n_q, n_k).
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ._checks import all_finite, as_bool_mask, as_real_array, in_working_dtype, to_working, working_dtype
from .errors import AttentionError

Attended = tuple[np.ndarray, np.ndarray | None]  # (output, weights or None)

# Bytes in one score tile. Small enough to stay in cache between the score matmul, the softmax
# passes and weights @ V; large enough that BLAS gets matmuls worth splitting over its threads.
TILE_BYTES = 4 << 20
# Below this many cells a numpy call costs about the same whatever the size: small problems take the
# simple way (check every score, keep their causal mask) where large ones must save passes and memory.
SMALL_CELLS = 1 << 14
_LARGEST = {np.dtype(t): float(np.finfo(t).max) for t in (np.float32, np.float64)}  # per working dtype


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


def _softmax_rows_inplace(tile: np.ndarray, *, rows_may_be_empty: bool = True) -> None:
    """Softmax over the last axis of ``tile``, overwriting it (masked cells hold -inf).

    Rows with no allowed key become all zeros. A row whose maximum is +inf or NaN can
    only come from scores that overflowed: that is the caller's input, reported as such.
    ``rows_may_be_empty=False``: the caller knows every row has a finite score (no user
    mask, scores checked or bounded), so the maxima need no inspection.
    """
    # The reductions as np.maximum/np.add.reduce: tile.max()/tile.sum() add a Python call each (numpy's _methods).
    peak = np.maximum.reduce(tile, axis=-1, keepdims=True)  # (..., t, 1)
    empty_rows = rows_may_be_empty and not all_finite(peak)
    if empty_rows:
        if np.isnan(peak).any() or np.isposinf(peak).any():
            raise AttentionError("query", "the attention scores overflowed: input values are too large")
        peak[np.isneginf(peak)] = 0.0                   # rows with every key masked
    tile -= peak
    np.exp(tile, out=tile)
    total = np.add.reduce(tile, axis=-1, keepdims=True)  # (..., t, 1): >= 1 in a row with a finite peak
    if empty_rows:
        np.divide(1.0, total, out=total, where=total > 0)   # rows of zeros stay zero
    else:
        np.reciprocal(total, out=total)
    tile *= total


def _scores_may_overflow(q: np.ndarray, k: np.ndarray) -> bool:
    """Whether any q.k could leave the dtype's range: bounded by max|q| * max|k| * d_k.

    Cheap (one pass over q and k), so the per-tile finiteness check runs only for inputs
    large enough to need it. Python floats make the bound itself immune to overflow.
    """
    bound = float(np.abs(q).max(initial=0)) * float(np.abs(k).max(initial=0)) * q.shape[-1]
    return not bound < _LARGEST[q.dtype] / 4


def _require_finite_scores(scores: np.ndarray) -> None:
    """-inf must mean "masked" only: a score that overflowed to +-inf is the input's fault."""
    if not all_finite(scores):
        raise AttentionError("query", "the attention scores overflowed: input values are too large")


def require_finite(array: np.ndarray, argument: str) -> None:
    """Raise when a result overflowed: finite inputs so large that their products are not."""
    if not all_finite(array):
        raise AttentionError(argument, "the computation overflowed: input values are too large")


# ---------------------------------------------------------------------------
# the fast kernel
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupMask:
    """A user mask (at least 2-D) and the batch shape its leading axes broadcast to (G elements).

    The mask is never broadcast whole: each tile takes only the cells it needs.
    """

    array: np.ndarray
    batch_shape: tuple[int, ...]

    def tile(self, groups: slice, queries: slice) -> np.ndarray:
        """The mask cells of one tile: (t|1, n_k|1) when shared by every group, else (g, t|1, n_k|1)."""
        mask = self.array
        rows = queries if mask.shape[-2] > 1 else slice(None)
        if all(size == 1 for size in mask.shape[:-2]):
            return mask.reshape(mask.shape[-2:])[rows]
        full = np.broadcast_to(mask, (*self.batch_shape, *mask.shape[-2:]))
        index = np.unravel_index(np.arange(groups.start, groups.stop), self.batch_shape)
        return full[(*index, rows)]


def _tiles(groups: int, n_q: int, n_k: int, itemsize: int):
    """Slices (group range, query range) covering (groups, n_q) in tiles of about TILE_BYTES."""
    elements = TILE_BYTES // itemsize
    rows = max(1, min(n_q, elements // max(n_k, 1)))
    group_step = max(1, elements // (rows * max(n_k, 1)))
    for g0, q0 in itertools.product(range(0, groups, group_step), range(0, n_q, rows)):
        yield slice(g0, min(g0 + group_step, groups)), slice(q0, min(q0 + rows, n_q))


@functools.lru_cache(maxsize=64)
def _future_cached(first_query: int, queries: int, keys: int) -> np.ndarray:
    hidden = _future(first_query, queries, keys)
    hidden.flags.writeable = False                      # shared by every later call
    return hidden


def _future(first_query: int, queries: int, keys: int) -> np.ndarray:
    """(queries, keys): True where key j comes after query ``first_query + i``, what causal attention hides."""
    return ~np.tri(queries, keys, k=first_query, dtype=bool)


def _hidden_tile(mask: GroupMask | None, groups: slice, queries: slice, n_k: int, causal: bool):
    """Cells of one tile to hide, broadcastable to (g, t, n_k); None when every cell is allowed."""
    hidden = None
    if causal:                                          # key j visible to query i iff j <= i
        shape = (queries.start, queries.stop - queries.start, n_k)
        hidden = _future_cached(*shape) if shape[1] * n_k <= SMALL_CELLS else _future(*shape)
    if mask is not None:
        user = ~mask.tile(groups, queries)
        hidden = user if hidden is None else (user | hidden)
    return hidden


def attend_groups(q, k, v, mask: GroupMask | None, causal: bool, weights: np.ndarray | None) -> np.ndarray:
    """The kernel: softmax(q k^T) v over tiles, for G groups (batch items x heads) already flattened
    and checked, q already scaled. q (G, n_q, d_k), k (G, n_k, d_k), v (G, n_k, d_v).

    ``weights``: None, or the C-contiguous (G, n_q, n_k) array to write them into. Returns the output
    (G, n_q, d_v), unchecked: call inside ``np.errstate(over="ignore", invalid="ignore")`` and check
    the result (or what is computed from it) for overflow.
    """
    groups, n_q, _ = q.shape
    n_k, d_v = v.shape[-2:]
    k_t = k.swapaxes(-1, -2)                            # (G, d_k, n_k), a view
    output = np.empty((groups, n_q, d_v), dtype=q.dtype)
    # Looking at every score tile costs a pass over it; the bound costs a pass over q and k and
    # nearly always proves no score can overflow: take the cheaper.
    check_scores = groups * n_q * n_k <= max(SMALL_CELLS, q.size + k.size) or _scores_may_overflow(q, k)
    # Finite scores leave a row without any finite one only when a user mask hides all its keys (a causal
    # row always sees key 0).
    rows_may_be_empty = mask is not None
    if groups * n_q * n_k * q.itemsize <= TILE_BYTES:   # one tile: the whole problem, no slicing
        tile = weights if weights is not None else np.empty((groups, n_q, n_k), dtype=q.dtype)
        hidden = _hidden_tile(mask, slice(0, groups), slice(0, n_q), n_k, causal)
        _attend_tile(q, k_t, v, hidden, tile, output, check_scores, rows_may_be_empty)
        return output
    scratch = None
    for gs, qs in _tiles(groups, n_q, n_k, q.itemsize):
        if weights is not None:
            tile = weights[gs, qs]                      # write scores straight into the result
        else:
            shape = (gs.stop - gs.start, qs.stop - qs.start, n_k)
            if scratch is None or scratch.shape != shape:
                scratch = np.empty(shape, dtype=q.dtype)
            tile = scratch
        hidden = _hidden_tile(mask, gs, qs, n_k, causal)
        _attend_tile(q[gs, qs], k_t[gs], v[gs], hidden, tile, output[gs, qs], check_scores, rows_may_be_empty)
    return output


def _attend_tile(q, k_t, v, hidden, tile, out, check_scores: bool, rows_may_be_empty: bool) -> None:
    """One tile: q (g, t, d_k) scaled, k_t (g, d_k, n_k), v (g, n_k, d_v); ``hidden`` None or cells
    broadcastable to (g, t, n_k). The weights are written into ``tile`` (g, t, n_k), the output into ``out``."""
    np.matmul(q, k_t, out=tile)                         # (g, t, n_k) scaled scores
    if check_scores:
        _require_finite_scores(tile)
    if hidden is not None:
        np.copyto(tile, -np.inf, where=hidden)          # -inf, not 0: 0 is an ordinary score
    _softmax_rows_inplace(tile, rows_may_be_empty=rows_may_be_empty)
    np.matmul(tile, v, out=out)                         # (g, t, d_v) weighted blend of values


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
    if abs(scale) > _LARGEST[dtype]:
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
        _require_finite_scores(scores)
        _require_finite_scores(scaled)
        hidden = ~np.broadcast_to(allowed, full)
        weights = np.where(hidden, -np.inf, scaled)     # -inf: softmax gives these exactly 0
        _softmax_rows_inplace(weights)
        output = weights @ v
    require_finite(output, "value")
    return AttentionTrace(scores, scaled, np.ma.masked_array(scaled, mask=hidden), weights, output)


def _print_stages(trace: AttentionTrace) -> None:
    """What the seed's ``verbose=True`` prints, with each stage named for what it is."""
    print("  scaled scores (QK^T / sqrt(d_k)):\n", trace.scaled_scores)
    print("  attention weights (each row sums to 1):\n", trace.weights)
    print("  row sums:", trace.weights.sum(axis=-1))
