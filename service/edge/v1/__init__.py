"""The /v1 API: one blueprint per area; the operations' routes are derived from the registry here, and so is
what each answers: JSON, or the heatmap of its weights (SVG), chosen by the Accept header (or ``?format``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import wraps
from typing import Any

from flask import Request, Response, request
from werkzeug.datastructures import MIMEAccept

from schemas.heatmap import FormatQuery, PictureQuery
from service.edge.context import current_limits
from service.edge.errors import NotAcceptable
from service.edge.examples import Computed
from service.edge.jsonio import JSON, parse_request
from service.edge.smorest import BODY_ERRORS, Blueprint
from service.edge.v1 import examples
from service.operations import pictures
from service.operations.registry import OPERATIONS, Operation
from service.problems import ValidationProblem, pointer
from service.settings import Limits

SVG = "image/svg+xml"
EVENTS = "text/event-stream"
STREAM_WRITE_SECONDS = 5  # a write blocked this long (a client that stopped reading) ends a stream
FORMATS = {"json": JSON, "svg": SVG}  # ?format= -> the media type it names
FORMAT_QUERY = FormatQuery()
CHARSET = re.compile(r'charset\s*=\s*"?([^";\s]+)', re.IGNORECASE)  # a media range's charset parameter


def svg_response(svg: str) -> Response:
    """An image/svg+xml answer."""
    return Response(svg, mimetype=SVG)


def events_response(events: Iterator[bytes]) -> Response:
    """A text/event-stream answer, each event sent as it comes: nginx passes it on at once (X-Accel-Buffering: no),
    and a write blocked STREAM_WRITE_SECONDS fails (the socket's timeout under gunicorn), so a client that stops
    reading is taken for gone: gunicorn closes the iterator, which stops the work, and the sync worker is free."""
    sock = request.environ.get("gunicorn.socket")
    if sock is not None:
        sock.settimeout(STREAM_WRITE_SECONDS)
    return Response(events, mimetype=EVENTS, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def events_doc(description: str) -> dict[str, Any]:
    """OpenAPI doc of a 200 answer that may be a stream of server-sent events."""
    return {"responses": {200: {"description": description, "content": {EVENTS: {"schema": {"type": "string"}}}}}}


def svg_doc(description: str, example: Computed | None = None) -> dict[str, Any]:
    """OpenAPI doc of a 200 answer that is an SVG image (with a real answer as ``example``)."""
    media = {"schema": {"type": "string"}, **({"example": example} if example else {})}
    return {"responses": {200: {"description": description, "content": {SVG: media}}}}


def negotiate(current: Request, offers: tuple[str, ...]) -> str:
    """The media type of ``offers`` (the server's preference first) that the request's Accept header prefers:
    werkzeug's MIMEAccept reads quality values and wildcards, the most specific range deciding (q=0: refused), and
    other parameters are set aside; a tie goes to the earlier offer. No Accept header (or one werkzeug cannot
    read): the first offer. None acceptable: 406 listing ``offers``."""
    header = current.headers.get("Accept")
    if not header or header == "*/*":  # most clients (curl, requests, httpx, fetch): no parse, ~10 us saved
        return offers[0]
    accept = current.accept_mimetypes
    if not accept:
        return offers[0]
    if any(";" in value for value, _ in accept):  # werkzeug would match parameters against the offers exactly
        accept = _without_parameters(accept)
    chosen = accept.best_match(offers)
    if chosen is None:
        raise NotAcceptable(header, offers)
    return chosen


def _without_parameters(accept: MIMEAccept) -> MIMEAccept:
    """The ranges with their media-type parameters set aside: every answer is UTF-8 and takes no other, so
    ``charset=utf-8`` (any case) matches and a range asking another charset is dropped."""
    ranges = []
    for value, quality in accept:
        media, _, parameters = value.partition(";")
        charset = CHARSET.search(parameters)
        if charset is None or charset.group(1).lower() in ("utf-8", "utf8"):
            ranges.append((media.strip(), quality))
    return MIMEAccept(ranges)


def negotiated(offers: tuple[str, ...], *, format_query: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: the view gets ``media``, what to answer among ``offers`` (see :func:`negotiate`), decided before
    its body is read; its answers say ``Vary: Accept``. ``format_query``: ``?format=json|svg`` narrows the offers to
    the one it names (422 for another value), and ``?color_scale=`` reaches the view (schemas.heatmap.FormatQuery)."""
    def wrap(func: Callable) -> Callable:
        @wraps(func)
        def view(*args: Any, **kwargs: Any) -> Any:
            current = request._get_current_object()  # the Request itself: see parse_request
            choices, picture = offers, {}
            if format_query and current.query_string:  # most requests send none: no parse
                query = parse_request(current, FORMAT_QUERY, "query")
                choices = (FORMATS[query["format"]],) if query["format"] else offers
                picture = {"color_scale": query["color_scale"]}
            response = func(*args, media=negotiate(current, choices), **picture, **kwargs)
            # the answer depends on the header: caches must key on it (views set no Vary; CORS merges into this one)
            response.headers.add("Vary", "Accept")
            return response

        return view

    return wrap


def draw(operation: Operation, params: dict[str, Any], limits: Limits, color_scale: str = "fixed") -> str:
    """The SVG heatmap of ``operation``'s weights for ``params`` on ``color_scale``: computed with the weights and
    nothing else (the picture's size is checked first, when the request is prepared)."""
    prepared = operation.prepare({**params, "return_weights": True, "trace": False, "format": "svg"}, limits)
    return pictures.compute_heatmap(operation.drawing, prepared.params, operation.compute(prepared), limits,
                                    color_scale)


def _documented_request(blp: Blueprint, operation: Operation, view: Callable) -> Callable:
    """``view`` parsing and documenting ``operation``'s request (body or query), its errors and its 404 for an
    unknown path parameter (a model)."""
    post = operation.method == "POST"
    errors = (*(BODY_ERRORS if post else (422,)), 406)
    errors = (*errors, 404) if "<" in operation.route else errors
    view = blp.documents(*errors)(view)
    request_example = {"example": operation.example} if post else {}
    return blp.arguments(operation.request(), location="json" if post else "query", **request_example)(view)


def operation_route(blp: Blueprint, operation: Operation) -> None:
    """Route ``operation`` (a registry entry) to: validate with its schema -> prepare, compute, round -> serialise.

    Its request example and the real answer to it are documented. An operation with a ``drawing`` also answers
    the heatmap of its weights (service.operations.pictures) to ``Accept: image/svg+xml`` or ``?format=svg``, and
    as an operation of its own, ``<route>/heatmap``: a generated client parses one media type per answer, so
    the picture has its own path in the spec and ``format`` is left out of it. Path parameters (``<model>``),
    resolved before the body is read (service.edge.v1.models), join the validated params.
    """
    offers = (JSON, SVG) if operation.drawing is not None else (JSON,)

    def view(params: dict[str, Any], media: str, color_scale: str = "fixed", **path: Any) -> Any:
        params = {**params, **path} if path else params
        if media == SVG:
            if params.get("stream"):
                raise ValidationProblem.at(pointer("stream"), "A picture is not streamed: ask for it without stream, "
                                                              "or stream the JSON events.")
            return svg_response(draw(operation, params, current_limits(), color_scale))
        if params.get("stream"):
            return events_response(operation.events(operation.prepare(params, current_limits())))
        return operation.answer(params, current_limits())

    view.__name__ = operation.name.replace("-", "_")
    view.__doc__ = operation.doc
    view = blp.response(200, operation.response, dump=False, example=examples.answer(operation))(view)
    if operation.drawing is not None:
        view = blp.doc(**svg_doc(f"The answer, or with `Accept: {SVG}` (or `?format=svg`) the heatmap of its "
                                 f"weights, as POST /v1{operation.route}/heatmap answers."))(view)
    if operation.events is not None:
        view = blp.doc(**events_doc("With `stream: true`, server-sent events: `token` (a step, as `steps` holds it) "
                                    "as each is computed, then `done` (the answer without `steps`), or `error` (a "
                                    "problem) if it fails midway."))(view)
    view = negotiated(offers, format_query=operation.drawing is not None)(_documented_request(blp, operation, view))
    blp.route(operation.route, methods=[operation.method])(view)
    if operation.drawing is not None:
        heatmap_route(blp, operation)


def heatmap_route(blp: Blueprint, operation: Operation) -> None:
    """Route ``<route>/heatmap`` of ``operation`` (one with a ``drawing``): its request, answered by the SVG
    heatmap of its weights only (the real picture of its example documented)."""
    summary = operation.doc.partition("\n")[0]

    def view(params: dict[str, Any], media: str, color_scale: str, **path: Any) -> Response:
        return svg_response(draw(operation, {**params, **path}, current_limits(), color_scale))

    view.__name__ = operation.name.replace("-", "_") + "_heatmap"
    drawn = ("its picture", "its own SVG picture (each part of its answer drawn, as its description says)") \
        if operation.drawing.picture else ("the heatmap of its weights", "the SVG heatmap of its attention weights "
                                           "(one panel per head, batch item or layer, labelled with the tokens when "
                                           "given)")
    view.__doc__ = (f"{summary.rstrip('.')}: {drawn[0]}.\n\nThe request of {operation.method} "
                    f"/v1{operation.route}, answered by {drawn[1]}, as that operation answers "
                    f"`Accept: {SVG}`; return_weights, trace and decimals do not apply. At most max_heatmap_cells "
                    "cells (see GET /v1/limits).")
    example = examples.computed(operation, lambda params, limits: draw(operation, params, limits))
    view = blp.doc(**svg_doc("The SVG heatmap of the weights.", example))(view)
    view = blp.arguments(PictureQuery(), location="query", as_kwargs=True)(view)
    view = negotiated((SVG,))(_documented_request(blp, operation, view))
    blp.route(operation.route + "/heatmap", methods=[operation.method])(view)


def operation_routes(blp: Blueprint, area: str) -> None:
    """Route every registry operation of ``area`` (its blueprint), in the registry's order."""
    for operation in OPERATIONS.values():
        if operation.area == area:
            operation_route(blp, operation)
