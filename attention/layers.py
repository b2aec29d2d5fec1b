"""Self-attention with the seed script's random weights, and what the attention layers share: seeded and
explicit projections, their precision casts, the input and mask checks (multi-head attention builds on these in
``attention/multihead.py``).

Self-attention: Q, K and V are three projections of the *same* input, because a token
plays three roles at once: what it looks for (Q), what it offers to be found by (K), and
what it hands over when chosen (V). Multi-head attention runs h such projections side by
side in d_model / h dims each, so h kinds of relationship are tracked at once, then
concatenates the heads and mixes them with W_o (section 3.2.2).

Weights are random (nothing is trained here) and drawn exactly as the seed script does,
so seed=0 reproduces its numbers. Explicit weights may be passed instead.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (
    FLOAT64,
    as_bool_mask,
    as_real_array,
    check_shape,
    in_working_dtype,
    positive_int,
    seed_int,
    to_working,
)
from ._memo import ByteBudgetMemo
from .errors import AttentionError
from .functional import (
    Attended,
    AttentionTrace,
    attend,
    default_scale,
    require_finite,
    scaled_dot_product_attention,
    trace_attention,
)
from .masks import is_per_head

WEIGHT_STD = 0.5      # the seed script's scale for every random projection
OUTPUT_SEED_OFFSET = 99  # W_o comes from default_rng(seed + 99), as in the seed script


def _draw_projections(d_model: int, d_k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W_q, W_k, W_v (d_model, d_k) drawn in that order from default_rng(seed).normal(0, 0.5), read-only."""
    rng = np.random.default_rng(seed)
    weights = tuple(rng.normal(0, WEIGHT_STD, (d_model, d_k)) for _ in range(3))
    for w in weights:
        w.setflags(write=False)        # memoised and shared: nobody may change a draw
    return weights


# A service builds the same seeded layers on every request: recent draws are kept, within a budget.
seeded_projections = ByteBudgetMemo(_draw_projections, lambda ws: 3 * ws[0].nbytes, max_bytes=16 << 20)


def _explicit(value, name: str, shape: tuple[int, ...], meaning: str) -> np.ndarray:
    """A caller-supplied weight matrix, checked for dtype, finiteness and shape; a read-only float64
    copy, so changing the caller's array later changes nothing here (nor the cached casts)."""
    array = as_real_array(value, name, 1)
    check_shape(array, name, shape, meaning)
    array = np.array(array, dtype=np.float64)
    array.flags.writeable = False
    return array


