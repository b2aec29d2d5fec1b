"""Interventions: what a head or a token *matters*, measured by running the model again without it.

Weights say where a head looks; an intervention says what it changes (Michel et al. 2019, "Are Sixteen Heads
Really Better than One?"; occlusion, Zeiler & Fergus 2014, for tokens):

* head knockout: the model run again with one head's context vectors (its output before W_O) set to zero, what
  transformers' ``head_mask`` did; for grouped-query attention, one query head (its key/value head stays);
* token occlusion: the model run again without one token: an encoder reads ``[MASK]`` in its place, a decoder
  reads the prompt with it removed (the later tokens move up one position, as in a shorter prompt).

Each run is compared with the full one: an encoder by its sentence embedding (the mean of the last hidden state over
every position, special tokens included, as sentence-transformers pools MiniLM) and by the largest change of a
position's last hidden state; a decoder by its next-token distribution at the last position (KL(p_full || p_run)
and whether the top token changed).

The runs are stacked along the batch axis, never looped over in Python. Knocking out head (l, h) changes nothing
below layer l, so the full run's layer inputs and context vectors are kept and each knockout joins the batch at
its own layer, reusing the full run's context vectors there (only the zeroed head differs): one pass over the
layers computes every knockout, the batch growing as it goes (:func:`knocked_out`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .errors import AttentionError

if TYPE_CHECKING:
    from .bert import Bert
    from .llama import Llama

# Rows (copies x tokens) computed at once by the stacked runs; more copies than fit go in chunks, each one pass over
# the layers. The largest temporary is a feed-forward's hidden layer: 2048 rows are 12.5 MB for MiniLM (d_ff 1536),
# 25 MB for the decoder's gate and up projections side by side, in float32. Larger chunks were no faster (MiniLM's
# 72 knockouts at 128 tokens: 39x a forward with 1024 or 2048 rows, 43x with 8192, 46x with 16384: fresh buffers
# past the workers' kept heap fault their pages in; the decoder's 270 at 16 tokens: 41x with 2048, 40x with 8192).
STACKED_ROWS = 2048
# Runs whose next-token distributions are compared at once: 16 x 49,152 float64 log-probabilities are 6 MB.
SHIFT_BLOCK = 16


@dataclass(frozen=True)
class LayerStages:
    """One layer of a model split where a knockout acts: ``attend`` x (B, n, d_model) -> every head's context
    vectors (B, h, n, d_k); ``finish`` (x, those contexts) -> the layer's output (B, n, d_model) (W_O and what
    follows). A layer is ``finish(x, attend(x))``, exactly as the model's forward pass computes it."""

    attend: Callable[[np.ndarray], np.ndarray]
    finish: Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class EncoderShift:
    """How far each run moved an encoder's output from the full run's, one value per run, in the output's dtype:
    ``cosine_distance`` (K,) 1 - cos between the mean-pooled sentence embeddings; ``largest_change`` (K,) the
    largest L2 norm, over positions, of the change of a position's last hidden state."""

    cosine_distance: np.ndarray
    largest_change: np.ndarray


@dataclass(frozen=True)
class NextTokenShift:
    """How far each run moved a decoder's next-token distribution at the last position: ``kl`` (K,) KL(p_full ||
    p_run) in nats, in the logits' dtype; ``top`` (K,) each run's most likely token; ``full_top`` the full run's;
    ``top_changed`` (K,) bool, top != full_top."""

    kl: np.ndarray
    top: np.ndarray
    full_top: int

    @property
    def top_changed(self) -> np.ndarray:
        return self.top != self.full_top


# ---------------------------------------------------------------------------
# Head knockout
# ---------------------------------------------------------------------------
def chosen_heads(knock: Sequence[Sequence[int]] | None, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """The heads to knock out, one at a time, as (layer, head) pairs in the order given (None: every head, layer by
    layer); AttentionError("knock") for a pair outside the model."""
    if knock is None:
        return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    pairs = []
    for index, pair in enumerate(knock):
        if len(pair) != 2 or not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in pair):
            raise AttentionError(f"knock/{index}", f"expected a [layer, head] pair of integers, got {pair!r}")
        layer, head = int(pair[0]), int(pair[1])
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise AttentionError(f"knock/{index}", f"[{layer}, {head}] is outside the model's {n_layers} layers x "
                                                   f"{n_heads} heads")
        pairs.append((layer, head))
    return pairs


def head_table(knock: Sequence[tuple[int, int]], values: np.ndarray, n_layers: int, n_heads: int) -> np.ndarray:
    """One value per knocked head, values (K,) in ``knock``'s order (:func:`chosen_heads`' pairs) -> the layers x
    heads table (n_layers, n_heads) float64, NaN where a head was not knocked out (JSON null)."""
    table = np.full((n_layers, n_heads), np.nan)
    if len(knock):
        layers, heads = np.array(knock).T                                     # (K,) each
        table[layers, heads] = values
    return table


