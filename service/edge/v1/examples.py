"""The documented requests of /v1 (each operation's, from the registry, and a batch of them) and the service's real
answers to them, worked out when the spec is written (service.edge.examples)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.edge.examples import Computed
from service.operations.catalogue import ModelNotFound
from service.operations.registry import OPERATIONS, Operation
from service.settings import Limits

# Every operation's, and a batch of other examples plus an item with a typo (it alone gets a 422).
REQUESTS = {name: operation.example for name, operation in OPERATIONS.items()}
REQUESTS["batch"] = {"requests": [
    {"id": "lookup", "op": "attention", "body": OPERATIONS["attention"].example},
    {"id": "typo", "op": "embed", "body": {"tokens": ["cat", "dgo"]}},
    {"id": "causal", "op": "self-attention", "body": OPERATIONS["self-attention"].example},
    {"id": "pe", "op": "positional-encoding", "body": OPERATIONS["positional-encoding"].example},
]}

# POST /v1/chat/completions (not a registry operation: a translation of generate's, service.operations.chat).
REQUESTS["completions"] = {"model": "smollm2-135m-instruct", "temperature": 0, "max_completion_tokens": 8,
                           "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def request(name: str) -> dict[str, Any]:
    """The documented request of operation ``name`` (a body, or the query string of a GET), or of the batch."""
    return REQUESTS[name]


def computed(operation: Operation, compute: Callable[[dict[str, Any], Limits], Any]) -> Computed:
    """``compute(params, limits)`` of ``operation``'s example (its path parameters from ``path_example``) under the
    default limits; None when the example's model is not served (ATTENTION_MODELS without the default)."""
    def work() -> Any:
        try:
            params = operation.resolved({**operation.request().load(operation.example), **operation.path_example})
        except ModelNotFound:
            return None
        return compute(params, Limits())

    return Computed(work)


def answer(operation: Operation) -> Computed:
    """The service's real answer to ``operation``'s example (see :func:`computed`)."""
    return computed(operation, operation.answer)