def _finite_projections(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A trace's q, k, v, checked: finite input times the weights may overflow, and that is the input's fault,
    said as such (the trace's own argument checks would call the projections non-finite input)."""
    for projection in (q, k, v):
        require_finite(projection, "X")
    return q, k, v


def _input(X: ArrayLike, name: str, d_model: int, min_rank: int = 2) -> np.ndarray:
    """The layer input (..., n, d_model) in the working dtype."""
    x = as_real_array(X, name, min_rank)
    if x.shape[-1] != d_model:
        raise AttentionError(name, f"expected shape (..., d_model={d_model}), got {x.shape}")
    return in_working_dtype(x, name)


class CastCache(dict):
    """Weights cast once per working dtype (float32 inputs must not upcast the computation):
    ``cache[dtype]`` is {name: weights in that dtype}. A dict, so a hit costs no Python call."""

    def __init__(self, **weights: np.ndarray) -> None:
        super().__init__({FLOAT64: {k: w.astype(np.float64, copy=False) for k, w in weights.items()}})

    def __missing__(self, dtype: np.dtype) -> dict[str, np.ndarray]:
        cast = {k: to_working(w, dtype, k) for k, w in self[FLOAT64].items()}
        for w in cast.values():
            w.setflags(write=False)        # shared by every later call, as the float64 weights are
        self[dtype] = cast
        return cast

    @property
    def nbytes(self) -> int:
        """Bytes held once a float32 request has added its copies (half the float64 weights' size): what a
        memo of these weights budgets for."""
        return sum(w.nbytes for w in self[FLOAT64].values()) * 3 // 2


class SelfAttention:
    """One attention head over its own input: X -> (XW_q, XW_k, XW_v) -> attention.

    ``SelfAttention(d_model, d_k, seed)`` draws W_q, W_k, W_v (d_model, d_k) like the seed
    script; pass ``w_q``, ``w_k``, ``w_v`` to use explicit weights instead.
    """

    def __init__(self, d_model: int, d_k: int | None = None, seed: int = 0, *, w_q: ArrayLike | None = None,
                 w_k: ArrayLike | None = None, w_v: ArrayLike | None = None) -> None:
        self.d_model = positive_int(d_model, "d_model")
        self.d_k = self.d_model if d_k is None else positive_int(d_k, "d_k")
        missing = (w_q is None) + (w_k is None) + (w_v is None)
        if missing not in (0, 3):
            raise AttentionError("weights", "give all of w_q, w_k, w_v or none of them")
        if not missing:
            shape, meaning = (self.d_model, self.d_k), "(d_model, d_k)"
            self.W_q, self.W_k, self.W_v = (
                _explicit(w, n, shape, meaning) for w, n in ((w_q, "w_q"), (w_k, "w_k"), (w_v, "w_v"))
            )
        else:
            self.W_q, self.W_k, self.W_v = seeded_projections(self.d_model, self.d_k, seed_int(seed))
        self._cast = CastCache(w_q=self.W_q, w_k=self.W_k, w_v=self.W_v)

    def weights_in(self, dtype: np.dtype | type = np.float64) -> dict[str, np.ndarray]:
        """W_q, W_k, W_v (d_model, d_k), read-only, as the layer computes with them in ``dtype``."""
        return dict(self._cast[np.dtype(dtype)])

    def _project(self, X):
        x = _input(X, "X", self.d_model)
        w = self._cast[x.dtype]
        with np.errstate(over="ignore", invalid="ignore"):        # an overflow surfaces as a clear error later
            return x @ w["w_q"], x @ w["w_k"], x @ w["w_v"]      # each (..., n, d_k)

    def __call__(self, X: ArrayLike, mask: ArrayLike | None = None, verbose: bool = False, *, causal: bool = False,
                 return_weights: bool = True) -> Attended:
        """X (..., n, d_model) -> (output (..., n, d_k), weights (..., n, n) or None)."""
        q, k, v = self._project(X)
        if verbose:
            return scaled_dot_product_attention(q, k, v, mask, verbose=True, causal=causal,
                                                return_weights=return_weights)
        mask = _layer_mask(mask, q.shape[:-2], q.shape[-2], per_head=False)
        return attend(q, k, v, mask, scale=default_scale(self.d_k), causal=causal, return_weights=return_weights,
                      q_is_scratch=True)

    def trace(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False) -> AttentionTrace:
        """Every stage for X (..., n, d_model), including the projections q, k, v."""
        q, k, v = self._project(X)
        mask = _layer_mask(mask, q.shape[:-2], q.shape[-2], per_head=False)  # a bad mask first, as without trace
        stages = trace_attention(*_finite_projections(q, k, v), mask, causal=causal)
        return AttentionTrace(**{**stages.__dict__, "q": q, "k": k, "v": v})


def _layer_mask(mask, batch: tuple[int, ...], n: int, *, per_head: bool, n_heads: int = 1):
    """Check a layer's mask against its input; return it ready to broadcast over (batch, [h,] n, n).

    A mask with one axis more than the input's batch + (n, n) is per head; otherwise it is
    shared by every head and gets a head axis inserted.
    """
    if mask is None:
        return None
    mask = np.asarray(mask)
    if per_head and is_per_head(mask.ndim, len(batch) + 2):
        return as_bool_mask(mask, "mask", (*batch, n_heads, n, n))
    mask = as_bool_mask(mask, "mask", (*batch, n, n))
    return mask[..., None, :, :] if per_head and mask.ndim >= 2 else mask
