"""The encoder block and the encoder stack (the seed's summary, points 6 and 7).

    block   = multi-head attention -> add & layer norm -> feed-forward -> add & layer norm
    encoder = N blocks, each feeding the next (N = 6 in the paper)

The residual "add" lets each sub-layer learn a correction instead of a whole new
representation; layer norm keeps every token's vector at mean 0, variance 1 so a deep
stack stays numerically tame. Nothing here is learned: the norm has unit scale and zero
shift, and the weights are random draws from a seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ._checks import as_real_array, in_working_dtype, positive_int, seed_int
from ._memo import ByteBudgetMemo
from .analyses import AttentionNorms
from .errors import AttentionError
from .functional import Attended, AttentionTrace
from .layers import CastCache, _input
from .multihead import MultiHeadAttention

LAYER_NORM_EPS = 1e-5        # PyTorch's default: keeps a constant row from dividing by zero
FEED_FORWARD_SEED_OFFSET = 200
LAYER_SEED_STRIDE = 1000     # layer i of an Encoder is EncoderBlock(seed = seed + 1000 * i)


def layer_norm(x: ArrayLike, eps: float = LAYER_NORM_EPS) -> np.ndarray:
    """Normalise each row (last axis) of x (..., d) to mean 0 and variance 1: unit scale, zero shift.

    Integers are normalised as float64 (in their own dtype, eps would be 0 and a constant row 0/0).
    A row too large to square (|x| ~ 1e154 in float64, 1e19 in float32) has an infinite variance,
    which would divide it to zeros: that is an error, not an answer.
    """
    x = in_working_dtype(as_real_array(x, "x"), "x")
    with np.errstate(over="ignore", invalid="ignore"):
        return _layer_norm(x, eps)


def _layer_norm(x: np.ndarray, eps: float = LAYER_NORM_EPS) -> np.ndarray:
    """:func:`layer_norm` for callers already inside ``np.errstate`` (one context per block, not per norm)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    if not np.isfinite(var).all():
        raise AttentionError("X", "the layer norm overflowed: input values are too large")
    return (x - mean) / np.sqrt(var + x.dtype.type(eps))


@dataclass(frozen=True)
class _FeedForwardWeights:
    """A block's W_1 (d_model, d_ff) and W_2 (d_ff, d_model), read-only, with their casts per working dtype."""

    w_1: np.ndarray
    w_2: np.ndarray
    cast: CastCache


def _draw_feed_forward(d_model: int, d_ff: int, seed: int) -> _FeedForwardWeights:
    """W_1 ~ N(0, 1/sqrt(d_model)) then W_2 ~ N(0, 1/sqrt(d_ff)), from default_rng(seed + 200)."""
    rng = np.random.default_rng(seed + FEED_FORWARD_SEED_OFFSET)
    w_1 = rng.normal(0, 1 / np.sqrt(d_model), (d_model, d_ff))
    w_2 = rng.normal(0, 1 / np.sqrt(d_ff), (d_ff, d_model))
    for w in (w_1, w_2):
        w.setflags(write=False)        # memoised and shared: nobody may change a draw
    return _FeedForwardWeights(w_1, w_2, CastCache(w_1=w_1, w_2=w_2))


# A service builds the same seeded encoder on every request, and drawing is slow: recent feed-forward draws are
# kept within 64 MiB per process (d_model=512, d_ff=2048: 24 MiB a layer with float32 copies).
_seeded_feed_forward = ByteBudgetMemo(_draw_feed_forward, lambda weights: weights.cast.nbytes, max_bytes=64 << 20)


