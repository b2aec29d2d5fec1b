"""The endpoints a batch may name: every POST compute endpoint of /v1 that /v1/batch also takes (the registry's
``batch_request``), a trained model's once per served model; and OpenAI's /v1/chat/completions, the most common
line of a real batch file (its lines translated to the generate op: service.operations.chat)."""

from __future__ import annotations

from typing import Any

from service.operations import catalogue
from service.operations.registry import BATCH_OPERATIONS

CHAT = "chat-completions"  # not a registry op: its lines are generate items (service.jobs.chunks)
CHAT_URL = "/v1/chat/completions"


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
    found[CHAT_URL] = (CHAT, {})
    return found
