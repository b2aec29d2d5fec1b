"""flask-smorest, adapted: problem+json errors, lean request-time decorators, tensor fields in the spec.

The Api is set up through flask-smorest's and apispec's public hooks (:func:`init_api`). The Blueprint's decorators
are the one place the service reaches past flask-smorest: at request time one wrapper parses and one writes the
answer, where flask-smorest's own wrap a view once per decorator and parse through webargs; each hands flask-smorest
the doc its own would, in the view's ``_apidoc``. Kept for the figure in docs/architecture.md (~6% of the
requests/s of a demo request); tests/unit/test_library_surface.py checks the ``_apidoc`` it relies on.
``Blueprint.documents(...)`` documents the error responses of a view once, by stable names
(the names of ``http.HTTPStatus`` members change between Python versions).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from importlib.metadata import version
from typing import Any

import flask_smorest
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Flask, Response, current_app, request
from flask_smorest.utils import (
    resolve_schema_instance,
    set_status_and_headers_in_response,
    unpack_tuple_response,
)
from marshmallow import Schema

from schemas.batch import AnyOfSchemas
from schemas.problem import Problem
from schemas.tensor import Tensor
from service.edge.errors import register_error_handlers
from service.edge.jsonio import JSON, dumps, parse_request
from service.problems import PROBLEM_JSON

PACKAGE = "attention-service"
VERSION = version(PACKAGE)  # the one version (pyproject's): the spec's info.version and GET /v2's

ERROR_RESPONSES = {
    400: ("MalformedJSON", "The body is not valid JSON, or it ended before its Content-Length."),
    404: ("NotFound", "No such resource."),
    405: ("MethodNotAllowed", "The path exists but not with this method (see the Allow header)."),
    406: ("NotAcceptable", "The Accept header allows none of the media types the operation answers: "
                           "`acceptable` lists them."),
    409: ("Conflict", "The resource's state does not allow this now (the detail says why)."),
    413: ("ContentTooLarge", "The body is larger than max_body_bytes (see GET /v1/limits)."),
    415: ("UnsupportedMediaType", "The body is not application/json, or it is compressed (Content-Encoding), or it "
                                  "is not UTF-8 and declares another charset."),
    422: ("Invalid", "Invalid request: `errors` points at each problem; `limit` names an exceeded limit."),
    503: ("NotReady", "The engine failed its self-test."),
}
BODY_ERRORS = (400, 413, 415, 422)
# OpenAI's contract (/v1/chat/completions) answers every invalid request with a 400, its own shared response.
OPENAI_INVALID = "InvalidOpenAIRequest"
OPENAI_INVALID_TEXT = ("The body is not valid JSON, or a parameter is invalid or unsupported (n > 1, tools, "
                       "response_format, logit_bias, penalties, an encoder): a problem naming it, with OpenAI's "
                       "`error` object (`param`, `code`) beside it; a 400, not a 422, as OpenAI's clients expect.")
# What every batch-jobs operation may answer besides its own errors (service/edge/v1/jobsgate.py).
JOBS_RESPONSES = {
    501: ("JobsNotServed", "Batch jobs are not served by this deployment (ATTENTION_BATCH_JOBS=0, as a KServe "
                           "predictor): the detail says where they run."),
    503: ("QueueUnavailable", "The batch jobs' queue and records did not answer in time: try again after "
                              "`Retry-After` seconds."),
}


def tensor2properties(self: Any, field: Any, **kwargs: Any) -> dict[str, Any]:
    """apispec attribute function: a :class:`Tensor` field is documented as nested arrays."""
    if not isinstance(field, Tensor):
        return {}
    schema = field.json_schema()
    if field.allow_none:
        schema = {"anyOf": [schema, {"type": "null"}]}
    description = field.metadata.get("description") or (f"Shape {field.shape}." if field.shape else None)
    return {**schema, "description": description} if description else schema


def _required(schema: type[Schema]) -> int:
    return sum(field.required for field in schema().fields.values())


def anyof2properties(self: Any, field: Any, **kwargs: Any) -> dict[str, Any]:
    """apispec attribute function: an :class:`AnyOfSchemas` field is ``anyOf`` references to its schemas, those
    with more required members first: a generated client takes the first alternative that parses (an
    openapi-python-client one read a model's answer in a batch as an encoder's, its tokens dropped), so a
    schema goes before every one whose required members are a subset of its own."""
    if not isinstance(field, AnyOfSchemas):
        return {}
    ordered = sorted(field.schemas, key=_required, reverse=True)  # stable: ties keep the registry's order
    return {"anyOf": [self.resolve_nested_schema(schema) for schema in ordered]}


class Api(flask_smorest.Api):
    """The service's Api: one problem schema for every error (its documented ``ERROR_SCHEMA``), the unexpected one
    documented as ``Error`` (``DEFAULT_ERROR_RESPONSE_NAME``)."""

    ERROR_SCHEMA = Problem
    DEFAULT_ERROR_RESPONSE_NAME = "Error"


def _documented(func: Callable, documenting: Callable[[Callable], Callable]) -> Callable:
    """``func`` carrying the OpenAPI doc that a flask-smorest decorator would add, without the
    per-request wrapper that decorator puts around it."""
    func._apidoc = documenting(func)._apidoc
    return func


class Blueprint(flask_smorest.Blueprint):
    """flask-smorest's Blueprint with the same decorators and the same OpenAPI document, but lean
    at request time: one wrapper parses, one serialises, and doc-only decorators add no call at all
    (flask-smorest wraps a view once per decorator and parses through webargs, on every
    request). Error statuses are documented by :meth:`documents`.
    """

    def arguments(self, schema: Schema | type[Schema], *, location: str = "json", as_kwargs: bool = False,
                  precheck: Callable[[Any], None] | None = None, **doc: Any) -> Callable:
        """The request's ``location`` (json or query) loaded by ``schema`` and passed to the view
        (positionally, or as keyword arguments with ``as_kwargs``); see :func:`parse_request`.
        ``doc``: what flask-smorest documents (example, examples, description, required)."""
        if location not in ("json", "query"):
            raise ValueError(f"location {location!r}: only 'json' and 'query' are parsed here")
        if unknown := set(doc) - {"example", "examples", "description", "required"}:
            raise TypeError(f"not documented nor applied here: {sorted(unknown)}")
        schema = resolve_schema_instance(schema)  # one instance, reused by every request
        documenting = super().arguments(schema, location=location, as_kwargs=as_kwargs, **doc)

        def wrap(func: Callable) -> Callable:
            @wraps(func)
            def view(*args: Any, **view_kwargs: Any) -> Any:
                current = request._get_current_object()  # the Request itself: see parse_request
                params = parse_request(current, schema, location, precheck)
                return func(*args, **view_kwargs, **params) if as_kwargs else func(*args, params, **view_kwargs)

            view._apidoc = documenting(func)._apidoc
            view._apidoc["arguments"].pop("responses", None)  # by HTTPStatus name: see documents()
            return view

        return wrap

    def response(self, status_code: int, schema: Schema | type[Schema] | None = None, *, dump: bool = True,
                 **kwargs: Any) -> Callable:
        """The view's result dumped by ``schema`` and written as JSON with ``status_code``; a view may
        also return ``(result, status)`` or a ready Response. ``dump=False``: the schema only documents
        the answer, the result is written as it is (for results that already have exactly its shape,
        as a test checks for the compute endpoints: dumping them only copied dicts)."""
        dumper = resolve_schema_instance(schema) if schema is not None and dump else None
        documenting = super().response(status_code, schema, **kwargs)

        def wrap(func: Callable) -> Callable:
            @wraps(func)
            def view(*args: Any, **view_kwargs: Any) -> Any:
                result, status, headers = unpack_tuple_response(func(*args, **view_kwargs))
                if isinstance(result, Response):
                    set_status_and_headers_in_response(result, status, headers)
                    return result
                body = dumps(dumper.dump(result) if dumper is not None else result)
                response_class = current_app._get_current_object().response_class  # not a read through the proxy
                return response_class(body, status or status_code, headers, content_type=JSON)

            view._apidoc = documenting(func)._apidoc
            return view

        return wrap

    def alt_response(self, *args: Any, **kwargs: Any) -> Callable:
        """Document another response (no effect at request time)."""
        return lambda func: _documented(func, super(Blueprint, self).alt_response(*args, **kwargs))

    def doc(self, **kwargs: Any) -> Callable:
        """Add to the operation's doc (no effect at request time)."""
        return lambda func: _documented(func, flask_smorest.Blueprint.doc(**kwargs))

    def documents(self, *statuses: int, jobs: bool = False) -> Callable:
        """Document these error statuses as references to the shared problem responses; ``jobs``: also what
        every batch-jobs operation may answer (:data:`JOBS_RESPONSES`)."""
        names = [ERROR_RESPONSES[status][0] for status in statuses]
        shared = [(status, name) for status, (name, _) in JOBS_RESPONSES.items()] if jobs else []

        def wrap(func: Callable) -> Callable:
            for status, name in [*zip(statuses, names, strict=True), *shared]:
                func = self.alt_response(status, response=name)(func)
            return func

        return wrap


def init_api(app: Flask) -> Api:
    """The Api extension for this app (the spec is served by service.edge.spec, not by flask-smorest), through
    flask-smorest's and apispec's public hooks: the marshmallow plugin's attribute functions document the tensor
    and any-of fields, the problem responses are components of the spec, and the service's error handlers, set
    after flask-smorest's, answer every error."""
    app.config.setdefault("API_TITLE", "Attention as a service")
    app.config.setdefault("API_VERSION", VERSION)
    app.config.setdefault("OPENAPI_VERSION", "3.1.0")
    plugin = MarshmallowPlugin()
    api = Api(app, spec_kwargs={"marshmallow_plugin": plugin})
    plugin.converter.add_attribute_function(tensor2properties)
    plugin.converter.add_attribute_function(anyof2properties)
    problem = {"content": {PROBLEM_JSON: {"schema": Problem}}}
    for name, description in [*ERROR_RESPONSES.values(), *JOBS_RESPONSES.values(),
                               (OPENAI_INVALID, OPENAI_INVALID_TEXT), ("Error", "Unexpected error (a bug).")]:
        api.spec.components.response(name, {"description": description, **problem}, lazy=True)
    register_error_handlers(app)
    return api
