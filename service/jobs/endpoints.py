"""The endpoints a batch may name: every POST compute endpoint of /v1 that /v1/batch also takes (the registry's
``batch_request``), a trained model's once per served model."""

from __future__ import annotations

from typing import Any

from service.operations import catalogue
from service.operations.registry import BATCH_OPERATIONS


def endpoints() -> dict[str, tuple[str, dict[str, Any]]]:
    """URL -> (the op, the path's parameters, which join its body as a /v1/batch item's do)."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, operation in BATCH_OPERATIONS.items():
        if operation.method != "POST":
            continue
        if "<model>" in operation.route:
            for model in catalogue.names():
                found["/v1" + operation.route.replace("<model>", model)] = (name, {"model": model})
        else:
            found["/v1" + operation.route] = (name, {})
    return found
