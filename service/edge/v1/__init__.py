"""The /v1 API: one blueprint per area, plus the helper that wires a compute endpoint."""

from __future__ import annotations

from typing import Any

from flask import Response
from marshmallow import Schema

from schemas.heatmap import FormatQuery
from service.edge.context import current_limits
from service.edge.jsonio import round_arrays
from service.edge.smorest import BODY_ERRORS, Blueprint
from service.edge.v1 import examples
from service.operations import compute, pictures

SVG = "image/svg+xml"


def svg_response(svg: str) -> Response:
    """An image/svg+xml answer."""
    return Response(svg, mimetype=SVG)


def svg_doc(description: str, example: str | None = None) -> dict[str, Any]:
    """OpenAPI doc of a 200 answer that is an SVG image (with a real answer as ``example``)."""
    media = {"schema": {"type": "string"}, **({"example": example} if example else {})}
    return {"responses": {200: {"description": description, "content": {SVG: media}}}}


def compute_route(blp: Blueprint, path: str, name: str, response: type[Schema], doc: str,
                  *, method: str = "POST", svg: bool = False) -> None:
    """Route ``path`` to: validate with the endpoint's schema -> ``compute_*`` -> round -> serialise.

    ``name`` is a key of :data:`service.compute.ENDPOINTS`; ``doc`` is the operation's docs
    (first line summary, then description). The request example and its real answer are documented.
    With ``svg``, ``?format=svg`` answers with the heatmap of the weights instead (service.pictures).
    """
    endpoint = compute.ENDPOINTS[name]

    def view(params: dict[str, Any], format: str = "json") -> Any:
        limits = current_limits()
        if format == "svg":  # the picture needs the weights, and nothing else; its size is checked first
            params = {**params, "return_weights": True, "trace": False, "format": "svg"}
            result = endpoint.compute(params, limits)
            return svg_response(pictures.compute_heatmap(name, params, result, limits))
        return round_arrays(endpoint.compute(params, limits), params.get("decimals"))

    view.__name__ = name.replace("-", "_")
    view.__doc__ = doc
    location = "json" if method == "POST" else "query"
    errors = BODY_ERRORS if method == "POST" else (422,)
    view = blp.documents(*errors)(view)
    view = blp.response(200, response, dump=False, example=examples.response(name))(view)
    request_example = {"example": examples.request(name)} if location == "json" else {}
    view = blp.arguments(endpoint.schema(), location=location, **request_example)(view)
    if svg:
        view = blp.doc(**svg_doc("The answer, or with format=svg the heatmap of its weights."))(view)
        view = blp.arguments(FormatQuery(), location="query", as_kwargs=True)(view)
    blp.route(path, methods=[method])(view)