class EncoderBlock:
    """One transformer encoder block over X (..., n, d_model).

    Seeded: the attention is ``MultiHeadAttention(d_model, n_heads, seed)``; the
    feed-forward weights W_1 (d_model, d_ff) ~ N(0, 1/sqrt(d_model)) and
    W_2 (d_ff, d_model) ~ N(0, 1/sqrt(d_ff)) come, in that order, from
    default_rng(seed + 200); biases are zero.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, seed: int = 0) -> None:
        self.attention = MultiHeadAttention(d_model, n_heads, seed)
        self.d_model = self.attention.d_model
        self.d_ff = 4 * self.d_model if d_ff is None else positive_int(d_ff, "d_ff")
        weights = _seeded_feed_forward(self.d_model, self.d_ff, seed_int(seed))
        self.w_1, self.w_2, self._cast = weights.w_1, weights.w_2, weights.cast

    def feed_forward(self, x: ArrayLike) -> np.ndarray:
        """Position-wise: each token of x (..., d_model) alone goes through ReLU(x W_1) W_2 -> (..., d_model);
        one token (d_model,) too. Integers are taken as float64 (cast to an integer dtype, the weights would
        round to 0)."""
        return self._feed_forward(_input(x, "x", self.d_model, min_rank=1))

    def _feed_forward(self, x: np.ndarray) -> np.ndarray:
        """:meth:`feed_forward` of a checked x in its working dtype."""
        w = self._cast[x.dtype]
        hidden = x @ w["w_1"]                             # (..., n, d_ff)
        np.maximum(hidden, 0, out=hidden)                 # ReLU
        return hidden @ w["w_2"]                          # (..., n, d_model)

    def __call__(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False,
                 return_weights: bool = True) -> Attended:
        """X (..., n, d_model) -> (output (..., n, d_model), weights (..., h, n, n) or None)."""
        attended, weights = self.attention(X, mask, causal=causal, return_weights=return_weights)
        return self._after_attention(X, attended)[-1], weights

    def with_norms(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, AttentionNorms]:
        """:meth:`__call__` with the weights' norm-based attention: (output (..., n, d_model), weights (..., h, n, n),
        norms: heads (..., h, n, n), layer (..., n, n))."""
        attended, weights = self.attention(X, mask, causal=causal)
        return self._after_attention(X, attended)[-1], weights, self.attention.norms(X, weights)

    def trace(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False) -> EncoderLayerTrace:
        """Every stage of the block for X (..., n, d_model): attention (per head), both add & norms, FFN."""
        stages = self.attention.trace(X, mask, causal=causal)
        first, feed_forward, output = self._after_attention(X, stages.output)
        return EncoderLayerTrace(stages, first, feed_forward, output)

    def _after_attention(self, X, attended: np.ndarray):
        """add & norm -> feed-forward -> add & norm; returns the three stages, each (..., n, d_model)."""
        # An overflow (inf or NaN) reaches the next variance, which _layer_norm refuses: no other check.
        with np.errstate(over="ignore", invalid="ignore"):
            first = _layer_norm(np.asarray(X, dtype=attended.dtype) + attended)  # add & norm
            feed_forward = self._feed_forward(first)
            output = _layer_norm(first + feed_forward)                        # add & norm
        return first, feed_forward, output


class LayerTrace:
    """A layer's trace (a dataclass whose first field is its ``attention`` trace, then its stages)."""

    def as_dict(self) -> dict:
        """The attention's stages (``AttentionTrace.as_dict``), then each later stage by its name."""
        stages = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return {**stages, "attention": stages["attention"].as_dict()}


@dataclass(frozen=True)
class EncoderLayerTrace(LayerTrace):
    """One block's stages: the attention trace (per head; its output is after W_o), the first
    add & norm, the feed-forward output, and the block output, each (..., n, d_model)."""

    attention: AttentionTrace
    add_norm_1: np.ndarray
    feed_forward: np.ndarray
    output: np.ndarray


class Encoder:
    """``n_layers`` encoder blocks; layer i is ``EncoderBlock(..., seed=seed + 1000 * i)``."""

    def __init__(self, d_model: int, n_heads: int, n_layers: int = 6, d_ff: int | None = None, seed: int = 0):
        seed = seed_int(seed)
        self.blocks = [
            EncoderBlock(d_model, n_heads, d_ff, seed + LAYER_SEED_STRIDE * i)
            for i in range(positive_int(n_layers, "n_layers"))
        ]

    def __call__(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False,
                 return_weights: bool = True) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """X (..., n, d_model) -> (output (..., n, d_model), [weights (..., h, n, n) per layer])."""
        x, per_layer = X, []
        for block in self.blocks:                          # layers are sequential by nature
            x, weights = block(x, mask, causal=causal, return_weights=return_weights)
            per_layer.append(weights)
        return x, per_layer

    def with_norms(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False) -> EncoderOutput:
        """:meth:`__call__` keeping every layer's weights and their norm-based attention: :class:`EncoderOutput`."""
        x, weights, norms = X, [], []
        for block in self.blocks:
            x, layer_weights, layer_norms = block.with_norms(x, mask, causal=causal)
            weights.append(layer_weights)
            norms.append(layer_norms)
        return EncoderOutput(x, weights, norms)

    def trace(self, X: ArrayLike, mask: ArrayLike | None = None, *, causal: bool = False) -> list[EncoderLayerTrace]:
        """Every stage of every layer, in order; the last layer's ``output`` is the encoder's."""
        x, layers = X, []
        for block in self.blocks:
            layers.append(block.trace(x, mask, causal=causal))
            x = layers[-1].output
        return layers


@dataclass(frozen=True)
class EncoderOutput:
    """``output`` (..., n, d_model); per layer its ``weights`` (..., h, n, n) and ``norms``, its norm-based attention
    (``AttentionNorms``: heads (..., h, n, n), layer (..., n, n))."""

    output: np.ndarray
    weights: list[np.ndarray]
    norms: list[AttentionNorms]
