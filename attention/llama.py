"""A trained Llama-family decoder, computed with the engine's own attention kernel.

A decoder is the paper's block with the causal mask always on (the seed's stage 6): each token reads only the
tokens before it, so the model can be trained to predict the next one, and then asked to. Llama's block, in
the order the numbers flow (``attention/decoder_blocks.py`` says why each part differs from the paper's):

    x = token embedding                          (no positions added: rotary turns q and k inside each layer)
    each layer:  x = x + attention(RMSNorm(x))   (grouped-query, causal, q and k rotated)
                 x = x + SwiGLU(RMSNorm(x))
    logits = RMSNorm(x) @ embedding^T            (the output head is the embedding matrix itself, "tied")

Generating text is a loop: the logits of the last position say which token comes next; append it and go
again. Under the causal mask an earlier token's k and v never change when later tokens arrive, so a
:class:`KVCache` keeps them: the next token computes only its own row (:meth:`Llama.step`).

Weights are held read-only in float32, each projection stored (d_in, d_out) so ``x @ W`` takes OpenBLAS's fast
path (the (d_out, d_in) layout with ``x @ W.T`` is ~2x slower for one token); q, k and v side by side, and the
gate and up projections side by side. A float64 call casts one layer at a time, never keeping the copy.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from ._checks import chosen_layers
from .analyses import AttentionNorms, attention_norms
from .checkpoint import CastableWeights
from .decoder_blocks import grouped_causal_mask, rms_norm, rotary_angles, rotate, swiglu
from .encoder import LayerTrace
from .errors import AttentionError
from .functional import AttentionTrace, default_scale, require_finite, trace_attention
from .interventions import LayerStages, chosen_heads, knocked_out
from .kernel import GroupMask, attend_groups
from .masks import zero_padding

LOGITS = ("last", "all", None)  # where logits are computed: each item's last real position, every one, none
# Vocabulary columns per block when the float32 output head is cast for a float64 call (37 MB a block, not the
# whole 226 MB head at once).
UNEMBED_BLOCK = 8192


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama decoder (the names are the engine's; the GGUF keys are in ``attention/gguf_model.py``)."""

    n_layers: int
    n_heads: int        # query heads
    n_kv_heads: int     # key/value heads, each shared by n_heads / n_kv_heads query heads
    d_model: int
    d_ff: int
    vocab_size: int
    max_positions: int
    rope_base: float
    rms_norm_eps: float

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @property
    def group(self) -> int:
        """Query heads per key/value head: head h reads key/value head h // group."""
        return self.n_heads // self.n_kv_heads


@dataclass(frozen=True)
class DecoderLayerWeights(CastableWeights):
    """One decoder layer's weights in the forward pass's layout, each projection (d_in, d_out)."""

    attention_norm: np.ndarray      # (d_model,) RMSNorm scale before attention
    w_qkv: np.ndarray               # (d_model, (n_heads + 2 n_kv_heads) d_k): W_q, W_k, W_v side by side
    w_o: np.ndarray                 # (d_model, d_model)
    feed_forward_norm: np.ndarray   # (d_model,) RMSNorm scale before the feed-forward
    w_gate_up: np.ndarray           # (d_model, 2 d_ff): the gate's and the up projection side by side
    w_down: np.ndarray              # (d_ff, d_model)


class KVCache:
    """The keys (rotated) and values of every layer for the positions computed so far, for B sequences of equal
    length: ``k`` and ``v`` each (n_layers, B, n_kv_heads, capacity, d_k), positions [0, length) filled. Made by
    :meth:`Llama.new_cache`; each forward pass given it appends its tokens, growing the capacity as needed."""

    def __init__(self, config: LlamaConfig, batch: int, dtype: np.dtype, capacity: int) -> None:
        self.config, self.dtype, self.length = config, np.dtype(dtype), 0
        shape = (config.n_layers, batch, config.n_kv_heads, capacity, config.d_k)
        self.k, self.v = np.empty(shape, self.dtype), np.empty(shape, self.dtype)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def reserve(self, end: int) -> None:
        """Room for positions up to ``end``: at least double the capacity when it grows (a copy of what is kept)."""
        if end <= self.capacity:
            return
        capacity = min(self.config.max_positions, max(end, 2 * self.capacity))
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = np.empty((*old.shape[:3], capacity, old.shape[4]), self.dtype)
            grown[:, :, :, :self.length] = old[:, :, :, :self.length]
            setattr(self, name, grown)


