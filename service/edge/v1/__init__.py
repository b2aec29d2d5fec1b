"""The /v1 API: one blueprint per area; the operations' routes are derived from the registry here."""

from __future__ import annotations

from typing import Any

from flask import Response

from schemas.heatmap import FormatQuery
from service.edge.context import current_limits
from service.edge.jsonio import round_arrays
from service.edge.smorest import BODY_ERRORS, Blueprint
from service.edge.v1 import examples
from service.operations import pictures
from service.operations.registry import OPERATIONS, Operation

SVG = "image/svg+xml"


def svg_response(svg: str) -> Response:
    """An image/svg+xml answer."""
    return Response(svg, mimetype=SVG)


def svg_doc(description: str, example: str | None = None) -> dict[str, Any]:
    """OpenAPI doc of a 200 answer that is an SVG image (with a real answer as ``example``)."""
    media = {"schema": {"type": "string"}, **({"example": example} if example else {})}
    return {"responses": {200: {"description": description, "content": {SVG: media}}}}


def operation_route(blp: Blueprint, operation: Operation) -> None:
    """Route ``operation`` (a registry entry) to: validate with its schema -> compute -> round -> serialise.

    Its request example and the real answer to it are documented. An operation with a ``drawing`` answers
    ``?format=svg`` with the heatmap of its weights instead (service.operations.pictures). Path parameters
    (``<model>``) join the validated params.
    """
    def view(params: dict[str, Any], format: str = "json", color_scale: str = "fixed", **path: Any) -> Any:
        limits = current_limits()
        params = {**params, **path} if path else params
        if format == "svg":  # the picture needs the weights, and nothing else; its size is checked first
            params = {**params, "return_weights": True, "trace": False, "format": "svg"}
            result = operation.compute(params, limits)
            return svg_response(pictures.compute_heatmap(operation.drawing, params, result, limits, color_scale))
        return round_arrays(operation.compute(params, limits), params.get("decimals"))

    view.__name__ = operation.name.replace("-", "_")
    view.__doc__ = operation.doc
    location = "json" if operation.method == "POST" else "query"
    errors = BODY_ERRORS if operation.method == "POST" else (422,)
    errors = (*errors, 404) if "<" in operation.route else errors  # an unknown path parameter (a model)
    view = blp.documents(*errors)(view)
    view = blp.response(200, operation.response, dump=False, example=examples.answer(operation))(view)
    request_example = {"example": operation.example} if location == "json" else {}
    view = blp.arguments(operation.request(), location=location, **request_example)(view)
    if operation.drawing is not None:
        view = blp.doc(**svg_doc("The answer, or with format=svg the heatmap of its weights."))(view)
        view = blp.arguments(FormatQuery(), location="query", as_kwargs=True)(view)
    blp.route(operation.route, methods=[operation.method])(view)


def operation_routes(blp: Blueprint, area: str) -> None:
    """Route every registry operation of ``area`` (its blueprint), in the registry's order."""
    for operation in OPERATIONS.values():
        if operation.area == area:
            operation_route(blp, operation)
