"""Vectorised batch compute: items sharing an op, shapes and options run as ONE engine call.

As an inference server batches: the items of a group are stacked along a new leading axis,
computed by the very compute function their single endpoint uses (the engine takes leading batch
axes everywhere; masks broadcast over them), and split back along that axis. No Flask here.

Group key: the op, the shape and dtype of every stacked array *including the mask* (an item with a
mask never shares a group with one without, so no all-true mask is ever invented) or, for an item
given as tokens, their number and d_model (a group embeds all its items' words in one gather; an
item with an unknown word is computed alone, to name it), and every other
param of the validated request (seed, n_heads, causal, scale, dtype, return_weights, explicit
weights by a hash of their bytes, ...). Only the stacked inputs (the registry's ``stacked``) and ``NOT_IN_KEY``
are left out, so an option added to a schema later can only split groups, never mix them.

Alignment: before stacking, an item's arrays get leading 1-axes up to the item's batch rank, so a
``(n,)`` mask or an unbatched key still lines up with a batched query once the group axis is
prepended (numpy broadcasts from the right: a stacked ``(G, n)`` mask would meet ``(G, n, n)``
scores as ``(1, G, n)``, silently wrong when G == n).

An operation with nothing to stack (a trained model's texts) declares its own ``grouping`` in the registry: a key
(for a model: the model, the length in tokens and the options) and a compute of the whole group in one engine call.

Computed one by one, exactly as their single endpoints: groups of one, ``trace`` items (their
intermediates are per item anyway), ``embed`` and ``positional-encoding`` (no engine work worth
stacking). Every item comes prepared (sized and checked against the limits as alone). A group whose stacked call
fails (say a mask that fits none of its items) is recomputed item by item, so each item gets its own answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Hashable
from typing import Any

import numpy as np

import attention as engine
from service.operations.inputs import Prepared
from service.operations.registry import OPERATIONS, Result
from service.runtime import metrics

# Not options: the mask is stacked; decimals only rounds each item's answer; tokens are in the key
# as the shape of the embeddings they become. (d_model stays an option: with embeddings it must
# equal their width, which the group's call checks only for its first item.)
NOT_IN_KEY = frozenset({"mask", "decimals", "tokens"})


@dataclasses.dataclass
class Job:
    """One item: its op, the prepared request its compute function takes, and what it is grouped by."""

    op: str
    prepared: Prepared
    stacked: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # name -> aligned array
    key: Hashable = None  # None: computed alone


def run(items: list[tuple[str, Prepared]]) -> list[Result | Exception]:
    """Compute prepared ``(op, prepared)`` items; one result or exception per item, in order.

    An exception is what the item's single endpoint would have raised (a ``Problem``, the
    engine's ``AttentionError``, or a bug); it never affects the other items.
    """
    answers: list[Result | Exception | None] = [None] * len(items)
    groups: dict[Hashable, list[tuple[int, Job]]] = {}
    for index, (op, prepared) in enumerate(items):
        try:
            job = grouped(op, prepared)
        except Exception as error:
            answers[index] = error
            continue
        groups.setdefault(job.key if job.key is not None else ("alone", index), []).append((index, job))
    for members in groups.values():
        indices = [index for index, _ in members]
        for index, answer in zip(indices, compute_group([job for _, job in members]), strict=True):
            answers[index] = answer
    return answers  # type: ignore[return-value]  # every slot is filled above


def grouped(op: str, prepared: Prepared) -> Job:
    """The item made stackable: arrays aligned, key computed. Tokens are embedded later with their whole
    group."""
    operation, params = OPERATIONS[op], prepared.params
    if operation.grouping is not None:  # nothing to stack: the operation says what goes together
        key = operation.grouping.key(prepared)
        return Job(op, prepared, key=None if key is None else (op, key))
    stacked = operation.stacked
    if not stacked or params.get("trace"):
        return Job(op, prepared)
    if "tokens" in params:
        if not all(word in engine.EMBEDDINGS for word in params["tokens"]):
            return Job(op, prepared)  # alone: its own compute names the unknown words
        rank, arrays = 2, {}
        words = len(params["tokens"])  # with d_model (in the options below): the shape of its embeddings
    else:
        rank = max(params[name].ndim for name in stacked)  # batch axes + 2
        arrays = {name: _lead(params[name], rank) for name in stacked}
        words = None
    mask = params.get("mask")
    if mask is not None:
        per_head = OPERATIONS[op].per_head_mask and engine.is_per_head(mask.ndim, rank)  # (..., h, n, n)
        arrays["mask"] = _lead(mask, rank + per_head)
    options = {name: value for name, value in params.items() if name not in NOT_IN_KEY and name not in arrays}
    shapes = tuple((name, array.shape, array.dtype.str) for name, array in arrays.items())
    return Job(op, prepared, arrays, (op, words, shapes, _frozen(options)))


def compute_group(jobs: list[Job]) -> list[Result | Exception]:
    """Results of jobs sharing a key (each prepared, so each within its limits): stacked in one compute call, or
    one by one."""
    if len(jobs) > 1:
        operation = OPERATIONS[jobs[0].op]
        try:
            with metrics.unrecorded() as held:  # counted only if kept: a failed stack is recomputed item by item
                if operation.grouping is not None:
                    results = operation.grouping.compute([job.prepared for job in jobs])
                else:
                    results = _split(operation.compute(_merge(jobs)), len(jobs))
        except Exception:
            pass
        else:
            metrics.record(held)
            return results
    return [_alone(job) for job in jobs]


def _merge(jobs: list[Job]) -> Prepared:
    """The request of one call for the whole group: its arrays stacked on a new leading axis (G, ...), the items'
    tokens embedded in one gather, (G * n, d_model) -> (G, n, d_model), and the weights of all its items."""
    first = jobs[0].prepared
    merged = {**first.params, **{name: np.stack([job.stacked[name] for job in jobs]) for name in jobs[0].stacked}}
    if "tokens" in merged:
        embedded = engine.embed([word for job in jobs for word in job.prepared.params["tokens"]],
                                merged.get("d_model"))
        merged["embeddings"] = embedded.reshape(len(jobs), -1, embedded.shape[-1])
        del merged["tokens"]
    weights = sum(job.prepared.work.weights for job in jobs)
    return Prepared(merged, dataclasses.replace(first.work, weights=weights))


def _alone(job: Job) -> Result | Exception:
    try:
        return OPERATIONS[job.op].compute(job.prepared)
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
