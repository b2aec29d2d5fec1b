"""Documented examples: small requests, and their real answers computed by the service itself.

The answers are produced by validating the example with the endpoint's schema and running its
compute function, so the spec can never show numbers the service would not return.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson

from service.edge.jsonio import dumps, round_arrays
from service.operations import compute
from service.operations.limits import Limits
from service.runtime import metrics

SENTENCE = ["the", "cat", "ate", "food", "it"]

REQUESTS: dict[str, dict[str, Any]] = {
    "attention": {
        "query": [[0.0, 0.0, 0.0, 1.0]],
        "key": [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
        "value": [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
        "decimals": 4,
    },
    "self-attention": {"tokens": ["cat", "ate", "food"], "positional_encoding": True, "causal": True,
                       "seed": 3, "decimals": 4},
    "multi-head-attention": {"tokens": SENTENCE, "d_model": 8, "n_heads": 4, "positional_encoding": True,
                             "causal": True, "decimals": 3},
    "encoder": {"tokens": ["cat", "ate", "food"], "d_model": 8, "n_heads": 2, "n_layers": 2, "decimals": 3},
    "embed": {"tokens": ["cat", "it"], "d_model": 6, "positional_encoding": True, "decimals": 4},
    "positional-encoding": {"n_positions": 3, "d_model": 4, "decimals": 4},
    "causal-mask": {"size": 3},
}
# A batch of other examples, plus an item with a typo (it alone gets a 422).
REQUESTS["batch"] = {"requests": [
    {"id": "lookup", "op": "attention", "body": REQUESTS["attention"]},
    {"id": "typo", "op": "embed", "body": {"tokens": ["cat", "dgo"]}},
    {"id": "causal", "op": "self-attention", "body": REQUESTS["self-attention"]},
    {"id": "pe", "op": "positional-encoding", "body": REQUESTS["positional-encoding"]},
]}


def request(name: str) -> dict[str, Any]:
    """The documented request of endpoint ``name`` (a body, or the query string of a GET)."""
    return REQUESTS[name]


@cache
def response(name: str) -> dict[str, Any]:
    """The service's real answer to :func:`request` (plain JSON values)."""
    endpoint = compute.ENDPOINTS[name]
    params = endpoint.schema().load(REQUESTS[name])
    with metrics.unrecorded():
        return as_json(round_arrays(endpoint.compute(params, Limits()), params.get("decimals")))


def as_json(value: Any) -> Any:
    """``value`` as the client reads it (arrays as lists, float32 digits as written)."""
    return orjson.loads(dumps(value))
