"""The size model: what one request computes, from its shapes alone, and the two rules that judge it.

Each operation's ``work(params)`` says what it will compute (:class:`Work`); :func:`check` refuses a single
request past a limit (422, before any compute) and :func:`cost` is its share of a batch's budget (413). One
formula for both: a batch item is checked with :func:`check` before its cost counts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np

from service.problems import LimitExceeded, pointer
from service.settings import Limits

Params = dict[str, Any]

TRACE_STAGES = 4  # a trace returns scores, scaled scores, masked scores and weights: four n*n arrays
LAYER_TRACE_ARRAYS = 3  # and a layer's trace q, k, v along the positions
ENCODER_TRACE_ARRAYS = 7  # an encoder layer's: q, k, v, the heads mixed by W_o, add & norm, feed-forward, output
RETURNED_EXTRA = 3  # a returned number also becomes an array element and ~20 bytes of JSON text
MACS_PER_UNIT = 1024  # multiply-adds of a layer's projections and feed-forward per unit of the budget


@dataclasses.dataclass(frozen=True)
class Along:
    """``arrays`` arrays of ``size`` numbers along the positions, blamed on ``where`` past max_output_elements.
    ``returned``: part of the answer (else computed only, ``repeat`` times: once per encoder layer).
    ``checked``: False where the request's own dimension limits already bound it (embeddings, encodings)."""

    size: int
    arrays: int
    where: str
    returned: bool = True
    repeat: int = 1
    checked: bool = True


@dataclasses.dataclass(frozen=True)
class Work:
    """What one request computes. ``dims``: (limit, value, where) checked in order, ``where`` a JSON
    Pointer, or with ``query`` the name of a query parameter. ``weights``: attention weights of one copy
    (B * h * n_q * n_k * layers), of which ``copies`` arrays are computed (see :func:`weight_arrays`);
    ``returns_weights`` whether they are in the answer. ``macs``: multiply-adds of projections and
    feed-forward. ``draws``: (layer key, random numbers) of seeded weights, counted once per distinct layer
    in a batch. ``fewer``: pointers to the members that select less of the answer, named beside a refusal of
    its size (weights, heatmap cells, numbers along the positions). ``new_tokens``: what a generation asks for,
    as the max_new_tokens limit counts it (judged alone by its operation; summed by a batch)."""

    dims: tuple[tuple[str, int, str], ...] = ()
    query: bool = False
    weights: int = 0
    weights_where: str = ""
    copies: int = 1
    returns_weights: bool = False
    heatmap: bool = False
    along: tuple[Along, ...] = ()
    macs: int = 0
    draws: tuple[Hashable, int] | None = None
    fewer: tuple[str, ...] = ()  # members that ask for less of the answer (a model's /layers, /heads)
    new_tokens: int = 0  # tokens a generation asks for, as max_new_tokens counts them (a batch sums them)


def weight_arrays(params: Params) -> int:
    """How many n*n arrays of attention weights a request computes or returns: one, or with trace its
    TRACE_STAGES and, unless return_weights is false, the weights once more beside the trace."""
    return TRACE_STAGES + params.get("return_weights", True) if params.get("trace") else 1


def batch_size(*arrays: np.ndarray | None, core: int = 2) -> int:
    """Largest product of leading (batch/head) axes among the arrays, core axes excluded."""
    largest = 1
    for array in arrays:  # a loop, not max(<generator>): on every request
        if array is not None:
            largest = max(largest, math.prod(array.shape[:-core]))
    return largest


def weighing(params: Params, weights: int, where: str) -> dict[str, Any]:
    """The Work fields of ``weights`` attention weights of a request (one copy), blamed on ``where``."""
    copies = weight_arrays(params)
    return {"weights": weights, "weights_where": where, "copies": copies, "heatmap": params.get("format") == "svg",
            "returns_weights": bool(params.get("trace") or params.get("return_weights", True))}


def check(work: Work, limits: Limits) -> None:
    """Raise :class:`LimitExceeded` (422) at the first limit ``work`` is past, before any compute."""
    for name, value, where in work.dims:
        if work.query:
            limits.check(name, value, parameter=where)
        else:
            limits.check(name, value, pointer=where)
    try:
        _check_answer(work, limits)
    except LimitExceeded as exc:
        named = {error.get("pointer") for error in exc.members["errors"]}
        exc.members["errors"] += [{"pointer": where, "detail": "Select fewer to make the answer smaller."}
                                  for where in work.fewer if where not in named]
        raise


def _check_answer(work: Work, limits: Limits) -> None:
    """The limits on the size of the answer: its weights, their picture, the numbers along the positions."""
    if work.weights:
        _check_copies(limits, "max_weight_elements", work.weights, work.copies, work.weights_where)
        if work.heatmap:  # the answer is their picture
            limits.check("max_heatmap_cells", work.weights, parameter="format")
    for along in work.along:
        if along.checked:
            _check_copies(limits, "max_output_elements", along.size, along.arrays, along.where)


def _check_copies(limits: Limits, name: str, size: int, copies: int, where: str) -> None:
    """``copies`` times ``size`` numbers against the limit ``name``, blaming ``where``. More than one copy is
    what trace=true asks for, so when one copy alone is within this limit, /trace is blamed too (only this
    limit: without the trace, another may still refuse the request)."""
    try:
        limits.check(name, size * copies, pointer=where)
    except LimitExceeded as exc:
        if copies > 1 and size <= getattr(limits, name):
            exc.members["errors"].append({"pointer": pointer("trace"), "detail": (
                f"trace=true counts {copies} x {size} numbers against {name}; without it, {size}.")})
        raise


def cost(work: Work) -> int:
    """A checked request's share of a batch's ``max_batch_elements``: every number it computes (weights,
    outputs, computed-only arrays, one per MACS_PER_UNIT multiply-adds) and RETURNED_EXTRA more for each number
    it returns: the answer is what takes a worker's memory. (Seeded weights: :func:`draws`.)"""
    weights = work.weights * work.copies
    along = sum(a.size * a.arrays for a in work.along if a.returned)
    inner = sum(a.size * a.arrays * a.repeat for a in work.along if not a.returned)
    returned = along + (weights if work.returns_weights else 0)
    return weights + along + inner + work.macs // MACS_PER_UNIT + RETURNED_EXTRA * returned


def draws(works: Iterable[Work]) -> int:
    """Random numbers drawn to build the seeded layers of a batch's items, once per distinct layer."""
    return sum(dict(work.draws for work in works if work.draws).values())

