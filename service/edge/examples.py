"""Documented examples the service computes: its real answers to the documented requests, so the spec never shows
numbers the service would not return. A :class:`Computed` stands in the document where such an answer goes; only
``make openapi`` (service.edge.openapi) computes it, under the default limits and not counted in the metrics:
importing the app, creating it and serving the spec run no engine (the server serves the file: service.edge.spec).

Their numbers are written to SIGNIFICANT digits: the last digits of a float belong to the BLAS kernel of the
machine that computed it (a sum's order), and the file must not change with the machine that writes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from service.operations.jsontext import dumps
from service.runtime import metrics

SIGNIFICANT = 6
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")  # a decimal number inside a text (an SVG's data-value)


class Computed:
    """An example worked out when the spec is written: ``compute()`` gives it (None: left out, as the answer of a
    model that is not served)."""

    def __init__(self, compute: Callable[[], Any]) -> None:
        self.compute = compute

    def __deepcopy__(self, memo: dict) -> Computed:  # flask-smorest copies the docs it is given
        return self


def resolved(node: Any) -> Any:
    """``node`` (a document, or part of one) with each :class:`Computed` worked out, as plain JSON values (arrays as
    lists, float32 digits as written); an example that works out to None is left out."""
    if isinstance(node, dict):
        found = {key: resolved(value) for key, value in node.items()}
        return {key: value for key, value in found.items()
                if not (key == "example" and value is None and isinstance(node[key], Computed))}
    if isinstance(node, list):
        return [resolved(value) for value in node]
    if isinstance(node, Computed):
        with metrics.unrecorded():  # nobody's work
            return _short(orjson.loads(dumps(node.compute())))  # as the client reads it: arrays as lists
    return node


def _short(value: Any) -> Any:
    """``value`` with every float, and every decimal number in a text, to SIGNIFICANT digits."""
    if isinstance(value, dict):
        return {key: _short(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_short(item) for item in value]
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT}g}")
    if isinstance(value, str):
        return NUMBER.sub(_short_number, value)
    return value


def _short_number(match: re.Match) -> str:
    """A number written in a text, to SIGNIFICANT digits if it has more (the others stay as they are written)."""
    written = match.group()
    digits = re.sub(r"\D", "", re.split("[eE]", written)[0]).lstrip("0")
    return written if len(digits) <= SIGNIFICANT else repr(float(f"{float(written):.{SIGNIFICANT}g}"))
