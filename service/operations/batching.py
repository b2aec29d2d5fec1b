"""Vectorised batch compute: items sharing an op, shapes and options run as ONE engine call.

As an inference server batches: the items of a group are stacked along a new leading axis,
computed by the very compute function their single endpoint uses (the engine takes leading batch
axes everywhere; masks broadcast over them), and split back along that axis. No Flask here.

Group key: the op, the shape and dtype of every stacked array *including the mask* (an item with a
mask never shares a group with one without, so no all-true mask is ever invented) or, for an item
given as tokens, their number and d_model (a group embeds all its items' words in one gather; an
item with an unknown word is computed alone, to name it), and every other
param of the validated request (seed, n_heads, causal, scale, dtype, return_weights, explicit
weights by a hash of their bytes, ...). Only the params named in ``STACKED`` and ``NOT_IN_KEY`` are
left out, so an option added to a schema later can only split groups, never mix them.

Alignment: before stacking, an item's arrays get leading 1-axes up to the item's batch rank, so a
``(n,)`` mask or an unbatched key still lines up with a batched query once the group axis is
prepended (numpy broadcasts from the right: a stacked ``(G, n)`` mask would meet ``(G, n, n)``
scores as ``(1, G, n)``, silently wrong when G == n).

Computed one by one, exactly as their single endpoints: groups of one, ``trace`` items (their
intermediates are per item anyway), ``embed`` and ``positional-encoding`` (no engine work worth
stacking). A group whose stacked call fails (say a mask that fits none of its items, or an item
past a limit) is recomputed item by item, so each item gets its own answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Hashable
from typing import Any

import numpy as np

import attention as engine
from service.operations import compute
from service.operations.limits import Limits
from service.runtime import metrics

Params = compute.Params
Result = compute.Result

# op -> the inputs stacked along the group axis; every other param is an option (in the key).
STACKED: dict[str, tuple[str, ...]] = {
    "attention": ("query", "key", "value"),
    "self-attention": ("embeddings",),
    "multi-head-attention": ("embeddings",),
    "encoder": ("embeddings",),
}
# Not options: the mask is stacked; decimals only rounds each item's answer; tokens are in the key
# as the shape of the embeddings they become. (d_model stays an option: with embeddings it must
# equal their width, which the group's call checks only for its first item.)
NOT_IN_KEY = frozenset({"mask", "decimals", "tokens"})
PER_HEAD_MASK = frozenset({"multi-head-attention", "encoder"})  # may take (..., h, n, n) masks


@dataclasses.dataclass
class Job:
    """One item: its op, params as its compute function takes them, and what it is grouped by."""

    op: str
    params: Params
    stacked: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # name -> aligned array
    key: Hashable = None  # None: computed alone


def run(items: list[tuple[str, Params]], limits: Limits) -> list[Result | Exception]:
    """Compute validated ``(op, params)`` items; one result or exception per item, in order.

    An exception is what the item's single endpoint would have raised (a ``ProblemError``, the
    engine's ``AttentionError``, or a bug); it never affects the other items.
    """
    answers: list[Result | Exception | None] = [None] * len(items)
    groups: dict[Hashable, list[tuple[int, Job]]] = {}
    for index, (op, params) in enumerate(items):
        try:
            job = prepare(op, params, limits)
        except Exception as error:
            answers[index] = error
            continue
        groups.setdefault(job.key if job.key is not None else ("alone", index), []).append((index, job))
    for members in groups.values():
        indices = [index for index, _ in members]
        for index, answer in zip(indices, compute_group([job for _, job in members], limits), strict=True):
            answers[index] = answer
    return answers  # type: ignore[return-value]  # every slot is filled above


def prepare(op: str, params: Params, limits: Limits) -> Job:
    """The item made stackable: arrays aligned, key computed. Tokens are checked against the limits
    here (raising as the single endpoint would) and embedded later with their whole group."""
    if op not in STACKED or params.get("trace"):
        return Job(op, params)
    if "tokens" in params:
        compute.check_tokens(params, limits)
        if not all(word in engine.EMBEDDINGS for word in params["tokens"]):
            return Job(op, params)  # alone: its own compute names the unknown words
        rank, arrays = 2, {}
        words = len(params["tokens"])  # with d_model (in the options below): the shape of its embeddings
    else:
        rank = max(params[name].ndim for name in STACKED[op])  # batch axes + 2
        arrays = {name: _lead(params[name], rank) for name in STACKED[op]}
        words = None
    mask = params.get("mask")
    if mask is not None:
        per_head = op in PER_HEAD_MASK and mask.ndim == rank + 1  # (..., h, n, n): see MultiHeadAttention
        arrays["mask"] = _lead(mask, rank + per_head)
    options = {name: value for name, value in params.items() if name not in NOT_IN_KEY and name not in arrays}
    shapes = tuple((name, array.shape, array.dtype.str) for name, array in arrays.items())
    return Job(op, params, arrays, (op, words, shapes, _frozen(options)))


def compute_group(jobs: list[Job], limits: Limits) -> list[Result | Exception]:
    """Results of jobs sharing a key: stacked in one compute call, or one by one."""
    if len(jobs) > 1:
        first = jobs[0]
        # Each item was within the size limits iff the stack is within G times them (same shapes).
        group_limits = dataclasses.replace(limits, max_weight_elements=limits.max_weight_elements * len(jobs),
                                           max_output_elements=limits.max_output_elements * len(jobs))
        try:
            with metrics.unrecorded() as held:  # counted only if kept: a failed stack is recomputed item by item
                result = compute.ENDPOINTS[first.op].compute(_merge(jobs), group_limits)
        except Exception:
            pass
        else:
            metrics.record(held)
            return _split(result, len(jobs))
    return [_alone(job, limits) for job in jobs]


def _merge(jobs: list[Job]) -> Params:
    """The params of one call for the whole group: its arrays stacked on a new leading axis (G, ...),
    and the items' tokens embedded in one gather, (G * n, d_model) -> (G, n, d_model)."""
    merged = {**jobs[0].params, **{name: np.stack([job.stacked[name] for job in jobs]) for name in jobs[0].stacked}}
    if "tokens" in merged:
        embedded = engine.embed([word for job in jobs for word in job.params["tokens"]], merged.get("d_model"))
        merged["embeddings"] = embedded.reshape(len(jobs), -1, embedded.shape[-1])
        del merged["tokens"]
    return merged


