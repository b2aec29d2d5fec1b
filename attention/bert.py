"""A trained BERT-family encoder, computed with the engine's own attention kernel.

BERT is the paper's encoder stack (``attention/encoder.py``) with everything learned, and three
additions at the bottom:

    embeddings = LayerNorm(word[token] + position[i] + token_type[segment])
    each layer = self-attention (with biases) -> add & LayerNorm -> GELU feed-forward -> add & LayerNorm

Positions are learned vectors, not sinusoids; the token type tells the first sentence of a pair from
the second. The layer norm comes after each residual add ("post-LN"), as in the paper.

The weights are the checkpoint's, rearranged once into the layout this forward pass wants
(``attention/checkpoint.py``: ``x @ W`` with W (d_in, d_out), Q, K and V side by side), in float32.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._checks import chosen_layers
from .analyses import AttentionNorms, attention_norms
from .blocks import gelu, learned_layer_norm, linear
from .checkpoint import BertConfig, LayerWeights, frozen, norm
from .encoder import EncoderLayerTrace
from .errors import AttentionError
from .functional import AttentionTrace, default_scale, require_finite, trace_attention
from .interventions import LayerStages, chosen_heads, knocked_out
from .kernel import GroupMask, attend_groups
from .masks import padding_mask, zero_padding


@dataclass(frozen=True)
class BertOutput:
    """``output`` (B, n, d_model), the last hidden state; ``weights``: per layer (B, h, n, n) (None for a layer
    not asked for), or None;
    ``hidden_states``: the embeddings and every layer's output, n_layers + 1 arrays (B, n, d_model), or None;
    ``norms``: per layer its norm-based attention (``AttentionNorms``: heads (B, h, n, n), layer (B, n, n)), None
    for a layer not asked for, or None.
    Padded positions (past an item's length) are zeros in every array, as padded query rows of the weights."""

    output: np.ndarray
    weights: list[np.ndarray] | None
    hidden_states: list[np.ndarray] | None
    norms: list[AttentionNorms | None] | None = None


class Bert:
    """A BERT encoder over token ids: ``Bert(config, tensors)`` with the checkpoint's tensors by their
    Hugging Face names (without the ``bert.`` prefix; the pooler is not used)."""

    def __init__(self, config: BertConfig, tensors: Mapping[str, np.ndarray]) -> None:
        self.config = config
        self.word = frozen(tensors["embeddings.word_embeddings.weight"])          # (vocab, d_model)
        self.position = frozen(tensors["embeddings.position_embeddings.weight"])  # (max_positions, d_model)
        self.token_type = frozen(tensors["embeddings.token_type_embeddings.weight"])  # (types, d_model)
        self.norm = norm(tensors, "embeddings.LayerNorm")
        self.layers = [LayerWeights.from_tensors(tensors, f"encoder.layer.{i}.") for i in range(config.n_layers)]
        self._scale = default_scale(config.d_k)

    @property
    def nbytes(self) -> int:
        """Bytes of weights held (float32)."""
        arrays = [self.word, self.position, self.token_type, *self.norm]
        return sum(a.nbytes for a in arrays) + sum(a.nbytes for layer in self.layers for a in layer.arrays())

    def embed(self, token_ids: np.ndarray, token_type_ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """ids, types (B, n) -> LayerNorm(word + position + token type) (B, n, d_model) in ``dtype``."""
        self._check_ids(token_ids, token_type_ids)
        n = token_ids.shape[-1]
        x = self.word[token_ids].astype(dtype, copy=False)                    # (B, n, d_model), a gather
        x += self.position[:n].astype(dtype, copy=False)                      # position i's learned vector
        x += self.token_type[token_type_ids].astype(dtype, copy=False)        # first or second sentence
        return learned_layer_norm(x, *(a.astype(dtype, copy=False) for a in self.norm), self.config.layer_norm_eps)

    def _check_ids(self, token_ids: np.ndarray, token_type_ids: np.ndarray) -> None:
        config = self.config
        if token_ids.ndim != 2 or token_ids.dtype.kind not in "iu" or token_ids.shape[1] == 0:
            raise AttentionError("token_ids", f"expected (B, n) integers, got {token_ids.dtype} {token_ids.shape}")
        if token_type_ids.shape != token_ids.shape or token_type_ids.dtype.kind not in "iu":
            raise AttentionError("token_type_ids", f"expected {token_ids.shape} integers")
        if token_ids.shape[1] > config.max_positions:
            raise AttentionError("token_ids", f"{token_ids.shape[1]} tokens; the model has "
                                              f"{config.max_positions} positions")
        for name, ids, size in (("token_ids", token_ids, config.vocab_size),
                                ("token_type_ids", token_type_ids, config.type_vocab_size)):
            if ids.min() < 0 or ids.max() >= size:
                raise AttentionError(name, f"ids must be in [0, {size})")

    def __call__(self, token_ids: np.ndarray, token_type_ids: np.ndarray | None = None,
                 lengths: np.ndarray | None = None, *, dtype: type = np.float32, return_weights: bool = True,
                 weights_of: Collection[int] | None = None, heads: Sequence[int] | None = None,
                 hidden_states: bool = False, norms_of: Collection[int] = ()) -> BertOutput:
        """token_ids (B, n) -> :class:`BertOutput`. ``token_type_ids`` (B, n): zeros when None. ``lengths``
        (B,): the real tokens of each item, the rest padding (keys it never attends to); None: all real.
        ``weights_of``: the layers whose weights are kept (default all; the others' are None, never stored);
        ``heads``: the heads whose weights are kept, in that order (default all): (B, h_sel, n, n) a layer.
        ``norms_of``: the layers whose norm-based attention is computed in passing, of every head (default none:
        ``norms`` is None; None: every layer)."""
        dtype = np.dtype(dtype)
        types = np.zeros_like(token_ids) if token_type_ids is None else token_type_ids
        x = self.embed(token_ids, types, dtype)                                # (B, n, d_model)
        b, n, _ = x.shape
        mask = None if lengths is None else GroupMask(padding_mask(lengths, n)[:, None], (b, self.config.n_heads))
        states, weights = [x], []
        keep_weights = range(len(self.layers)) if weights_of is None else frozenset(weights_of)
        keep_norms = chosen_layers(norms_of, len(self.layers), "norms_of")
        kept_heads = None if heads is None or list(heads) == list(range(self.config.n_heads)) else list(heads)
        h_kept = self.config.n_heads if kept_heads is None else len(kept_heads)
        norms = []
        for i, layer in enumerate(self.layers):
            kept = return_weights and i in keep_weights
            w = np.empty((b * h_kept, n, n), dtype) if kept else None              # (B*h_sel, n, n)
            x, layer_norms = self._layer(layer.cast(dtype), x, mask, w, kept_heads, i in keep_norms)
            states.append(x)
            weights.append(w)
            norms.append(layer_norms)
        keep = None if lengths is None else padding_mask(lengths, n)[:, 0, :]  # (B, n): real positions
        return BertOutput(
            zero_padding(x, keep),
            [None if w is None else zero_padding(w.reshape(b, -1, n, n), keep, rows=True) for w in weights]
            if return_weights else None,
            [zero_padding(s, keep) for s in states] if hidden_states else None,
            [None if m is None else m.without_padding(keep) for m in norms] if keep_norms else None)

    def knockout(self, token_ids: np.ndarray, token_type_ids: np.ndarray | None = None,
                 knock: Sequence[Sequence[int]] | None = None, *, dtype: type = np.float32) -> np.ndarray:
        """Head knockout for one text, token_ids (1, n) (``token_type_ids`` (1, n), zeros when None): the last hidden
        states (1 + K, n, d_model), row 0 the full run's, row 1 + k with the context vectors of head knock[k] =
        (layer, head) zeroed before W_O, as transformers' ``head_mask`` did. ``knock``: (layer, head) pairs,
        default every head, layer by layer. The K runs are stacked, each from its own layer up
        (``interventions.knocked_out``)."""
        if token_ids.ndim != 2 or token_ids.shape[0] != 1:
            raise AttentionError("token_ids", f"expected one text (1, n), got {token_ids.shape}")
        pairs = chosen_heads(knock, self.config.n_layers, self.config.n_heads)
        x = self.embed(token_ids, np.zeros_like(token_ids) if token_type_ids is None else token_type_ids,
                       np.dtype(dtype))                                        # (1, n, d_model)
        with np.errstate(over="ignore", invalid="ignore"):    # an overflow surfaces in the next layer norm
            return knocked_out([self._stages(layer) for layer in self.layers], x, pairs)

    def _stages(self, layer: LayerWeights) -> LayerStages:
        """One unpadded layer split before W_O (:class:`LayerStages`), in the input's dtype."""
        h, d_k = self.config.n_heads, self.config.d_k

        def attend(x: np.ndarray) -> np.ndarray:
            b, n, _ = x.shape
            return self._attend(layer.cast(x.dtype), x, None, None, None).reshape(b, h, n, d_k)  # (B, h, n, d_k)

        def finish(x: np.ndarray, contexts: np.ndarray) -> np.ndarray:
            flat = contexts.reshape(-1, *contexts.shape[2:])                   # (B*h, n, d_k), as _attend's
            return self._after_attention(layer.cast(x.dtype), x, flat)[-1]     # (B, n, d_model)

        return LayerStages(attend, finish)

    @np.errstate(over="ignore", invalid="ignore")  # an overflow surfaces in the next layer norm, which refuses it
    def _layer(self, layer: LayerWeights, x: np.ndarray, mask: GroupMask | None, weights: np.ndarray | None,
               heads: list[int] | None = None, norms: bool = False) -> tuple[np.ndarray, AttentionNorms | None]:
        """One encoder layer: x (B, n, d_model) -> (B, n, d_model); ``weights`` (B*h_sel, n, n) filled with those
        of ``heads`` (None: all) if given; with ``norms``, the layer's norm-based attention too (else None)."""
        if not norms:
            return self._after_attention(layer, x, self._attend(layer, x, mask, weights, heads))[-1], None
        b, n, _ = x.shape
        h = self.config.n_heads
        all_kept = weights is not None and heads is None                       # the kept weights are every head's
        every = weights if all_kept else np.empty((b * h, n, n), x.dtype)      # (B*h, n, n)
        projected = self._project(layer, x)                                    # each (B*h, n, d_k)
        attended = self._attend(layer, x, mask, every, None, projected)       # every head's weights: the norms'
        every = every.reshape(b, h, n, n)
        if weights is not None and not all_kept:
            weights.reshape(b, -1, n, n)[...] = every[:, heads]                 # the kept heads, as without norms
        values = projected[2].reshape(b, h, n, self.config.d_k)                # (B, h, n, d_k): x W_V + b_V
        return self._after_attention(layer, x, attended)[-1], attention_norms(every, values, layer.w_o)

    def _attend(self, layer: LayerWeights, x: np.ndarray, mask: GroupMask | None, weights: np.ndarray | None,
                heads: list[int] | None, projected: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
        """Every head's attention over x (B, n, d_model) -> (B*h, n, d_k); only ``heads``' weights are stored
        (into ``weights``), the others' are computed tile by tile and dropped. ``projected``: x's q, k, v if
        already computed (:meth:`_project`; q is scaled here, in place)."""
        q, k, v = projected or self._project(layer, x)                         # each (B*h, n, d_k)
        q *= x.dtype.type(self._scale)
        if weights is None or heads is None:
            return attend_groups(q, k, v, mask, False, weights)                # (B*h, n, d_k)
        b, n, _ = x.shape
        h = self.config.n_heads
        rest = [i for i in range(h) if i not in heads]
        out = np.empty((b, h, n, self.config.d_k), x.dtype)                    # (B, h, n, d_k)
        for chosen, into in ((heads, weights), (rest, None)):
            if chosen:
                part = [a.reshape(b, h, n, -1)[:, chosen].reshape(b * len(chosen), n, -1) for a in (q, k, v)]
                group_mask = None if mask is None else GroupMask(mask.array, (b, len(chosen)))
                out[:, chosen] = attend_groups(*part, group_mask, False, into).reshape(b, len(chosen), n, -1)
        return out.reshape(b * h, n, -1)

    def _after_attention(self, layer: LayerWeights, x: np.ndarray, heads: np.ndarray) -> tuple[np.ndarray, ...]:
        """Heads (B*h, n, d_k) -> W_o, add & norm, feed-forward, add & norm: the four stages, each (B, n, d_model)."""
        attended = linear(self._concatenate(heads, x.shape), layer.w_o, layer.b_o)
        require_finite(attended, "X")
        first = learned_layer_norm(x + attended, *layer.norm_1, self.config.layer_norm_eps)   # add & norm
        feed_forward = self._feed_forward(layer, first)
        output = learned_layer_norm(first + feed_forward, *layer.norm_2, self.config.layer_norm_eps)  # add & norm
        return attended, first, feed_forward, output

    def _project(self, layer: LayerWeights, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """x (B, n, d_model) -> q, k, v each (B*h, n, d_k), contiguous (one projection for all three)."""
        b, n, _ = x.shape
        h, d_k = self.config.n_heads, self.config.d_k
        qkv = linear(x, layer.w_qkv, layer.b_qkv)                              # (B, n, 3 d_model)
        qkv = np.ascontiguousarray(qkv.reshape(b, n, 3, h, d_k).transpose(2, 0, 3, 1, 4))  # (3, B, h, n, d_k)
        return tuple(qkv.reshape(3, b * h, n, d_k))

    def _concatenate(self, heads: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
        """(B*h, n, d_k) -> the heads side by side (B, n, h*d_k)."""
        b, n, d = shape
        return heads.reshape(b, self.config.n_heads, n, self.config.d_k).transpose(0, 2, 1, 3).reshape(b, n, d)

    def _feed_forward(self, layer: LayerWeights, x: np.ndarray) -> np.ndarray:
        """Position-wise GELU(x W_1 + b_1) W_2 + b_2: (B, n, d_model) -> (B, n, d_ff) -> (B, n, d_model)."""
        return linear(gelu(linear(x, layer.w_1, layer.b_1)), layer.w_2, layer.b_2)

    def trace(self, token_ids: np.ndarray, token_type_ids: np.ndarray | None = None, *, dtype: type = np.float32,
              layers: Collection[int] | None = None, heads: Sequence[int] | None = None) -> BertTrace:
        """Every stage of the chosen ``layers`` (default all) for unpadded token_ids (B, n), as the toy encoder's
        trace names them: per chosen head (default all) q, k, v, scores, scaled scores, masked scores, weights;
        the attention after W_o; the first add & norm; the feed-forward output; the layer output. The other
        layers and heads are computed as by the forward pass, their stages dropped."""
        dtype = np.dtype(dtype)
        types = np.zeros_like(token_ids) if token_type_ids is None else token_type_ids
        traced = range(len(self.layers)) if layers is None else frozenset(layers)
        chosen = list(range(self.config.n_heads)) if heads is None else list(heads)
        x = self.embed(token_ids, types, dtype)                                # (B, n, d_model)
        states, traces = [x], {}
        for i, layer in enumerate(self.layers):
            if i in traced:
                traces[i] = self._trace_layer(layer.cast(dtype), x, chosen)
                x = traces[i].output
            else:
                x = self._layer(layer.cast(dtype), x, None, None)[0]
            states.append(x)
        return BertTrace(x, traces, states)

    @np.errstate(over="ignore", invalid="ignore")
    def _trace_layer(self, layer: LayerWeights, x: np.ndarray, heads: list[int]) -> EncoderLayerTrace:
        """:meth:`_layer`, keeping every stage of ``heads``."""
        b, n, _ = x.shape
        per_head = (b, self.config.n_heads, n, self.config.d_k)
        projected = self._project(layer, x)                                    # each (B*h, n, d_k)
        q, k, v = (a.reshape(per_head)[:, heads] for a in projected)           # copies, each (B, h_sel, n, d_k)
        stages = trace_attention(q, k, v, scale=self._scale)
        heads_out = self._attend(layer, x, None, None, None, projected)         # the forward's, every head
        attended, first, feed_forward, output = self._after_attention(layer, x, heads_out)
        attention = AttentionTrace(**{**stages.__dict__, "output": attended, "q": q, "k": k, "v": v})
        return EncoderLayerTrace(attention, first, feed_forward, output)


@dataclass(frozen=True)
class BertTrace:
    """``output`` (B, n, d_model); ``layers``: the traced layers' stages by index; ``hidden_states``: the embeddings
    and every layer's output, n_layers + 1 arrays (B, n, d_model)."""

    output: np.ndarray
    layers: dict[int, EncoderLayerTrace]
    hidden_states: list[np.ndarray]
