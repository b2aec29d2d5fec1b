"""Documented examples: each operation's request (from the registry) and its real answer, computed by the
service itself, so the spec can never show numbers the service would not return."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from service.operations.catalogue import ModelNotFound
from service.operations.jsontext import dumps
from service.operations.limits import Limits
from service.operations.registry import OPERATIONS, Operation
from service.operations.rounding import round_arrays
from service.runtime import metrics

# Every operation's, and a batch of other examples plus an item with a typo (it alone gets a 422).
REQUESTS = {name: operation.example for name, operation in OPERATIONS.items()}
REQUESTS["batch"] = {"requests": [
    {"id": "lookup", "op": "attention", "body": OPERATIONS["attention"].example},
    {"id": "typo", "op": "embed", "body": {"tokens": ["cat", "dgo"]}},
    {"id": "causal", "op": "self-attention", "body": OPERATIONS["self-attention"].example},
    {"id": "pe", "op": "positional-encoding", "body": OPERATIONS["positional-encoding"].example},
]}


def request(name: str) -> dict[str, Any]:
    """The documented request of operation ``name`` (a body, or the query string of a GET), or of the batch."""
    return REQUESTS[name]


def computed(operation: Operation, compute: Callable[[dict[str, Any], Limits], Any]) -> Any:
    """``compute(params, limits)`` of ``operation``'s example (its path parameters from ``path_example``) under the
    default limits, not counted in the metrics; None when the example's model is not served (ATTENTION_MODELS
    without the default)."""
    params = {**operation.request().load(operation.example), **operation.path_example}
    try:
        with metrics.unrecorded():
            return compute(params, Limits())
    except ModelNotFound:
        return None


def answer(operation: Operation) -> dict[str, Any] | None:
    """The service's real answer to ``operation``'s example, as plain JSON values (see :func:`computed`)."""
    return computed(operation, lambda params, limits: as_json(round_arrays(operation.compute(params, limits),
                                                                           params.get("decimals"))))


def as_json(value: Any) -> Any:
    """``value`` as the client reads it (arrays as lists, float32 digits as written)."""
    return orjson.loads(dumps(value))
