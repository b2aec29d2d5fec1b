"""v2 errors as the protocol wants them: ``{"error": "<message>"}`` with HTTP 400 (404 for an unknown
model, 413 for a body over max_body_bytes).

The v2 blueprint registers these handlers, so the shared v1 code it reuses (limits, casts, the
engine's argument checks) raises its usual errors and they are re-worded here, naming the v2 input
or parameter. 5xx stay RFC 9457 problems (the documented ``default`` response: a bug).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from flask import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from service.edge import errors as problems
from service.operations.jsontext import dumps
from service.problems import Problem

if TYPE_CHECKING:
    from attention.errors import AttentionError

V2_NAMES = {"n_heads": "parameter 'num_heads'"}  # v1 field -> its v2 name, where they differ
INPUTS = ("query", "key", "value", "mask", "embeddings", "text")
KEPT_STATUSES = (404, 405, 413)  # everything else a client did wrong is 400
# The protocol's optional /versions/<v> segment (tritonclient sends it when given a model_version).
VERSIONED = re.compile(r"/v2/models/(?P<model>[^/]+)/versions/(?P<version>[^/]+)(?P<rest>/ready|/infer)?")


class ProtocolError(HTTPException):
    """400: the inference request breaks the protocol or the model's input rules."""

    code = 400


class UnknownModel(ProtocolError):
    """404: no model of that name."""

    code = 404


def error_response(status: int, message: str) -> Response:
    """A protocol error body: ``{"error": message}``."""
    return Response(dumps({"error": message}), status=status, mimetype="application/json")


def describe(pointer: str) -> str:
    """The v2 name of what a v1 JSON Pointer points at: ``/query`` -> ``input 'query'``, ``/text/2`` -> ``input
    'text' element 2`` (an input's element; a parameter's index is its value's, in the message)."""
    name, _, element = pointer.removeprefix("/").partition("/")
    if not name:
        return "request"
    if name in INPUTS:
        return f"input '{name}'" + (f" element {element}" if element.isdigit() else "")
    return V2_NAMES.get(name) or f"parameter '{name}'"


def message(error: problems.HTTPError) -> str:
    """The error's text; a validation problem names each input or parameter it points at."""
    items = getattr(error, "members", {}).get("errors")
    if items:
        return "; ".join(f"{describe(item.get('pointer', ''))}: {item['detail']}" for item in items)
    return error.description or error.name


def handle_http_exception(error: problems.HTTPError) -> Response:
    """Client errors as protocol errors; server errors as problems (they are bugs)."""
    if error.code is None or error.code >= 500:
        return problems.handle_http_exception(error)
    response = error_response(error.code if error.code in KEPT_STATUSES else 400, message(error))
    response.headers.update({k: v for k, v in error.get_headers() if k.lower() != "content-type"})  # e.g. Allow
    return response


def handle_unrouted(error: HTTPException) -> Response:
    """App-wide: a path under /v2 that matches no route (404), or no method (405), is a protocol error
    too. Blueprint handlers never see these (no route, so no blueprint); everything else stays a problem."""
    if request.blueprint is None and (request.path == "/v2" or request.path.startswith("/v2/")):
        if error.code == 404 and (versioned := VERSIONED.fullmatch(request.path)):
            return error_response(404, f"Models are not versioned here: use /v2/models/{versioned['model']}"
                                       f"{versioned['rest'] or ''} (without /versions/{versioned['version']}).")
        return handle_http_exception(error)
    return problems.handle_http_exception(error)


def handle_attention_error(error: AttentionError) -> Response:
    """The engine's argument errors (shapes that do not fit together), naming the input."""
    return error_response(400, f"{describe('/' + error.argument)}: {error.detail}")


def register(blp: Blueprint) -> None:
    """Answer errors raised in ``blp``'s views in the protocol's form."""
    from attention.errors import AttentionError

    blp.register_error_handler(HTTPException, handle_http_exception)
    blp.register_error_handler(Problem, handle_http_exception)
    blp.register_error_handler(AttentionError, handle_attention_error)
    # Replaces the app's problem handler for HTTPException (registered earlier, by the Api), and
    # delegates back to it for everything that is not under /v2.
    blp.app_errorhandler(HTTPException)(handle_unrouted)
