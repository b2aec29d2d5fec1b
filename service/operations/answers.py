"""Many v1 requests answered at once, each exactly as its single endpoint would answer it. No Flask here:
POST /v1/batch (service.edge.v1.batch) and the batch jobs' workers (service.jobs) both answer through it.

Order, per item: its body loaded with its endpoint's schema (a 422 of its own), prepared as alone (its model
resolved, sized and checked against the limits: a 4xx of its own), then the prepared items computed together
(service.operations.batching) and each answer rounded as its endpoint rounds. A refused item never affects the
others. Pointers in an item's problem are prefixed with ``root(index)``: ``/requests/3/body/query/0`` in /v1/batch,
``/query/0`` (relative to the body) in a job's error file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from marshmallow import Schema, ValidationError

from attention.errors import AttentionError
from service.operations import batching, sizes
from service.operations.inputs import Prepared
from service.operations.registry import BATCH_OPERATIONS
from service.operations.rounding import round_arrays
from service.problems import InternalError, Problem, attention_problem, invalid, pointer
from service.settings import Limits

log = logging.getLogger(__name__)
Root = Callable[[int], tuple[str | int, ...]]  # item index -> the path parts of its body
# One instance per op, reused: loading keeps no state between calls.
REQUESTS: dict[str, Schema] = {name: op.batch_request() for name, op in BATCH_OPERATIONS.items()}


@dataclass(frozen=True)
class Sized:
    """An item within its own limits: where it is, its request prepared, and what it costs
    (service.operations.sizes)."""

    index: int
    op: str
    prepared: Prepared
    cost: int


def size(items: Sequence[tuple[str, Any]], limits: Limits, root: Root) -> tuple[list[Problem | None], list[Sized]]:
    """``(op, body)`` items loaded and sized: a problem per refused item (None for the others), and the others."""
    refused: list[Problem | None] = [None] * len(items)
    sized = []
    for index, (op, body) in enumerate(items):
        operation = BATCH_OPERATIONS[op]
        try:
            params = REQUESTS[op].load(body)
        except ValidationError as error:  # its detail names the pointers from the root too
            refused[index] = invalid(error.messages, root(index))
            continue
        try:  # as its single endpoint would: a 4xx of its own, counting nothing
            prepared = operation.prepare(operation.resolved(params), limits)
        except Problem as error:
            refused[index] = rooted(root(index), error)
        else:
            sized.append(Sized(index, op, prepared, sizes.cost(prepared.work)))
    return refused, sized


def compute(sized: Sequence[Sized], root: Root) -> Iterator[tuple[int, dict[str, Any] | Problem]]:
    """``(index, answer or problem)`` of each sized item, computed together (service.operations.batching)."""
    results = batching.run([(item.op, item.prepared) for item in sized])
    for item, result in zip(sized, results, strict=True):
        if isinstance(result, Exception):
            yield item.index, rooted(root(item.index), result)
        else:  # rounded, exactly as the single endpoint does
            yield item.index, round_arrays(result, item.prepared.params.get("decimals"))


def budgets(sized: Sequence[Sized], maximum: int) -> Iterator[list[Sized]]:
    """``sized`` in consecutive runs that each cost at most ``maximum`` (counting the random weights their seeded
    layers draw once per distinct layer, as /v1/batch does); an item past it alone runs alone (it is within its
    endpoint's limits)."""
    run: list[Sized] = []
    cost, drawn = 0, {}  # the run's: units of work, and each distinct seeded layer's draws
    for item in sized:
        draws = item.prepared.work.draws
        more = dict([draws]) if draws and draws[0] not in drawn else {}
        if run and cost + item.cost + sum(drawn.values()) + sum(more.values()) > maximum:
            yield run
            run, cost, drawn = [], 0, {}
            more = dict([draws]) if draws else {}
        run.append(item)
        cost += item.cost
        drawn.update(more)
    if run:
        yield run


def rooted(root: tuple[str | int, ...], error: Exception) -> Problem:
    """A compute error as the problem its single endpoint would answer, its pointers prefixed with ``root``.

    A query parameter (positional-encoding's limits) is a body member here, so it gets a pointer.
    """
    if isinstance(error, AttentionError):
        error = attention_problem(error)
    elif not isinstance(error, Problem):
        log.error("unhandled error in the item at %s", pointer(*root), exc_info=error)
        return InternalError("The server failed to answer this item; this is a bug.")
    if "errors" in error.members:
        prefix = pointer(*root)
        error.members["errors"] = [
            {"pointer": prefix + (e["pointer"] if "pointer" in e else pointer(e["parameter"])), "detail": e["detail"]}
            for e in error.members["errors"]]
    return error