def _alone(job: Job, limits: Limits) -> Result | Exception:
    try:
        return compute.ENDPOINTS[job.op].compute(job.params, limits)
    except Exception as error:
        return error


def _lead(array: np.ndarray, rank: int) -> np.ndarray:
    """``array`` with leading 1-axes up to ``rank`` (a view)."""
    return array.reshape((1,) * (rank - array.ndim) + array.shape) if array.ndim < rank else array


def _split(result: Any, count: int) -> list[Any]:
    """The ``count`` items of a stacked result: every array split along the group axis at once
    (views), the structure of dicts and lists kept, anything else shared by every item."""
    if isinstance(result, dict):
        parts = {key: _split(value, count) for key, value in result.items()}
        return [{key: part[i] for key, part in parts.items()} for i in range(count)]
    if isinstance(result, list):
        parts = [_split(value, count) for value in result]
        return [[part[i] for part in parts] for i in range(count)]
    return list(result) if isinstance(result, np.ndarray) else [result] * count


_PLAIN = frozenset({bool, int, str, type(None)})  # hashable, and equal only when the same value


def _frozen(value: Any) -> Hashable:
    """A hashable stand-in equal for equal values: arrays by shape, dtype and a hash of their bytes;
    floats by their exact bits (so 0.0 and -0.0 differ)."""
    if isinstance(value, dict):  # most options are plain: no call for them
        return tuple(sorted((key, sub if type(sub) in _PLAIN else _frozen(sub)) for key, sub in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(sub) for sub in value)
    if isinstance(value, np.ndarray):
        digest = hashlib.blake2b(np.ascontiguousarray(value).data, digest_size=16).digest()
        return ("array", value.shape, value.dtype.str, digest)
    if isinstance(value, float):
        return ("float", value.hex())
    return value


RETURNED_EXTRA = 3  # a returned number also becomes an array element and ~20 bytes of JSON text
MACS_PER_UNIT = 1024  # multiply-adds of a layer's projections and feed-forward per unit of the budget
LAYER_OPS = ("self-attention", "multi-head-attention", "encoder")


def cost(op: str, params: Params, limits: Limits) -> int:
    """An item's share of the batch budget ``max_batch_elements``: the numbers it computes (attention
    weights B * h * n_q * n_k, times layers, times 5 with trace (4 without the weights), plus its output, plus an
    encoder's feed-forward hidden layer B * n * d_ff per layer, plus one per ``MACS_PER_UNIT`` multiply-adds of its
    projections and feed-forward), and ``RETURNED_EXTRA`` more for
    each number it returns (the weights unless return_weights is false, every stage with trace, the
    output): the answer is what takes a worker's memory. (The seeded weights a batch draws are counted
    once per distinct layer by :func:`seeded_draws`.)

    Shapes only, nothing computed. An item past its own limits counts at most what they allow (it
    will answer its own 422), so it cannot make a batch of good items too large.
    """
    per_item = limits.max_sequence_length * limits.max_d_model
    trace = params.get("trace", False)
    inner = 0  # what a layer computes but does not return: its hidden layer, its multiply-adds per unit
    if op == "positional-encoding":
        return (1 + RETURNED_EXTRA) * min(params["n_positions"] * params["d_model"], per_item)
    if op == "attention":
        q, k, v = params["query"], params["key"], params["value"]
        batch = compute.batch_size(q, k, v)
        weights = batch * q.shape[-2] * k.shape[-2]
        output = min(batch * q.shape[-2] * v.shape[-1], limits.max_output_elements)
    else:
        batch, n, d_model = _sentence(params)
        if op == "embed":
            return (1 + RETURNED_EXTRA) * min(batch * n * d_model, per_item)
        shape = _layer_shape(op, params, d_model, limits)
        # Each size as if at its limit when past it; and no more batch items than the weights limit allows.
        n = min(n, limits.max_sequence_length)
        per_sentence = shape.heads * n * n * shape.layers
        batch = min(batch, max(1, limits.max_weight_elements // (per_sentence * compute.weight_arrays(params))))
        weights = batch * per_sentence
        # the output and the traced arrays along the positions, bounded together as compute bounds them
        output = min(batch * n * (shape.d_out + (shape.traced if trace else 0)), limits.max_output_elements)
        # The feed-forward's hidden layer, as compute bounds it per layer: with d_model 1, a stack of such items
        # (64 of 1024 positions, d_ff 2048) asked for 1 GB of it, where its multiply-adds counted next to nothing.
        hidden = shape.layers * min(batch * n * shape.hidden, limits.max_output_elements)
        inner = hidden + batch * n * shape.macs // MACS_PER_UNIT
    weights = min(weights * compute.weight_arrays(params), limits.max_weight_elements)
    returned = (weights if trace or params.get("return_weights", True) else 0) + output
    return weights + output + inner + RETURNED_EXTRA * returned


@dataclasses.dataclass(frozen=True)
class _LayerShape:
    """Sizes of a self-attention, multi-head or encoder item, each at most its limit. Per position:
    ``traced`` numbers its trace returns besides weights and output, ``macs`` multiply-adds of its
    projections and feed-forward, ``hidden`` numbers of the feed-forward's hidden layer in each layer (d_ff).
    ``drawn``: random numbers its seeded weights take."""

    d_out: int
    heads: int
    layers: int
    traced: int
    macs: int
    drawn: int
    hidden: int = 0


def _sentence(params: Params) -> tuple[int, int, int]:
    """(batch, n, d_model) of an item given as tokens or embeddings."""
    if "tokens" in params:
        return 1, len(params["tokens"]), params.get("d_model", 4)
    x = params["embeddings"]
    return compute.batch_size(x), x.shape[-2], x.shape[-1]


def _layer_shape(op: str, params: Params, d_model: int, limits: Limits) -> _LayerShape:
    d = min(d_model, limits.max_d_model)
    if op == "self-attention":
        d_k = min(compute.width_of_self_attention(params) or d, limits.max_d_model)
        return _LayerShape(d_k, 1, 1, traced=compute.LAYER_TRACE_ARRAYS * d_k, macs=3 * d * d_k,
                           drawn=3 * d * d_k)  # Q, K, V
    heads = min(params["n_heads"], limits.max_heads)
    if op == "multi-head-attention":
        return _LayerShape(d, heads, 1, traced=compute.LAYER_TRACE_ARRAYS * d, macs=4 * d * d,
                           drawn=4 * d * d)  # Q, K, V, then W_o
    layers, d_ff = min(params["n_layers"], limits.max_layers), min(params.get("d_ff", 4 * d), limits.max_d_ff)
    per_layer = 4 * d * d + 2 * d * d_ff  # and W_1, W_2
    return _LayerShape(d, heads, layers, traced=compute.ENCODER_TRACE_ARRAYS * d * layers, macs=layers * per_layer,
                       drawn=layers * per_layer, hidden=d_ff)


def seeded_draws(items: list[tuple[str, Params]], limits: Limits) -> int:
    """Random numbers drawn to build the seeded layers of a batch's items, once per distinct layer (op,
    seed, sizes; explicit weights draw none): 256 encoder items of d_model 512, each with its own seed,
    drew ~5 G numbers from a 36 KB body, past the worker timeout."""
    drawn: dict[tuple, int] = {}
    for op, params in items:
        if op in LAYER_OPS and not params.get("weights"):
            d_model = _sentence(params)[2]
            key = (op, params["seed"], d_model, params.get("d_k"), params.get("n_heads"), params.get("n_layers"),
                   params.get("d_ff"))
            drawn[key] = _layer_shape(op, params, d_model, limits).drawn
    return sum(drawn.values())