def knocked_out(stages: Sequence[LayerStages], x: np.ndarray, knock: Sequence[tuple[int, int]]) -> np.ndarray:
    """The last hidden states of the full run and of every knockout: x (1, n, d_model) the embeddings, ``knock``
    K (layer, head) pairs (checked) -> (1 + K, n, d_model), row 0 the full run, row 1 + k with knock[k]'s head's
    context vectors zeroed.

    The full run keeps each layer's input and context vectors (1, n, d_model) and (1, h, n, d_k); a knockout at
    layer l starts there, from the full run's contexts with its head zeroed (nothing below l changes, nor the
    attention of layer l itself). Knockouts go in layer order, at most STACKED_ROWS // n a chunk; each chunk is
    one pass from its first knockout's layer, its batch growing as later knockouts join."""
    inputs, contexts = [], []
    for layer in stages:
        inputs.append(x)
        contexts.append(layer.attend(x))                                      # (1, h, n, d_k)
        x = layer.finish(x, contexts[-1])                                     # (1, n, d_model)
    out = np.empty((1 + len(knock), *x.shape[1:]), x.dtype)                   # (1 + K, n, d_model)
    out[0] = x[0]
    order = sorted(range(len(knock)), key=lambda k: knock[k][0])              # by layer: joiners come last
    per_chunk = max(1, STACKED_ROWS // x.shape[1])
    for start in range(0, len(order), per_chunk):
        chunk = order[start:start + per_chunk]
        out[1 + np.array(chunk)] = _knocked_chunk(stages, inputs, contexts, [knock[k] for k in chunk])
    return out


def _knocked_chunk(stages: Sequence[LayerStages], inputs: list[np.ndarray], contexts: list[np.ndarray],
                   knock: list[tuple[int, int]]) -> np.ndarray:
    """One chunk of knockouts, in layer order, from the full run's layer ``inputs`` and ``contexts`` -> their last
    hidden states (K, n, d_model)."""
    x = None                                                                  # (B, n, d_model): the runs so far
    for index in range(knock[0][0], len(stages)):                             # from the chunk's lowest layer
        joining = [head for layer, head in knock if layer == index]
        running = None if x is None else stages[index].attend(x)              # (B, h, n, d_k)
        if joining:
            keep = np.ones((len(joining), contexts[index].shape[1], 1, 1), contexts[index].dtype)  # (J, h, 1, 1)
            keep[np.arange(len(joining)), joining] = 0                        # each joiner's head zeroed
            knocked = contexts[index] * keep                                  # (J, h, n, d_k)
            fresh = np.repeat(inputs[index], len(joining), axis=0)           # (J, n, d_model)
            x = fresh if x is None else np.concatenate([x, fresh])
            running = knocked if running is None else np.concatenate([running, knocked])
        x = stages[index].finish(x, running)
    return x


# ---------------------------------------------------------------------------
# Token occlusion: the modified inputs, stacked
# ---------------------------------------------------------------------------
def occludable(special: np.ndarray) -> np.ndarray:
    """An encoder's default positions to occlude: every token but the special ones, special (n,) bool -> (P,)."""
    return np.flatnonzero(~special)


def checked_positions(positions: Sequence[int] | np.ndarray, n: int, argument: str = "positions") -> np.ndarray:
    """Positions (P,) as int64, each in [0, n) and none twice; AttentionError naming ``argument`` otherwise."""
    array = np.asarray(list(positions))
    if array.size == 0:
        return np.zeros(0, np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu" or array.min() < 0 or array.max() >= n \
            or len(np.unique(array)) != len(array):
        raise AttentionError(argument, f"expected distinct token positions in [0, {n}), got {list(positions)!r}")
    return array.astype(np.int64)


def masked_copies(token_ids: np.ndarray, positions: np.ndarray, mask_id: int) -> np.ndarray:
    """token_ids (n,) -> (P, n): copy p with the token at positions[p] replaced by ``mask_id``."""
    copies = np.repeat(token_ids[None], len(positions), axis=0)               # (P, n)
    copies[np.arange(len(positions)), positions] = mask_id
    return copies


def removed_copies(token_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """token_ids (n,) -> (P, n - 1): copy p without the token at positions[p], the later ones moved up one."""
    n = len(token_ids)
    kept = np.arange(n - 1)[None] + (np.arange(n - 1)[None] >= positions[:, None])  # (P, n - 1): source positions
    return token_ids[kept]


def in_chunks(run: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray) -> np.ndarray:
    """``run`` over the rows of inputs (P, n, ...) in chunks of at most STACKED_ROWS // n rows (each a batch), the
    answers concatenated along their first axis."""
    per_chunk = max(1, STACKED_ROWS // inputs.shape[1])
    return np.concatenate([run(inputs[start:start + per_chunk]) for start in range(0, len(inputs), per_chunk)])


# ---------------------------------------------------------------------------
# What a run changed
# ---------------------------------------------------------------------------
def sentence_shift(full: np.ndarray, runs: np.ndarray) -> EncoderShift:
    """full (n, d_model), runs (K, n, d_model): last hidden states -> :class:`EncoderShift`. In float64 (1 - cos of
    two near vectors cancels), returned in the states' dtype."""
    full64, runs64 = full.astype(np.float64), runs.astype(np.float64)
    pooled, pooled_runs = full64.mean(axis=0), runs64.mean(axis=1)           # (d_model,), (K, d_model)
    cosine = pooled_runs @ pooled / (np.linalg.norm(pooled_runs, axis=-1) * np.linalg.norm(pooled))  # (K,)
    largest = np.linalg.norm(runs64 - full64, axis=-1).max(axis=-1, initial=0)  # (K,): over positions
    return EncoderShift((1 - cosine).astype(full.dtype), largest.astype(full.dtype))


def next_token_shift(full: np.ndarray, runs: np.ndarray) -> NextTokenShift:
    """full (vocab,), runs (K, vocab): logits at the last position -> :class:`NextTokenShift`. The log-softmaxes in
    float64 (a KL of near distributions is a small difference of large logs), SHIFT_BLOCK runs at a time (the
    decoder's 270 knockouts at once would take 100 MB a float64 temporary); returned in the logits' dtype.
    KL = sum_v p (log p - log q) = sum_v p log p - p . log q."""
    log_full = _log_softmax(full.astype(np.float64))                         # (vocab,)
    p = np.exp(log_full)
    kl = np.empty(len(runs))                                                  # (K,)
    for start in range(0, len(runs), SHIFT_BLOCK):
        block = _log_softmax(runs[start:start + SHIFT_BLOCK].astype(np.float64))  # (block, vocab)
        kl[start:start + SHIFT_BLOCK] = p @ log_full - block @ p
    return NextTokenShift(np.maximum(kl, 0).astype(full.dtype), runs.argmax(axis=-1), int(full.argmax()))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """(..., vocab) -> log-probabilities (..., vocab)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


# ---------------------------------------------------------------------------
# The four measurements, per model kind
# ---------------------------------------------------------------------------
def encoder_knockout(bert: Bert, token_ids: np.ndarray, token_type_ids: np.ndarray | None = None,
                     knock: Sequence[Sequence[int]] | None = None, *, dtype: type = np.float32) -> EncoderShift:
    """Head knockout for one text, token_ids (n,) (and its segments (n,)): one :class:`EncoderShift` value per
    knocked head, in ``knock``'s order (default every head, layer by layer: n_layers * n_heads)."""
    types = None if token_type_ids is None else token_type_ids[None]
    states = bert.knockout(token_ids[None], types, knock, dtype=dtype)        # (1 + K, n, d_model)
    return sentence_shift(states[0], states[1:])


def decoder_knockout(llama: Llama, token_ids: np.ndarray, knock: Sequence[Sequence[int]] | None = None, *,
                     dtype: type = np.float32) -> NextTokenShift:
    """Head knockout for one prompt, token_ids (n,): one :class:`NextTokenShift` value per knocked query head, in
    ``knock``'s order (default every head, layer by layer: n_layers * n_heads)."""
    logits = llama.knockout(token_ids[None], knock, dtype=dtype)              # (1 + K, vocab)
    return next_token_shift(logits[0], logits[1:])


def encoder_occlusion(bert: Bert, token_ids: np.ndarray, positions: Sequence[int] | np.ndarray, mask_id: int,
                      token_type_ids: np.ndarray | None = None, *, dtype: type = np.float32) -> EncoderShift:
    """Token occlusion for one text, token_ids (n,): one :class:`EncoderShift` value per position of ``positions``
    (P,), that token's id replaced by ``mask_id`` (an encoder's default: :func:`occludable`, every non-special)."""
    chosen = checked_positions(positions, len(token_ids))
    types = np.zeros_like(token_ids) if token_type_ids is None else token_type_ids
    full = bert(token_ids[None], types[None], dtype=dtype, return_weights=False).output[0]   # (n, d_model)
    copies = masked_copies(token_ids, chosen, mask_id)                       # (P, n)

    def run(ids: np.ndarray) -> np.ndarray:
        return bert(ids, np.broadcast_to(types, ids.shape), dtype=dtype, return_weights=False).output

    runs = in_chunks(run, copies) if len(chosen) else np.empty((0, *full.shape), full.dtype)
    return sentence_shift(full, runs)


def decoder_occlusion(llama: Llama, token_ids: np.ndarray, positions: Sequence[int] | np.ndarray | None = None, *,
                      dtype: type = np.float32) -> NextTokenShift:
    """Token occlusion for one prompt, token_ids (n,), n >= 2: one :class:`NextTokenShift` value per position of
    ``positions`` (default every one but the last; under a chat template, the service passes the user's text's),
    the prompt read without that token."""
    n = len(token_ids)
    chosen = checked_positions(range(n - 1) if positions is None else positions, n - 1)
    full = llama(token_ids[None], dtype=dtype, return_weights=False).logits[0]   # (vocab,)

    def run(ids: np.ndarray) -> np.ndarray:
        return llama(ids, dtype=dtype, return_weights=False).logits           # (chunk, vocab)

    removed = removed_copies(token_ids, chosen)                               # (P, n - 1)
    runs = in_chunks(run, removed) if len(chosen) else np.empty((0, *full.shape), full.dtype)
    return next_token_shift(full, runs)
