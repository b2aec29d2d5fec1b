"""Problem responses (RFC 9457, application/problem+json) for every error a view raises.

Views raise :class:`service.problems.Problem` subclasses (or werkzeug HTTP exceptions, or the engine's
``AttentionError``); the handlers registered by :func:`register_error_handlers` turn each into a problem response.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response
from werkzeug.exceptions import HTTPException, InternalServerError

from service.edge.observability import request_id
from service.problems import PROBLEM_JSON, Problem, attention_problem, problem_bytes, problem_members

log = logging.getLogger(__name__)
HTTPError = HTTPException | Problem  # what a view raises for a 4xx: both are answered alike


class NotAcceptable(Problem):
    """406: the request's Accept header allows none of the media types the operation answers, which the problem
    lists in ``acceptable`` (the server's preference first)."""

    code = 406

    def __init__(self, accept: str, offers: tuple[str, ...]) -> None:
        detail = (f"The Accept header {accept[:200]!r} allows none of the media types this operation answers: "
                  f"{', '.join(offers)}.")
        super().__init__(detail, errors=[{"header": "Accept", "detail": detail}], acceptable=list(offers))

    def get_headers(self) -> list[tuple[str, str]]:
        return [("Vary", "Accept")]  # another Accept may get another answer


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


def handle_http_exception(error: HTTPError) -> Response:
    """Any werkzeug HTTPException (404, 405, 413, 415, ...) or Problem as a problem."""
    headers = {k: v for k, v in error.get_headers() if k.lower() != "content-type"}
    members = problem_members(error)
    return problem_response(members.pop("status"), members.pop("title"), members.pop("detail"), members.pop("type"),
                            headers, **members)


def handle_unexpected(error: Exception) -> Response:
    """An uncaught exception: log it, answer 500 without internals."""
    if isinstance(error, HTTPException | Problem):
        return handle_http_exception(error)
    log.exception("unhandled error", exc_info=error)
    return handle_http_exception(InternalServerError("The server failed to answer; this is a bug."))


def register_error_handlers(app: Flask) -> None:
    """Problem responses for HTTP errors, the engine's argument errors and anything unexpected."""
    from attention.errors import AttentionError  # the engine's argument errors are the client's fault

    app.register_error_handler(HTTPException, handle_http_exception)
    app.register_error_handler(Problem, handle_http_exception)
    app.register_error_handler(AttentionError, handle_attention_error)
    app.register_error_handler(Exception, handle_unexpected)


def handle_attention_error(error: ValueError) -> Response:
    """An ``AttentionError`` raised by a view: see :func:`attention_problem`."""
    return handle_http_exception(attention_problem(error))
