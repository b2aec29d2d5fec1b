"""The /v1 API: one blueprint per area, plus the helper that wires a compute endpoint."""

from __future__ import annotations

from typing import Any

from flask import current_app
from marshmallow import Schema

from service import compute
from service.api import examples
from service.jsonio import round_arrays
from service.smorest import BODY_ERRORS, Blueprint


def current_limits() -> compute.Limits:
    """The limits of the running app (see service.limits)."""
    return current_app.extensions["limits"]


def compute_route(blp: Blueprint, path: str, name: str, response: type[Schema], doc: str,
                  *, method: str = "POST") -> None:
    """Route ``path`` to: validate with the endpoint's schema -> ``compute_*`` -> round -> serialise.

    ``name`` is a key of :data:`service.compute.ENDPOINTS`; ``doc`` is the operation's docs
    (first line summary, then description). The request example and its real answer are documented.
    """
    endpoint = compute.ENDPOINTS[name]

    def view(params: dict[str, Any]) -> Any:
        return round_arrays(endpoint.compute(params, current_limits()), params.get("decimals"))

    view.__name__ = name.replace("-", "_")
    view.__doc__ = doc
    location = "json" if method == "POST" else "query"
    errors = BODY_ERRORS if method == "POST" else (422,)
    view = blp.documents(*errors)(view)
    view = blp.response(200, response, example=examples.response(name))(view)
    request_example = {"example": examples.request(name)} if location == "json" else {}
    view = blp.arguments(endpoint.schema, location=location, **request_example)(view)
    blp.route(path, methods=[method])(view)
