"""RFC 9457 problem details for every error (application/problem+json).

Views raise :class:`ProblemError` subclasses (or werkzeug HTTP exceptions, or the engine's
``AttentionError``); the handlers registered by :func:`register_error_handlers` turn each into a
problem response. marshmallow's nested error dicts become ``errors: [{pointer, detail}]``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from flask import Flask, Response
from werkzeug.exceptions import HTTPException, InternalServerError

from service.observability import request_id

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "urn:attention-service:problem:"
VALIDATION = TYPE_BASE + "validation"
LIMIT_EXCEEDED = TYPE_BASE + "limit-exceeded"
MALFORMED_JSON = TYPE_BASE + "malformed-json"
UNKNOWN_TOKEN = TYPE_BASE + "unknown-token"

log = logging.getLogger(__name__)


class ProblemError(HTTPException):
    """An HTTP error carrying a problem ``type`` and extension members (``errors``, ``limit``, ...)."""

    problem_type = "about:blank"

    def __init__(self, detail: str, *, problem_type: str | None = None, **members: Any) -> None:
        super().__init__(description=detail)
        if problem_type is not None:
            self.problem_type = problem_type
        self.members = {key: value for key, value in members.items() if value is not None}


class ValidationProblem(ProblemError):
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


class MalformedJSON(ProblemError):
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


def problem_response(status: int, title: str, detail: str, problem_type: str = "about:blank",
                     headers: Mapping[str, str] | None = None, **members: Any) -> Response:
    """An application/problem+json response; members with value None are left out.

    ``request_id`` (the X-Request-Id) is added to every problem answered during a request (a batch
    item's problem, inside a 200 answer, has none: the batch answer's header carries it).
    """
    members.setdefault("request_id", request_id())
    response = Response(problem_bytes(status, title, detail, problem_type, **members), status=status,
                        mimetype=PROBLEM_JSON)
    response.headers.update(headers or {})
    return response


def problem_bytes(status: int, title: str, detail: str, problem_type: str = "about:blank", **members: Any) -> bytes:
    """The problem object as JSON; members with value None are left out. (Also what gunicorn.conf.py writes
    for the requests gunicorn's parser refuses before the app sees them.)"""
    body = {"type": problem_type, "title": title, "status": status, "detail": detail}
    body.update({key: value for key, value in members.items() if value is not None})
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # an integer past 64 bits (e.g. a huge size echoed as a limit's value): stdlib json writes it
        return json.dumps(body).encode()


def problem_body(error: HTTPException) -> dict[str, Any]:
    """The problem object of an HTTPException (a batch item's ``error`` is exactly this)."""
    body = {"type": getattr(error, "problem_type", "about:blank"), "title": error.name,
            "status": error.code or 500, "detail": error.description or error.name}
    return {**body, **getattr(error, "members", {})}


def handle_http_exception(error: HTTPException) -> Response:
    """Any werkzeug HTTPException (404, 405, 413, 415, ProblemError, ...) as a problem."""
    headers = {k: v for k, v in error.get_headers() if k.lower() != "content-type"}
    members = problem_body(error)
    return problem_response(members.pop("status"), members.pop("title"), members.pop("detail"), members.pop("type"),
                            headers, **members)


def handle_unexpected(error: Exception) -> Response:
    """An uncaught exception: log it, answer 500 without internals."""
    if isinstance(error, HTTPException):
        return handle_http_exception(error)
    log.exception("unhandled error", exc_info=error)
    return handle_http_exception(InternalServerError("The server failed to answer; this is a bug."))


def register_error_handlers(app: Flask) -> None:
    """Problem responses for HTTP errors, the engine's argument errors and anything unexpected."""
    from attention import AttentionError  # the engine's argument errors are the client's fault

    app.register_error_handler(HTTPException, handle_http_exception)
    app.register_error_handler(AttentionError, handle_attention_error)
    app.register_error_handler(Exception, handle_unexpected)


ARGUMENT_POINTERS = {name: pointer("weights", name) for name in ("w_q", "w_k", "w_v", "w_o")}


def attention_problem(error: ValueError) -> ValidationProblem:
    """The engine's ``AttentionError`` (bad argument shapes or values) as 422 pointing at the argument."""
    argument = str(getattr(error, "argument", "") or "")
    where = ARGUMENT_POINTERS.get(argument, pointer(argument) if argument else "")
    return ValidationProblem.at(where, str(error))


def handle_attention_error(error: ValueError) -> Response:
    """An ``AttentionError`` raised by a view: see :func:`attention_problem`."""
    return handle_http_exception(attention_problem(error))