@dataclass(frozen=True)
class DecoderOutput:
    """One forward pass. ``logits``: (B, vocab) at each item's last real position, (B, n, vocab) at every one, or
    None (as asked); ``output`` (B, n, d_model), the last hidden state after the final RMSNorm (what the output
    head reads); ``weights``: per layer (B, h_sel, n, n_keys) (None for a layer not asked for), or None, n_keys
    counting the cached positions before the n new ones; ``hidden_states``: n_layers + 1 arrays (B, n, d_model),
    the embeddings, each layer's output, and last the final RMSNorm of the last layer's (as transformers gives
    them), or None; ``norms``: per layer its norm-based attention (``AttentionNorms``: heads (B, h, n, n_keys),
    layer (B, n, n_keys)), None for a layer not asked for, or None. Padded positions (past an item's length) are
    zeros in every array, rows of weights included."""

    logits: np.ndarray | None
    output: np.ndarray
    weights: list[np.ndarray | None] | None
    hidden_states: list[np.ndarray] | None
    norms: list[AttentionNorms | None] | None = None


@dataclass(frozen=True)
class StepOutput:
    """One generated position: ``logits`` (B, vocab); ``weights``: per layer (B, h_sel, n_keys), the new token's
    attention over every position so far, itself last (None for a layer not asked for), or None;
    ``hidden_states``: n_layers + 1 arrays (B, d_model) as :class:`DecoderOutput` orders them, or None."""

    logits: np.ndarray
    weights: list[np.ndarray | None] | None
    hidden_states: list[np.ndarray] | None


@dataclass(frozen=True)
class DecoderLayerTrace(LayerTrace):
    """One decoder layer's stages: the attention trace (per chosen head q and k after rotation, v, scores,
    scaled scores, masked scores, weights, each (B, h_sel, n, ...); its ``output`` after W_o (B, n, d_model));
    ``residual``, the layer's input plus the attention; ``feed_forward``, SwiGLU of its RMSNorm; ``output``, the
    residual plus the feed-forward (the next layer's input). The encoder's trace (``EncoderLayerTrace``) names
    its stages alike, with add & norm where this pre-norm block has a plain residual add."""

    attention: AttentionTrace
    residual: np.ndarray
    feed_forward: np.ndarray
    output: np.ndarray


@dataclass(frozen=True)
class DecoderTrace:
    """``logits`` as :class:`DecoderOutput`'s; ``output`` (B, n, d_model) after the final RMSNorm; ``layers``: the
    traced layers' stages by index; ``hidden_states``: n_layers + 1 arrays (B, n, d_model), as the forward's."""

    logits: np.ndarray | None
    output: np.ndarray
    layers: dict[int, DecoderLayerTrace]
    hidden_states: list[np.ndarray]


