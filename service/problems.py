"""The service's errors as RFC 9457 problems: the exceptions every layer raises, and their JSON.

No Flask, no werkzeug (the operations and gunicorn's hooks raise and write these too): the edge's handlers
(service.edge.errors) answer a :class:`Problem` as application/problem+json. marshmallow's nested error dicts
become ``errors: [{pointer, detail}]``.
"""

from __future__ import annotations

import functools
import http
import json
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "urn:attention-service:problem:"
VALIDATION = TYPE_BASE + "validation"
LIMIT_EXCEEDED = TYPE_BASE + "limit-exceeded"
MALFORMED_JSON = TYPE_BASE + "malformed-json"
UNKNOWN_TOKEN = TYPE_BASE + "unknown-token"


class Problem(Exception):
    """An error with an HTTP status (``code``), a problem ``type`` and extension members (``errors``, ``limit``...).

    Read as werkzeug's HTTPException is (``code``, ``name``, ``description``, ``get_headers``), so the edge
    answers both alike."""

    code = 500
    problem_type = "about:blank"

    def __init__(self, detail: str, *, problem_type: str | None = None, **members: Any) -> None:
        super().__init__(detail)
        self.description = detail
        if problem_type is not None:
            self.problem_type = problem_type
        self.members = {key: value for key, value in members.items() if value is not None}

    @property
    def name(self) -> str:
        """The status's reason phrase, the problem's title."""
        return http.HTTPStatus(self.code).phrase

    def get_headers(self) -> list[tuple[str, str]]:
        """Headers the answer carries besides its Content-Type (e.g. WWW-Authenticate)."""
        return []


class ValidationProblem(Problem):
    """422: the request is well-formed JSON but its content is invalid."""

    code = 422
    problem_type = VALIDATION

    @classmethod
    def at(cls, pointer: str, detail: str, **members: Any) -> ValidationProblem:
        """One error at a JSON pointer into the body."""
        return cls(detail, errors=[{"pointer": pointer, "detail": detail}], **members)


class LimitExceeded(ValidationProblem):
    """422: a shape is larger than a configured limit (served at GET /v1/limits)."""

    problem_type = LIMIT_EXCEEDED

    def __init__(self, name: str, value: int, maximum: int, *, pointer: str | None = None,
                 parameter: str | None = None) -> None:
        detail = f"{value} exceeds the limit {name}={maximum} (see GET /v1/limits)."
        item = {"pointer": pointer, "parameter": parameter, "detail": detail}
        super().__init__(detail, errors=[{k: v for k, v in item.items() if v is not None}],
                         limit={"name": name, "maximum": maximum, "value": value})


class InternalError(Problem):
    """500: a bug met while answering one item of many (the others keep their answers)."""

    code = 500


class MalformedJSON(Problem):
    """400: the body is not valid JSON (orjson: no NaN, no Infinity, UTF-8 only)."""

    code = 400
    problem_type = MALFORMED_JSON


@functools.lru_cache(maxsize=1024)  # the same few pointers are built for every request's limit checks
def pointer(*parts: str | int) -> str:
    """JSON Pointer (RFC 6901) from path parts: ``pointer("query", 0, 1) == "/query/0/1"``."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def flatten_messages(messages: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str, str]]:
    """(pointer, detail) pairs of a marshmallow error dict; ``_schema`` errors point at their parent.

    marshmallow nests at most as deep as the schema, plus the tensor field's index paths (bounded by
    the JSON depth limit), so the recursion is bounded.
    """
    if isinstance(messages, Mapping):
        for key, sub in messages.items():
            yield from flatten_messages(sub, path if key == "_schema" else (*path, key))
    elif isinstance(messages, list | tuple) and not all(isinstance(m, str) for m in messages):
        for sub in messages:
            yield from flatten_messages(sub, path)
    else:
        for message in [messages] if isinstance(messages, str) else messages:
            yield pointer(*path), str(message)


def invalid(messages: Any, root: tuple[str | int, ...] = (), *, query: bool = False) -> ValidationProblem:
    """422 from marshmallow error messages: one ``{pointer, detail}`` per message (rooted at ``root``),
    or ``{parameter, detail}`` for a query string."""
    errors = [{"parameter": where.lstrip("/"), "detail": detail} if query else {"pointer": where, "detail": detail}
              for where, detail in flatten_messages(messages, root)]
    summary = "; ".join(f"{error.get('pointer', error.get('parameter'))}: {error['detail']}" for error in errors)
    return ValidationProblem(f"The request is invalid: {summary}"[:500], errors=errors)


def problem_members(error: Exception) -> dict[str, Any]:
    """The problem object of a :class:`Problem` or a werkzeug HTTPException (read by their shared attributes):
    a batch item's ``error`` is exactly this."""
    code = getattr(error, "code", None) or 500
    name = getattr(error, "name", None) or http.HTTPStatus(code).phrase
    body = {"type": getattr(error, "problem_type", "about:blank"), "title": name, "status": code,
            "detail": getattr(error, "description", None) or name}
    return {**body, **getattr(error, "members", {})}


ARGUMENT_POINTERS = {name: pointer("weights", name) for name in ("w_q", "w_k", "w_v", "w_o")}


def attention_problem(error: ValueError) -> ValidationProblem:
    """The engine's ``AttentionError`` (bad argument shapes or values) as 422 pointing at the argument: the
    detail names it once ("n_heads: ..."), the error item's pointer names it and its detail does not repeat it."""
    argument = str(getattr(error, "argument", "") or "")
    where = ARGUMENT_POINTERS.get(argument, pointer(argument) if argument else "")
    item = getattr(error, "detail", None) if where else None
    return ValidationProblem(str(error), errors=[{"pointer": where, "detail": item or str(error)}])


def problem_bytes(status: int, title: str, detail: str, problem_type: str = "about:blank", **members: Any) -> bytes:
    """The problem object as JSON; members with value None are left out."""
    body = {"type": problem_type, "title": title, "status": status, "detail": detail}
    body.update({key: value for key, value in members.items() if value is not None})
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # an integer past 64 bits (e.g. a huge size echoed as a limit's value): stdlib json writes it
        return json.dumps(body).encode()
