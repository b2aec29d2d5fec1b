"""The fast kernel behind ``attend`` and multi-head attention: softmax(q k^T) v over cache-sized tiles.

It walks the queries in tiles so each tile of scores is written once, normalised in place while it is still
in cache, and multiplied by V straight away. With the weights asked for, the tiles are the returned weights
array itself; without, one scratch tile is reused. No Python loop over heads or batch items: the loop is over
tiles, and small problems are a single tile. Shapes: q (G, n_q, d_k), k (G, n_k, d_k), v (G, n_k, d_v), the
G groups (batch items x heads) already flattened and checked by the callers in ``functional`` and ``layers``.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from ._checks import all_finite
from .errors import AttentionError

# Bytes in one score tile. Small enough to stay in cache between the score matmul, the softmax
# passes and weights @ V; large enough that BLAS gets matmuls worth splitting over its threads.
TILE_BYTES = 4 << 20
# Below this many cells a numpy call costs about the same whatever the size: small problems take the
# simple way (check every score, keep their causal mask) where large ones must save passes and memory.
SMALL_CELLS = 1 << 14
LARGEST = {np.dtype(t): float(np.finfo(t).max) for t in (np.float32, np.float64)}  # per working dtype


def softmax_rows_inplace(tile: np.ndarray, *, rows_may_be_empty: bool = True) -> None:
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
    return not bound < LARGEST[q.dtype] / 4


def require_finite_scores(scores: np.ndarray) -> None:
    """-inf must mean "masked" only: a score that overflowed to +-inf is the input's fault."""
    if not all_finite(scores):
        raise AttentionError("query", "the attention scores overflowed: input values are too large")


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
        require_finite_scores(tile)
    if hidden is not None:
        np.copyto(tile, -np.inf, where=hidden)          # -inf, not 0: 0 is an ordinary score
    softmax_rows_inplace(tile, rows_may_be_empty=rows_may_be_empty)
    np.matmul(tile, v, out=out)                         # (g, t, d_v) weighted blend of values