class Llama:
    """A Llama decoder over token ids: ``Llama(config, unembedding, layers, final_norm)`` with the embedding matrix
    transposed, (d_model, vocab) (the tied output head; a token's embedding is a column of it), the layers' weights
    in the engine's layout (``attention/gguf_model.py`` makes them from a GGUF file) and the final RMSNorm's scale
    (d_model,). Arrays that are float32 and contiguous are kept as they are (made read-only), not copied."""

    def __init__(self, config: LlamaConfig, unembedding: np.ndarray, layers: Sequence[DecoderLayerWeights],
                 final_norm: np.ndarray) -> None:
        self.config = config
        self.unembedding = _read_only(unembedding)       # (d_model, vocab): the output head's x @ W on the fast path
        self.layers = list(layers)
        self.final_norm = _read_only(final_norm)
        self._scale = default_scale(config.d_k)

    @property
    def nbytes(self) -> int:
        """Bytes of weights held (float32)."""
        return self.unembedding.nbytes + self.final_norm.nbytes + sum(
            a.nbytes for layer in self.layers for a in layer.arrays())

    def new_cache(self, batch: int = 1, dtype: type = np.float32, capacity: int = 256) -> KVCache:
        """An empty :class:`KVCache` for ``batch`` sequences computed in ``dtype``, room for ``capacity`` positions
        (it grows by itself)."""
        return KVCache(self.config, batch, np.dtype(dtype), max(1, min(capacity, self.config.max_positions)))

    # --- the forward pass ----------------------------------------------------------------------------------------

    def __call__(self, token_ids: np.ndarray, lengths: np.ndarray | None = None, *, cache: KVCache | None = None,
                 dtype: type | None = None, return_weights: bool = True, weights_of: Collection[int] | None = None,
                 heads: Sequence[int] | None = None, hidden_states: bool = False, logits: str | None = "last",
                 norms_of: Collection[int] = ()) -> DecoderOutput:
        """token_ids (B, n) -> :class:`DecoderOutput`.

        ``lengths`` (B,): each item's real tokens, the rest right padding (never attended to by a real token,
        and zeroed in the answer); None: all real. ``cache``: a :class:`KVCache` whose positions come first (the
        new tokens attend to them and are appended to it; no ``lengths`` then). ``dtype``: float32 (default) or
        float64, the cache's when one is given. ``weights_of``: the layers whose attention weights are kept
        (default all; the others' are None, never stored); ``heads``: the heads kept, in that order (default
        all): (B, h_sel, n, n_keys) a layer. ``logits``: "last" (default) at each item's last real position,
        "all", or None (skips the output head). ``norms_of``: the layers whose norm-based attention is computed in
        passing, of every head (default none: ``norms`` is None; None: every layer).
        """
        dtype = self._dtype(dtype, cache)
        offset = 0 if cache is None else cache.length
        self._check(token_ids, lengths, cache, logits, offset)
        b, n = token_ids.shape
        keep_weights = chosen_layers(weights_of, self.config.n_layers, "weights_of")
        keep_norms = chosen_layers(norms_of, self.config.n_layers, "norms_of")
        kept_heads = _kept_heads(heads, self.config.n_heads)
        if cache is not None:
            cache.reserve(offset + n)
        x = self.embed(token_ids, dtype)                                       # (B, n, d_model)
        rotation = rotary_angles(np.arange(offset, offset + n), self.config.d_k, self.config.rope_base, dtype)
        mask = grouped_causal_mask(n, offset, self.config.group)
        states, weights, norms = [x], [], []
        scratch = None                                  # every head's weights, when they are not all returned
        for i, layer in enumerate(self.layers):
            kept, w = return_weights and i in keep_weights, None
            if kept or i in keep_norms:
                shape = (b, self.config.n_heads, n, offset + n)                # (B, h, n, n_keys)
                if kept and kept_heads is None:
                    w = np.empty(shape, dtype)
                else:
                    w = scratch = np.empty(shape, dtype) if scratch is None else scratch
            x, layer_norms = self._layer(layer.cast(dtype), x, rotation, mask, _kv(cache, i, offset), w,
                                         i in keep_norms)
            states.append(x)
            weights.append(None if not kept else w if kept_heads is None else w[:, kept_heads])
            norms.append(layer_norms)
        if cache is not None:
            cache.length = offset + n
        keep = None if lengths is None else np.arange(n) < lengths[:, None]    # (B, n): real positions
        final = zero_padding(rms_norm(x, self.final_norm.astype(dtype, copy=False), self.config.rms_norm_eps), keep)
        states[-1] = final
        return DecoderOutput(
            self._logits(final, lengths, logits),                             # padded rows: final's zeros
            final,
            [None if w is None else zero_padding(w, keep, rows=True) for w in weights] if return_weights else None,
            [zero_padding(s, keep) for s in states[:-1]] + [final] if hidden_states else None,
            [None if m is None else m.without_padding(keep) for m in norms] if keep_norms else None)

    def prefill(self, token_ids: np.ndarray, *, dtype: type = np.float32, capacity: int | None = None,
                return_weights: bool = False, **options) -> tuple[KVCache, DecoderOutput]:
        """A new cache holding the prompt token_ids (B, n) and the forward pass that filled it: the logits of the
        last position, no attention weights unless ``return_weights`` (the other ``options`` as :meth:`__call__`'s).
        ``capacity``: positions to make room for (default n + 256; the cache grows past it by itself)."""
        shape = np.shape(token_ids)
        batch, n = shape if len(shape) == 2 else (1, 0)                        # a wrong shape: refused by __call__
        cache = self.new_cache(max(batch, 1), dtype, n + 256 if capacity is None else capacity)
        return cache, self(token_ids, cache=cache, return_weights=return_weights, **options)

    def step(self, cache: KVCache, token_ids: np.ndarray, *, return_weights: bool = False,
             weights_of: Collection[int] | None = None, heads: Sequence[int] | None = None,
             hidden_states: bool = False) -> StepOutput:
        """One more token per sequence, token_ids (B,), after the cache's positions: its logits (B, vocab), and when
        asked its attention over every position so far (``return_weights``, of ``weights_of`` and ``heads`` as
        :meth:`__call__` chooses them) and its hidden states (for a logit lens: :meth:`logit_lens`)."""
        ids = np.asarray(token_ids)
        if ids.ndim != 1:
            raise AttentionError("token_ids", f"expected (B,) integers, one token per sequence, got shape {ids.shape}")
        out = self(ids[:, None], cache=cache, return_weights=return_weights, weights_of=weights_of, heads=heads,
                   hidden_states=hidden_states)
        return StepOutput(out.logits,
                          None if out.weights is None else [None if w is None else w[:, :, 0] for w in out.weights],
                          None if out.hidden_states is None else [s[:, 0] for s in out.hidden_states])

    def knockout(self, token_ids: np.ndarray, knock: Sequence[Sequence[int]] | None = None, *,
                 dtype: type | None = None) -> np.ndarray:
        """Head knockout for one prompt, token_ids (1, n): the logits at its last position (1 + K, vocab), row 0 the
        full run's, row 1 + k with the context vectors of query head knock[k] = (layer, head) zeroed before W_O
        (its key/value head still serves the others of its group). ``knock``: (layer, head) pairs, default every
        head, layer by layer. The K runs are stacked, each from its own layer up (``interventions.knocked_out``)."""
        dtype = self._dtype(dtype, None)
        self._check(token_ids, None, None, "last", 0)
        if token_ids.shape[0] != 1:
            raise AttentionError("token_ids", f"expected one prompt (1, n), got {token_ids.shape}")
        pairs = chosen_heads(knock, self.config.n_layers, self.config.n_heads)
        n = token_ids.shape[1]
        rotation = rotary_angles(np.arange(n), self.config.d_k, self.config.rope_base, dtype)
        mask = grouped_causal_mask(n, 0, self.config.group)
        stages = [self._stages(layer, rotation, mask) for layer in self.layers]
        with np.errstate(over="ignore", invalid="ignore"):    # an overflow surfaces in the next RMSNorm
            states = knocked_out(stages, self.embed(token_ids, dtype), pairs)  # (1 + K, n, d_model)
        final = rms_norm(states[:, -1], self.final_norm.astype(dtype, copy=False), self.config.rms_norm_eps)
        return self.unembed(final, dtype)                                      # (1 + K, vocab)

    def _stages(self, layer: DecoderLayerWeights, rotation: tuple[np.ndarray, np.ndarray],
                mask: np.ndarray | None) -> LayerStages:
        """One layer of an uncached forward pass split before W_O (:class:`LayerStages`), in the input's dtype."""

        def attend(x: np.ndarray) -> np.ndarray:
            return self._contexts(layer.cast(x.dtype), x, rotation, mask, None, None)[0]   # (B, h, n, d_k)

        def finish(x: np.ndarray, contexts: np.ndarray) -> np.ndarray:
            return self._after_attention(layer.cast(x.dtype), x, contexts)[-1]   # (B, n, d_model)

        return LayerStages(attend, finish)

    def logit_lens(self, hidden_states: Sequence[np.ndarray]) -> list[np.ndarray]:
        """What each layer would predict were it the last: the n_layers + 1 hidden states of a forward pass or a
        step, each (..., d_model), through the final RMSNorm and the output head -> (..., vocab) each. The last
        state is already normalised (transformers' order): it gets the head alone, and so the model's logits."""
        *inner, final = hidden_states
        dtype = final.dtype
        norm = self.final_norm.astype(dtype, copy=False)
        normed = [rms_norm(s, norm, self.config.rms_norm_eps) for s in inner] + [final]
        return [self.unembed(s, dtype) for s in normed]

    def embed(self, token_ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """ids (B, n) -> their embeddings (B, n, d_model) in ``dtype``: columns of the tied head."""
        b, n = token_ids.shape
        columns = self.unembedding[:, token_ids.reshape(-1)]                   # (d_model, B n), a gather
        return np.ascontiguousarray(columns.T, dtype=dtype).reshape(b, n, -1)

    def unembed(self, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """The output head: x (..., d_model) @ embedding^T -> logits (..., vocab) in ``dtype``."""
        rows = x.reshape(-1, x.shape[-1])                                      # (rows, d_model)
        if dtype == self.unembedding.dtype:
            out = rows @ self.unembedding                                      # (rows, vocab): one gemm
        else:
            out = np.empty((rows.shape[0], self.config.vocab_size), dtype)
            for start in range(0, self.config.vocab_size, UNEMBED_BLOCK):
                block = slice(start, start + UNEMBED_BLOCK)
                out[:, block] = rows @ self.unembedding[:, block].astype(dtype)
        return out.reshape(*x.shape[:-1], -1)

    # --- one layer ------------------------------------------------------------------------------------------------

    @np.errstate(over="ignore", invalid="ignore")  # an overflow surfaces in the next RMSNorm, which refuses it
    def _layer(self, layer: DecoderLayerWeights, x: np.ndarray, rotation: tuple[np.ndarray, np.ndarray],
               mask: np.ndarray | None, kv: tuple[np.ndarray, np.ndarray] | None,
               weights: np.ndarray | None, norms: bool = False) -> tuple[np.ndarray, AttentionNorms | None]:
        """One decoder layer: x (B, n, d_model) -> (B, n, d_model); ``weights`` (B, h, n, n_keys) filled if given;
        with ``norms`` (and ``weights``), the layer's norm-based attention too (else None), from the value heads
        each group of query heads shares (the RMSNorm's output times W_V, no bias)."""
        heads, v = self._contexts(layer, x, rotation, mask, kv, weights)
        return self._after_attention(layer, x, heads)[-1], attention_norms(weights, v, layer.w_o) if norms else None

    def _contexts(self, layer: DecoderLayerWeights, x: np.ndarray, rotation: tuple[np.ndarray, np.ndarray],
                  mask: np.ndarray | None, kv: tuple[np.ndarray, np.ndarray] | None,
                  weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The attention half of a layer: x (B, n, d_model) -> every head's context vectors (B, h, n, d_k) and the
        values they mixed (B, h_kv, n_keys, d_k); ``weights`` filled as :meth:`_layer` says."""
        q, k, v = self._project(layer, x, rotation)
        k, v = _with_past(k, v, kv)                                            # each (B, h_kv, n_keys, d_k)
        return self._attend(q, k, v, mask, weights), v

    def _project(self, layer: DecoderLayerWeights, x: np.ndarray, rotation: tuple[np.ndarray, np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """x (B, n, d_model) -> RMSNorm, then q (B, h, n, d_k), k and v (B, h_kv, n, d_k), q and k rotated:
        views into one array."""
        config = self.config
        b, n, _ = x.shape
        h, h_kv = config.n_heads, config.n_kv_heads
        normed = rms_norm(x, layer.attention_norm, config.rms_norm_eps)       # (B, n, d_model)
        qkv = (normed.reshape(b * n, -1) @ layer.w_qkv).reshape(b, n, h + 2 * h_kv, config.d_k)  # one gemm
        turned = rotate(qkv[:, :, :h + h_kv], *rotation)                      # (B, n, h + h_kv, d_k)
        q, k = turned[:, :, :h], turned[:, :, h:]
        return q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), qkv[:, :, h + h_kv:].transpose(0, 2, 1, 3)

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                weights: np.ndarray | None) -> np.ndarray:
        """Grouped-query attention: q (B, h, n, d_k) over k, v (B, h_kv, n_keys, d_k) -> each head's context
        vectors (B, h, n, d_k); ``weights`` (B, h, n, n_keys) filled if given. Each key/value head meets its group
        of query heads stacked as rows (``decoder_blocks``): a reshape of q, no copy of k or v."""
        b, h, n, d_k = q.shape
        h_kv, n_keys = k.shape[1], k.shape[2]
        stacked = np.multiply(q, q.dtype.type(self._scale), out=np.empty(q.shape, q.dtype))  # scaled, contiguous
        stacked = stacked.reshape(b * h_kv, h // h_kv * n, d_k)               # (B h_kv, group n, d_k)
        groups = None if mask is None else GroupMask(mask, (b * h_kv,))
        flat_weights = None if weights is None else weights.reshape(b * h_kv, -1, n_keys)  # a view
        out = attend_groups(stacked, k.reshape(b * h_kv, n_keys, d_k), v.reshape(b * h_kv, n_keys, d_k), groups,
                            False, flat_weights)                               # (B h_kv, group n, d_k)
        return out.reshape(b, h, n, d_k)

    def _after_attention(self, layer: DecoderLayerWeights, x: np.ndarray, heads: np.ndarray
                         ) -> tuple[np.ndarray, ...]:
        """Heads' context vectors (B, h, n, d_k) -> side by side, W_o, the residual add, the feed-forward, the
        residual add: the four stages, each (B, n, d_model)."""
        side_by_side = heads.transpose(0, 2, 1, 3).reshape(-1, layer.w_o.shape[0])  # (B n, h d_k), a copy
        attended = (side_by_side @ layer.w_o).reshape(x.shape)
        require_finite(attended, "X")
        residual = x + attended                                               # the block adds a correction
        normed = rms_norm(residual, layer.feed_forward_norm, self.config.rms_norm_eps)
        feed_forward = self._feed_forward(layer, normed)
        return attended, residual, feed_forward, residual + feed_forward

    def _feed_forward(self, layer: DecoderLayerWeights, x: np.ndarray) -> np.ndarray:
        """Position-wise SwiGLU: (B, n, d_model) -> (B, n, 2 d_ff) -> (B, n, d_ff) -> (B, n, d_model)."""
        rows = x.reshape(-1, x.shape[-1])
        return (swiglu(rows @ layer.w_gate_up) @ layer.w_down).reshape(x.shape)

    def _logits(self, final: np.ndarray, lengths: np.ndarray | None, where: str | None) -> np.ndarray | None:
        """The output head where it is asked for: (B, vocab) at each item's last real position, (B, n, vocab)."""
        if where is None:
            return None
        if where == "all":
            return self.unembed(final, final.dtype)
        b, n, _ = final.shape
        last = np.full(b, n - 1) if lengths is None else lengths - 1
        return self.unembed(final[np.arange(b), last], final.dtype)          # (B, vocab)

    # --- the trace ------------------------------------------------------------------------------------------------

    def trace(self, token_ids: np.ndarray, *, dtype: type = np.float32, layers: Collection[int] | None = None,
              heads: Sequence[int] | None = None, logits: str | None = "last") -> DecoderTrace:
        """Every stage of the chosen ``layers`` (default all) for unpadded token_ids (B, n), as
        :class:`DecoderLayerTrace` names them, for the chosen ``heads`` (default all; the k and v of a query head
        are those of the key/value head it reads). The other layers and heads are computed as by the forward
        pass, their stages dropped."""
        dtype = self._dtype(dtype, None)
        self._check(token_ids, None, None, logits, 0)
        n = token_ids.shape[1]
        traced = chosen_layers(layers, self.config.n_layers, "layers")
        chosen = _kept_heads(heads, self.config.n_heads) or list(range(self.config.n_heads))
        x = self.embed(token_ids, dtype)                                       # (B, n, d_model)
        rotation = rotary_angles(np.arange(n), self.config.d_k, self.config.rope_base, dtype)
        mask = grouped_causal_mask(n, 0, self.config.group)
        states, traces = [x], {}
        for i, layer in enumerate(self.layers):
            if i in traced:
                traces[i] = self._trace_layer(layer.cast(dtype), x, rotation, mask, chosen)
                x = traces[i].output
            else:
                x = self._layer(layer.cast(dtype), x, rotation, mask, None, None)[0]
            states.append(x)
        states[-1] = rms_norm(x, self.final_norm.astype(dtype, copy=False), self.config.rms_norm_eps)
        return DecoderTrace(self._logits(states[-1], None, logits), states[-1], traces, states)

    @np.errstate(over="ignore", invalid="ignore")
    def _trace_layer(self, layer: DecoderLayerWeights, x: np.ndarray, rotation: tuple[np.ndarray, np.ndarray],
                     mask: np.ndarray | None, heads: list[int]) -> DecoderLayerTrace:
        """:meth:`_layer`, keeping every stage of ``heads``."""
        q, k, v = self._project(layer, x, rotation)
        served = [head // self.config.group for head in heads]                # the key/value head of each
        stages = trace_attention(q[:, heads], k[:, served], v[:, served], scale=self._scale, causal=True)
        attended, residual, feed_forward, output = self._after_attention(layer, x, self._attend(q, k, v, mask, None))
        attention = AttentionTrace(**{**stages.__dict__, "output": attended, "q": q[:, heads], "k": k[:, served],
                                      "v": v[:, served]})
        return DecoderLayerTrace(attention, residual, feed_forward, output)

    # --- arguments ------------------------------------------------------------------------------------------------

    def _dtype(self, dtype: type | None, cache: KVCache | None) -> np.dtype:
        if cache is not None:
            if dtype is not None and np.dtype(dtype) != cache.dtype:
                raise AttentionError("dtype", f"{np.dtype(dtype)} differs from the cache's {cache.dtype}")
            return cache.dtype
        dtype = np.dtype(np.float32 if dtype is None else dtype)
        if dtype not in (np.float32, np.float64):
            raise AttentionError("dtype", f"expected float32 or float64, got {dtype}")
        return dtype

    def _check(self, token_ids: np.ndarray, lengths: np.ndarray | None, cache: KVCache | None, logits: str | None,
               offset: int) -> None:
        """Refuse what the model cannot compute, naming the argument: never NaN or an IndexError."""
        config = self.config
        if not isinstance(token_ids, np.ndarray) or token_ids.ndim != 2 or token_ids.dtype.kind not in "iu" \
                or 0 in token_ids.shape:
            shape = getattr(token_ids, "shape", None)
            raise AttentionError("token_ids", f"expected (B, n) integers, B and n >= 1, got "
                                              f"{getattr(token_ids, 'dtype', type(token_ids).__name__)} {shape}")
        b, n = token_ids.shape
        if offset + n > config.max_positions:
            raise AttentionError("token_ids", f"{offset + n} positions; the model has {config.max_positions}")
        if token_ids.min() < 0 or token_ids.max() >= config.vocab_size:
            raise AttentionError("token_ids", f"ids must be in [0, {config.vocab_size})")
        if logits not in LOGITS:
            raise AttentionError("logits", f"expected one of {LOGITS}, got {logits!r}")
        if cache is not None and cache.batch != b:
            raise AttentionError("token_ids", f"{b} sequences; the cache holds {cache.batch}")
        if lengths is not None:
            if cache is not None:
                raise AttentionError("lengths", "padding is not kept in a cache: pass sequences of one length")
            if not isinstance(lengths, np.ndarray) or lengths.shape != (b,) or lengths.dtype.kind not in "iu" \
                    or lengths.min() < 1 or lengths.max() > n:
                raise AttentionError("lengths", f"expected ({b},) integers in [1, {n}]")


def _kept_heads(heads: Sequence[int] | None, n_heads: int) -> list[int] | None:
    """The heads to keep, or None for all of them in order (no selection to copy)."""
    if heads is None or list(heads) == list(range(n_heads)):
        return None
    heads = list(heads)
    if not heads or any(not 0 <= head < n_heads for head in heads):
        raise AttentionError("heads", f"expected heads in [0, {n_heads}), got {heads}")
    return heads


def _kv(cache: KVCache | None, layer: int, offset: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Layer ``layer``'s cache buffers, (B, h_kv, capacity, d_k) each, and where the new positions go; or None."""
    return None if cache is None else (cache.k[layer], cache.v[layer], offset)


def _with_past(k: np.ndarray, v: np.ndarray, kv: tuple[np.ndarray, np.ndarray, int] | None
               ) -> tuple[np.ndarray, np.ndarray]:
    """The keys and values to attend over, each (B, h_kv, n_keys, d_k): the new ones alone (contiguous copies),
    or the new ones written after the cached ones and read back with them (views into the cache)."""
    if kv is None:
        return np.ascontiguousarray(k), np.ascontiguousarray(v)
    cached_k, cached_v, offset = kv
    end = offset + k.shape[2]
    cached_k[:, :, offset:end] = k
    cached_v[:, :, offset:end] = v
    return cached_k[:, :, :end], cached_v[:, :, :end]


def _read_only(array: np.ndarray) -> np.ndarray:
    """``array`` as contiguous float32 (itself if it is: the loader's, not copied), made read-only."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    array.setflags(write=False)
    return array
