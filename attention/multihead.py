"""Multi-head attention (section 3.2.2): h heads side by side, each in d_model / h dims, concatenated and mixed.

Each head has its own W_q, W_k, W_v, drawn as the seed script draws them (head i from seed + i, W_o from
seed + 99), so h kinds of relationship are tracked at once; W_o mixes what the heads found. The heads run as
one batched kernel call (``attention/kernel.py``) over batch items taken in chunks of about CHUNK_BYTES.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ._checks import check_shape, positive_int, seed_int
from ._memo import ByteBudgetMemo
from .analyses import AttentionNorms, attention_norms
from .errors import AttentionError
from .functional import Attended, AttentionTrace, default_scale, require_finite, trace_attention
from .kernel import GroupMask, attend_groups
from .layers import (
    OUTPUT_SEED_OFFSET,
    WEIGHT_STD,
    CastCache,
    _draw_projections,
    _explicit,
    _finite_projections,
    _input,
    _layer_mask,
)


@dataclass(frozen=True)
class _HeadWeights:
    """Every head's projections stacked as one (3, h, d_model, d_k) array (Q, K, V), with
    w_q, w_k, w_v read-only views into it, and W_o (d_model, d_model)."""

    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray
    cast: CastCache

    @classmethod
    def build(cls, w_q: np.ndarray, w_k: np.ndarray, w_v: np.ndarray, w_o: np.ndarray) -> _HeadWeights:
        """Stack the projections; our own read-only copies, so callers keep theirs."""
        w_qkv = np.stack([w_q, w_k, w_v]).astype(np.float64)          # (3, h, d_model, d_k)
        w_o = np.array(w_o, dtype=np.float64)
        for w in (w_qkv, w_o):
            w.setflags(write=False)
        return cls(w_qkv[0], w_qkv[1], w_qkv[2], w_o, CastCache(w_qkv=w_qkv[:, None], w_o=w_o))


def _draw_heads(d_model: int, n_heads: int, seed: int) -> _HeadWeights:
    """Head i = SelfAttention(d_model, d_k, seed + i)'s weights; W_o from default_rng(seed + 99)."""
    per_head = [_draw_projections(d_model, d_model // n_heads, seed + i) for i in range(n_heads)]
    w_q, w_k, w_v = (np.stack(ws) for ws in zip(*per_head, strict=True))
    w_o = np.random.default_rng(seed + OUTPUT_SEED_OFFSET).normal(0, WEIGHT_STD, (d_model, d_model))
    return _HeadWeights.build(w_q, w_k, w_v, w_o)


# Seeded multi-head weight sets within 64 MiB per process (d_model=512 takes 12 MiB with float32 copies).
_seeded_heads = ByteBudgetMemo(_draw_heads, lambda heads: heads.cast.nbytes, max_bytes=64 << 20)


class MultiHeadAttention:
    """h attention heads computed together, concatenated and mixed by W_o.

    ``MultiHeadAttention(d_model, n_heads, seed=s)``: head i uses the weights of
    ``SelfAttention(d_model, d_model // n_heads, seed=s + i)`` and W_o is drawn from
    default_rng(s + 99): s = 0 is exactly the seed script. Explicit weights: ``w_q``,
    ``w_k``, ``w_v`` (h, d_model, d_k) and ``w_o`` (d_model, d_model).
    """

    def __init__(self, d_model: int, n_heads: int, seed: int = 0, *, w_q: ArrayLike | None = None,
                 w_k: ArrayLike | None = None, w_v: ArrayLike | None = None, w_o: ArrayLike | None = None) -> None:
        self.d_model = positive_int(d_model, "d_model")
        self.n_heads = positive_int(n_heads, "n_heads")
        if self.d_model % self.n_heads:
            raise AttentionError("n_heads", f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        self.d_k = self.d_model // self.n_heads
        missing = (w_q is None) + (w_k is None) + (w_v is None) + (w_o is None)
        if missing not in (0, 4):
            raise AttentionError("weights", "give all of w_q, w_k, w_v, w_o or none of them")
        if not missing:
            shape, meaning = (self.n_heads, self.d_model, self.d_k), "(n_heads, d_model, d_k)"
            heads = _HeadWeights.build(
                *(_explicit(w, n, shape, meaning) for w, n in ((w_q, "w_q"), (w_k, "w_k"), (w_v, "w_v"))),
                _explicit(w_o, "w_o", (self.d_model, self.d_model), "(d_model, d_model)"))
        else:
            heads = _seeded_heads(self.d_model, self.n_heads, seed_int(seed))
        self.w_q, self.w_k, self.w_v, self.w_o = heads.w_q, heads.w_k, heads.w_v, heads.w_o
        self._cast = heads.cast
        self._scale = default_scale(self.d_k)

    def weights_in(self, dtype: np.dtype | type = np.float64) -> dict[str, np.ndarray]:
        """W_q, W_k, W_v (h, d_model, d_k) and W_o (d_model, d_model), read-only, as the layer computes with them
        in ``dtype``."""
        cast = self._cast[np.dtype(dtype)]
        w_q, w_k, w_v = cast["w_qkv"][:, 0]                           # each (h, d_model, d_k)
        return {"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": cast["w_o"]}

    def _project(self, X):
        """X (..., n, d_model) -> q, k, v each (..., h, n, d_k), contiguous views of one new buffer."""
        with np.errstate(over="ignore", invalid="ignore"):          # an overflow surfaces as a clear error later
            qkv = self._qkv(_input(X, "X", self.d_model))
        return qkv[0], qkv[1], qkv[2]

    def _qkv(self, x: np.ndarray) -> np.ndarray:
        """Checked x (..., n, d_model) -> (3, ..., h, n, d_k): Q, K and V of every head; the caller sets np.errstate."""
        w = self._cast[x.dtype]["w_qkv"]                       # (3, 1, h, d_model, d_k): for one batch axis
        if x.ndim != 3:
            w = w.reshape(3, *(1,) * (x.ndim - 2), self.n_heads, self.d_model, self.d_k)
        # (1, ..., 1, n, d_model) @ (3, 1.., h, d_model, d_k): every head of Q, K and V in one call, laid
        # out (3, ..., h, n, d_k) so each of q, k, v is contiguous and needs no copy before attention.
        return np.matmul(x[None, ..., None, :, :], w)

    def _heads(self, items: np.ndarray, mask, causal: bool, weights: np.ndarray | None,
               out: np.ndarray | None = None) -> np.ndarray:
        """Every head's attention over checked ``items`` (b, n, d_model), side by side: (b, n, h*d_k), written
        into ``out`` when given. ``mask``: None or broadcastable to (b, h, n, n); ``weights``: None or the
        (b*h, n, n) array to fill. The caller sets np.errstate and checks for overflow."""
        b, n, _ = items.shape
        groups = b * self.n_heads
        q, k, v = self._qkv(items).reshape(3, groups, n, self.d_k)  # each (b*h, n, d_k), a view
        q *= self._scale                               # q is ours: scaled in place, n*d_k work instead of n*n
        wrapped = None if mask is None else GroupMask(np.atleast_2d(mask), (b, self.n_heads))
        heads = attend_groups(q, k, v, wrapped, causal, weights)      # (b*h, n, d_k)
        return self._concatenate(heads.reshape(b, self.n_heads, n, self.d_k), out=out)

    def _concatenate(self, heads: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(..., h, n, d_k) -> the heads side by side (..., n, h*d_k), into ``out`` when given."""
        lead = tuple(range(heads.ndim - 3))
        side_by_side = heads.transpose(*lead, -2, -3, -1)          # (..., n, h, d_k), a view
        if out is None:
            return side_by_side.reshape(*heads.shape[:-3], heads.shape[-2], self.d_model)
        out.reshape(side_by_side.shape)[...] = side_by_side
        return out

    def _mix(self, concatenated: np.ndarray) -> np.ndarray:
        """(..., n, h*d_k) @ W_o -> (..., n, d_model); the caller sets np.errstate."""
        mixed = concatenated @ self._cast[concatenated.dtype]["w_o"]
        require_finite(mixed, "X")                                   # also catches heads that overflowed
        return mixed

    def __call__(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False,
                 return_weights: bool = True) -> Attended:
        """X (..., n, d_model) -> (output (..., n, d_model), weights (..., h, n, n) or None).

        ``mask``: boolean, broadcastable to (..., n, n) (shared by every head) or, with one
        more axis than X, to (..., h, n, n) (one mask per head).

        Batch items go through in chunks of about CHUNK_BYTES of Q, K and V (small inputs: one chunk,
        computed whole), each chunk's heads written straight into the concatenated array: peak memory
        stays near the input, the returned arrays and one chunk, not three more copies of the whole batch.
        """
        x = _input(X, "X", self.d_model)
        lead, n = x.shape[:-2], x.shape[-2]
        mask = _layer_mask(mask, lead, n, per_head=True, n_heads=self.n_heads)
        items = x.reshape(-1, n, self.d_model)                                      # (B, n, d_model)
        weights = np.empty((len(items) * self.n_heads, n, n), x.dtype) if return_weights else None  # (B*h, n, n)
        output = self._forward(items, mask, lead, causal, weights).reshape(*lead, n, self.d_model)
        return output, None if weights is None else weights.reshape(*lead, self.n_heads, n, n)

    # Overflow is detected and reported after W_o. (np.errstate as a decorator: cheaper than a `with`.)
    @np.errstate(over="ignore", invalid="ignore")
    def _forward(self, items: np.ndarray, mask, lead: tuple[int, ...], causal: bool,
                 weights: np.ndarray | None) -> np.ndarray:
        """Checked items (B, n, d_model) -> the output (B, n, d_model), chunk by chunk; ``mask`` from
        :func:`_layer_mask` (batch axes ``lead``), ``weights`` None or the (B*h, n, n) array to fill."""
        step = _items_per_chunk(3 * items.nbytes // len(items))  # Q, K and V of one item
        if step >= len(items):                                      # one chunk: computed whole
            concatenated = self._heads(items, _items_of(mask, lead, slice(0, len(items))), causal,
                                       weights)                     # (B, n, h*d_k)
        else:
            concatenated = np.empty_like(items)
            for start in range(0, len(items), step):
                chunk = slice(start, min(start + step, len(items)))
                heads = slice(chunk.start * self.n_heads, chunk.stop * self.n_heads)
                self._heads(items[chunk], _items_of(mask, lead, chunk), causal,
                            None if weights is None else weights[heads], out=concatenated[chunk])
        return self._mix(concatenated)

    def norms(self, X: ArrayLike, weights: np.ndarray) -> AttentionNorms:
        """Norm-based attention: the ``weights`` (..., h, n, n) this layer gave X (..., n, d_model), each weighed by
        the size of what it moves, f_h(x_j) = x_j W_V^h W_O[h's rows] (no bias). The value vectors are computed
        again from X: one (n, d_model) @ (d_model, d_model) product."""
        x = _input(X, "X", self.d_model)
        check_shape(weights, "weights", (*x.shape[:-2], self.n_heads, x.shape[-2], x.shape[-2]), "(..., h, n, n)")
        cast = self._cast[x.dtype]
        with np.errstate(over="ignore", invalid="ignore"):
            values = x[..., None, :, :] @ cast["w_qkv"][2, 0]                   # (..., h, n, d_k)
            norms = attention_norms(weights.astype(x.dtype, copy=False), values, cast["w_o"])
        require_finite(norms.layer, "X")
        return norms

    def trace(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False) -> AttentionTrace:
        """Every stage per head (..., h, n, *), with q, k, v per head; output is after W_o."""
        q, k, v = self._project(X)
        mask = _layer_mask(mask, q.shape[:-3], q.shape[-2], per_head=True, n_heads=self.n_heads)  # first, as untraced
        stages = trace_attention(*_finite_projections(q, k, v), mask, causal=causal)
        with np.errstate(over="ignore", invalid="ignore"):
            output = self._mix(self._concatenate(stages.output))
        return AttentionTrace(**{**stages.__dict__, "output": output, "q": q, "k": k, "v": v})


CHUNK_BYTES = 4 << 20  # Q, K and V of this many bytes at a time (at least one batch item)


def _items_per_chunk(item_bytes: int) -> int:
    """Whole batch items per chunk: about CHUNK_BYTES of Q, K, V, and at least one item."""
    return max(1, CHUNK_BYTES // max(item_bytes, 1))


def _items_of(mask, lead: tuple[int, ...], items: slice):
    """The part of a layer mask (..., h|1, n|1, n) for a slice of the batch items flattened from
    ``lead``; a mask without batch axes is shared by every item and returned as it is. Only that
    part is ever materialised (a view with one batch axis, a gather of the slice with more)."""
    if mask is None or mask.ndim <= 3:
        return mask
    full = np.broadcast_to(mask, (*lead, *mask.shape[-3:]))        # a view, whatever the mask's batch axes
    if len(lead) == 1:
        return full[items]
    return full[np.unravel_index(np.arange(items.start, items.stop), lead)]
