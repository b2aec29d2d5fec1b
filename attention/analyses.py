"""Beyond raw attention weights: attention rollout, attention flow and norm-based attention.

A head's weights say where it *looks*, not what it *moves*, and a token reaches the output through every layer,
not one. Three readings of a model correct for that:

* rollout (Abnar & Zuidema 2020): chain the layers' weights, each mixed half and half with the identity (the
  residual connection carries every token past the attention), by matrix products: how much of input token j
  is in position i after layer l;
* flow (same paper): the same layered graph read as pipes instead of products: the maximum flow from input
  token j to position i of the last layer, each edge's capacity the mixed weight;
* norms (Kobayashi et al. 2020): weigh each weight by the size of what it carries, ||alpha_ij f_h(x_j)|| with
  f_h(x) the value vector of head h already through its rows of W_O: a head may put 0.9 of its weight on
  [SEP] and move almost nothing.

Rollout and flow need only the weights (every head of every layer); the norms need the layer's value vectors
too, which each model computes in its forward pass (``norms_of=``: ``Bert``, ``Llama``; ``Encoder.with_norms``)
and hands to :func:`attention_norms`. Every function keeps its input's dtype (float32 in, float32 out).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from ._checks import all_finite, chosen_layers
from .errors import AttentionError
from .masks import zero_padding

# Flow capacities are integers (scipy's solvers are exact on integers): weights times 10^6, so every flow is a
# whole number of millionths.
FLOW_SCALE = 10**6
# Edges per scipy call (one copy of the layered graph per pair, as many copies as fit): MiniLM solves 43 pairs a
# call, 2.5x faster than a call per pair at 16 tokens, 1.75x at 32; the decoder's 30 layers 16 pairs, 1.4x at 16
# tokens, 1.0x at 32 (deep copies cost the solver more phases than they save in calls). Medians of 9 rounds.
UNION_EDGES = 1 << 18


@dataclass(frozen=True)
class AttentionNorms:
    """One layer's norm-based attention. ``heads`` (..., h, n, n_keys): ||alpha^h_ij f_h(x_j)||, what head h moves
    from key j into query i; ``layer`` (..., n, n_keys): ||sum_h alpha^h_ij f_h(x_j)||, what the whole layer moves
    (the heads' vectors added before the norm: they may cancel)."""

    heads: np.ndarray
    layer: np.ndarray

    def without_padding(self, keep: np.ndarray | None) -> AttentionNorms:
        """These norms with the rows of padded queries (``keep`` (B, n) False) set to 0, in place; themselves."""
        zero_padding(self.heads, keep, rows=True)
        zero_padding(self.layer, keep)
        return self


# ---------------------------------------------------------------------------
# The residual's share. An attention sub-layer computes x + attention(x): the token itself passes straight
# through beside what the heads bring. Rollout and flow model that as half the heads' mean weight plus half the
# identity, each row renormalised to sum to 1 (a query whose every key is masked, a row of zeros, keeps itself).
# ---------------------------------------------------------------------------
def mixed_with_residual(weights: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """A layer's weights (..., h, n, n) -> A_hat = 0.5 mean_h(A) + 0.5 I, rows renormalised: (..., n, n).
    ``keep`` (B, n): real positions of padded items (weights (B, h, n, n)); padded rows come out zeros."""
    mixed = np.add.reduce(weights, axis=-3)                                  # (..., n, n): sum over heads
    mixed *= weights.dtype.type(0.5 / weights.shape[-3])                     # half the heads' mean
    diagonal = np.arange(mixed.shape[-1])
    mixed[..., diagonal, diagonal] += weights.dtype.type(0.5)                 # half the identity
    mixed /= np.add.reduce(mixed, axis=-1, keepdims=True)                    # rows sum to 1 (sums were >= 0.5)
    return zero_padding(mixed, keep)


def rollout(weights: Sequence[np.ndarray], layers: Collection[int] | None = None,
            lengths: np.ndarray | None = None) -> list[np.ndarray | None]:
    """Attention rollout after each chosen layer: rollout_l = A_hat_l ... A_hat_1 (:func:`mixed_with_residual`).

    ``weights``: every layer's weights, in order, each (..., h, n, n) with every head (as a forward pass returns
    them). ``layers``: whose rollout comes back (default all); each always uses every earlier layer. ``lengths``
    (B,): each item's real tokens when the weights (B, h, n, n) are padded; padded rows are zeros.
    Returns n_layers entries: (..., n, n) for a chosen layer, whose row i says how much of each input token is in
    position i (a distribution: it sums to 1), None for the others. Causal weights give causal rollouts."""
    stack = _layer_weights(weights)
    chosen = chosen_layers(layers, len(stack), "layers")
    keep = _kept(lengths, stack[0])
    out: list[np.ndarray | None] = [None] * len(stack)
    rolled = None
    for index in range(max(chosen, default=-1) + 1):
        mixed = mixed_with_residual(stack[index], keep)                      # (..., n, n)
        rolled = mixed if rolled is None else mixed @ rolled                 # this layer's mix of the last one's
        if index in chosen:
            out[index] = rolled
    return out


# ---------------------------------------------------------------------------
# Attention flow. The layers form a graph: node (l, i) is position i after layer l (l = 0: the input tokens),
# with an edge from (l-1, j) to (l, i) whose capacity is A_hat_l[i, j]. Where rollout multiplies along every
# path and adds the paths up, flow asks how much can get through at once when every edge carries at most its
# capacity: the maximum flow from (0, j) to (L, i). A last-layer node receives capacities that sum to 1, so
# every flow lies in [0, 1]. One max-flow problem per pair: n^2 of them, solved by scipy's compiled Dinic.
#
# Many pairs go to scipy at once. Each call costs ~130 us of Python around the solver (more than the solve itself
# on MiniLM's 6 layers), so one graph holds a copy of the layered graph per pair, each copy's source fed by one
# super source and its sink draining into one super sink: copies share no edge, so the flow through each copy
# is its own pair's maximum flow, and one call answers them all.
# ---------------------------------------------------------------------------
def flow(weights: Sequence[np.ndarray], lengths: np.ndarray | None = None) -> np.ndarray:
    """Attention flow from every input token to every position of the last layer.

    ``weights``: every layer's weights, in order, each (..., h, n, n) with every head. ``lengths`` (B,): each
    item's real tokens when the weights (B, h, n, n) are padded (only those pairs are solved). Returns
    (..., n, n): [i, j] the maximum flow from input token j to position i after the last layer, in [0, 1]; the
    capacities are A_hat in whole millionths (each within 1e-6), so a flow is within 1e-6 per edge of its min
    cut; 0 wherever no path leads (j > i under a causal mask, padding). Cost: a maximum flow on L n^2 edges for
    each pair with a path (n^2 of them, n (n + 1) / 2 causal), UNION_EDGES edges per call of
    ``scipy.sparse.csgraph.maximum_flow``."""
    stack = _layer_weights(weights)
    keep = _kept(lengths, stack[0])
    mixed = np.stack([mixed_with_residual(w, keep) for w in stack], axis=-3)  # (..., L, n, n)
    n = mixed.shape[-1]
    items = mixed.reshape(-1, *mixed.shape[-3:])                             # (items, L, n, n)
    out = np.zeros((len(items), n, n), mixed.dtype)
    for item, layered in enumerate(items):
        real = n if lengths is None else int(lengths[item])
        out[item, :real, :real] = _item_flow(layered[:, :real, :real].astype(np.float64))
    return out.reshape(*mixed.shape[:-3], n, n)


def _item_flow(mixed: np.ndarray) -> np.ndarray:
    """One item's A_hat (L, n, n) float64 -> its flows (n, n) float64."""
    capacities = _capacities(mixed)                                          # (L, n, n) int32
    pairs = np.argwhere(_reachable(capacities))                              # (k, 2): (i, j); no path, no solve
    per_call = max(1, UNION_EDGES // np.count_nonzero(capacities))
    out = np.zeros(capacities.shape[1:])                                     # (n, n)
    for start in range(0, len(pairs), per_call):
        sinks, sources = pairs[start:start + per_call].T
        out[sinks, sources] = _flows(capacities, sinks, sources)
    return out / FLOW_SCALE


def _flows(capacities: np.ndarray, sinks: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """The maximum flows (k,) from input token sources[c] to last-layer position sinks[c], in capacity units, in one
    scipy call on :func:`_copies`: the flow that enters copy c from the super source is pair c's."""
    from scipy.sparse.csgraph import maximum_flow  # ~70 ms to import: paid by the first flow, not by every process

    graph, per_copy = _copies(capacities, sinks, sources)
    source, sink = graph.shape[0] - 2, graph.shape[0] - 1
    flows = maximum_flow(graph, source, sink).flow                           # per edge
    fed = slice(flows.indptr[source], flows.indptr[source + 1])              # the super source's edges, one a copy
    out = np.zeros(len(sinks))
    out[flows.indices[fed] // per_copy] = flows.data[fed]
    return out


def _copies(capacities: np.ndarray, sinks: np.ndarray, sources: np.ndarray) -> tuple[sparse.csr_array, int]:
    """One copy of the layered graph per pair (sinks[c], sources[c]), keeping only its source's edges out of layer 0
    and its sink's into layer L, then a super source feeding every copy's source and a super sink drained by every
    copy's sink (the graph's last two nodes, their edges never binding: a flow is at most 1). Returns the graph and
    the nodes per copy."""
    n_layers, n, _ = capacities.shape
    copies = len(sinks)
    per_copy = 2 + (n_layers - 1) * n                                        # a source, L - 1 layers, a sink
    first = np.arange(copies)[:, None] * per_copy                           # (k, 1): each copy's first node
    rows, cols, caps = [], [], []
    for layer in range(1, n_layers + 1):                                     # edges from layer - 1 into layer
        into = sinks[:, None] if layer == n_layers else np.arange(n)[None]   # (k|1, m_to) positions
        out_of = sources[:, None] if layer == 1 else np.arange(n)[None]      # (k|1, m_from)
        block = capacities[layer - 1][into[:, :, None], out_of[:, None, :]]  # (k|1, m_to, m_from)
        block = np.broadcast_to(block, (copies, *block.shape[1:]))
        to = first[:, :, None] + _node(layer, n_layers, n, into)[:, :, None]
        from_ = first[:, :, None] + _node(layer - 1, n_layers, n, out_of)[:, None, :]
        kept = block > 0                                                     # a closed edge is no edge
        rows.append(np.broadcast_to(from_, block.shape)[kept])
        cols.append(np.broadcast_to(to, block.shape)[kept])
        caps.append(block[kept])
    source, sink = copies * per_copy, copies * per_copy + 1
    rows += [np.full(copies, source), first[:, 0] + per_copy - 1]
    cols += [first[:, 0], np.full(copies, sink)]
    caps += [np.full(copies, FLOW_SCALE, np.int32)] * 2
    graph = sparse.csr_array((np.concatenate(caps), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(sink + 1, sink + 1))
    return graph, per_copy


def _node(layer: int, n_layers: int, n: int, positions: np.ndarray) -> np.ndarray:
    """Node ids within a copy of the given positions after ``layer``: 0 the copy's source (layer 0), then layers 1
    to L - 1 of n nodes each, last the copy's sink (layer L)."""
    if layer == 0:
        return np.zeros_like(positions)
    if layer == n_layers:
        return np.full_like(positions, 1 + (n_layers - 1) * n)
    return 1 + (layer - 1) * n + positions


def _capacities(mixed: np.ndarray) -> np.ndarray:
    """A_hat (L, n, n) -> integer capacities in millionths (L, n, n) int32, each within one unit of its exact
    value and every row summing to exactly FLOW_SCALE, so no flow passes 1: each rounded down, then the units a
    row is short go to its largest remainders (never to a zero: a masked weight stays closed)."""
    scaled = mixed / np.add.reduce(mixed, axis=-1, keepdims=True) * FLOW_SCALE  # rows again, now in float64
    down = np.floor(scaled)
    short = np.rint(FLOW_SCALE - np.add.reduce(down, axis=-1, keepdims=True))  # (L, n, 1) units missing a row
    rank = np.argsort(np.argsort(down - scaled, axis=-1), axis=-1)           # 0 for a row's largest remainder
    return (down + ((rank < short) & (scaled > down))).astype(np.int32)


def _reachable(capacities: np.ndarray) -> np.ndarray:
    """(n, n) bool: whether some path of open edges leads from input token j to last-layer position i."""
    reach = np.eye(capacities.shape[-1], dtype=np.float32)
    for layer in capacities:
        reach = np.minimum((layer > 0).astype(np.float32) @ reach, 1)        # counts capped: no overflow
    return reach > 0


# ---------------------------------------------------------------------------
# Norm-based attention. A head hands query i the sum over keys j of alpha_ij v_j; W_O then maps it into the
# model's space. Because W_O is linear, the head's part of the layer's output splits exactly into one vector
# per key: alpha_ij f_h(x_j), with f_h(x_j) = v^h_j W_O[h's rows]. Its norm is what key j really contributes.
# ---------------------------------------------------------------------------
def transformed_values(values: np.ndarray, w_o: np.ndarray) -> np.ndarray:
    """f_h(x_j) = v^h_j W_O[h's rows] for every head and key: values (..., h_kv, n_keys, d_k), w_o (h d_k, d_model)
    with the heads' rows in order -> (..., h, n_keys, d_model). With grouped-query attention (h_kv < h) query head
    h reads value head h // (h / h_kv): each value head meets its group's rows of W_O by broadcasting, not copied."""
    *lead, h_kv, n_keys, d_k = values.shape
    group = w_o.shape[0] // (h_kv * d_k)
    per_head = w_o.reshape(h_kv, group, d_k, w_o.shape[1])                   # (h_kv, group, d_k, d_model)
    out = values[..., :, None, :, :] @ per_head                             # (..., h_kv, group, n_keys, d_model)
    return out.reshape(*lead, h_kv * group, n_keys, w_o.shape[1])


def attention_norms(weights: np.ndarray, values: np.ndarray, w_o: np.ndarray) -> AttentionNorms:
    """Norm-based attention of one layer: weights (..., h, n, n_keys) of every head, values (..., h_kv, n_keys, d_k)
    (x W_V + b_V, x the attention's input; h_kv divides h) and w_o (h d_k, d_model) -> :class:`AttentionNorms`.

    ||sum_h a_h f_h||^2 = sum_{h,g} a_h a_g <f_h, f_g>: each key's Gram matrix of its h vectors (h, h) stands in for
    the n sums of d_model-vectors that query i would mix from it. It is computed in float64, whatever the dtype:
    squaring costs a float32 answer nothing then (under the root, the rounding of the squares is 1e-8 of the heads'
    total, below float32's own 6e-8), and a float64 answer loses about 1e-16 / c^2 where its heads cancel down to a
    fraction c of their total (c >= 0.16 over five texts in MiniLM and the decoder: 4e-15 at most)."""
    transformed = transformed_values(values, w_o)                           # (..., h, n_keys, d_model)
    by_key = np.swapaxes(transformed, -3, -2).astype(np.float64)             # (..., n_keys, h, d_model)
    gram = by_key @ np.swapaxes(by_key, -1, -2)                              # (..., n_keys, h, h): <f_h, f_g>
    sizes = np.sqrt(np.einsum("...hh->...h", gram)).astype(weights.dtype)    # (..., n_keys, h): ||f_h(x_j)||
    heads = weights * np.swapaxes(sizes, -1, -2)[..., None, :]               # (..., h, n, n_keys)
    by_query = np.moveaxis(weights, -1, -3).astype(np.float64)               # (..., n_keys, h, n)
    squared = np.vecdot(by_query, gram @ by_query, axis=-2)                  # (..., n_keys, n): a^T G a
    layer = np.sqrt(np.maximum(squared, 0))                                  # >= 0 up to rounding
    return AttentionNorms(heads, np.ascontiguousarray(np.swapaxes(layer, -1, -2), dtype=weights.dtype))


# ---------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------
def _layer_weights(weights: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Every layer's weights, checked: one shape (..., h, n, n), float32 or float64, finite."""
    stack = list(weights)
    if not stack or any(w is None for w in stack):
        raise AttentionError("weights", "expected every layer's weights, in order (a forward pass with all of them)")
    first = stack[0]
    for w in stack:
        if not isinstance(w, np.ndarray) or w.dtype not in (np.float32, np.float64) or w.ndim < 3 \
                or w.shape != first.shape or w.dtype != first.dtype or w.shape[-1] != w.shape[-2]:
            raise AttentionError("weights", f"expected float32 or float64 arrays of one shape (..., h, n, n), got "
                                            f"{getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
        if not all_finite(w):
            raise AttentionError("weights", "values must be finite")
    return stack


def _kept(lengths: np.ndarray | None, weights: np.ndarray) -> np.ndarray | None:
    """(B, n) real positions of padded items whose weights are (B, h, n, n); None without lengths."""
    if lengths is None:
        return None
    b, n = weights.shape[0], weights.shape[-1]
    if weights.ndim != 4 or not isinstance(lengths, np.ndarray) or lengths.shape != (b,) \
            or lengths.dtype.kind not in "iu" or lengths.min() < 1 or lengths.max() > n:
        raise AttentionError("lengths", f"expected ({b},) integers in [1, {n}] for weights (B, h, n, n), got "
                                        f"{getattr(lengths, 'shape', lengths)} for {weights.shape}")
    return np.arange(n) < lengths[:, None]
