"""flask-smorest, adapted: problem+json errors, the orjson parser, tensor fields in the spec.

``Blueprint.documents(...)`` documents the error responses of a view once, by stable names
(the names of ``http.HTTPStatus`` members change between Python versions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flask_smorest
from flask import Flask

from schemas.batch import AnyOfSchemas
from schemas.problem import Problem
from schemas.tensor import Tensor
from service.errors import PROBLEM_JSON, register_error_handlers
from service.jsonio import OrjsonParser

ERROR_RESPONSES = {
    400: ("MalformedJSON", "The body is not valid JSON."),
    404: ("NotFound", "No such resource."),
    405: ("MethodNotAllowed", "The path exists but not with this method (see the Allow header)."),
    413: ("ContentTooLarge", "The body is larger than max_body_bytes (see GET /v1/limits)."),
    415: ("UnsupportedMediaType", "The body is not application/json."),
    422: ("Invalid", "Invalid request: `errors` points at each problem; `limit` names an exceeded limit."),
    503: ("NotReady", "The engine failed its self-test."),
}
BODY_ERRORS = (400, 413, 415, 422)


def tensor2properties(self: Any, field: Any, **kwargs: Any) -> dict[str, Any]:
    """apispec attribute function: a :class:`Tensor` field is documented as nested arrays."""
    if not isinstance(field, Tensor):
        return {}
    schema = field.json_schema()
    if field.allow_none:
        schema = {"anyOf": [schema, {"type": "null"}]}
    description = field.metadata.get("description") or (f"Shape {field.shape}." if field.shape else None)
    return {**schema, "description": description} if description else schema


def anyof2properties(self: Any, field: Any, **kwargs: Any) -> dict[str, Any]:
    """apispec attribute function: an :class:`AnyOfSchemas` field is ``anyOf`` references to its schemas."""
    if not isinstance(field, AnyOfSchemas):
        return {}
    return {"anyOf": [self.resolve_nested_schema(schema) for schema in field.schemas]}


class Api(flask_smorest.Api):
    """The service's Api: one problem schema for every error, documented once per status."""

    ERROR_SCHEMA = Problem
    DEFAULT_ERROR_RESPONSE_NAME = "Error"

    def _init_spec(self, *args: Any, **kwargs: Any) -> None:
        super()._init_spec(*args, **kwargs)
        self.ma_plugin.converter.add_attribute_function(tensor2properties)
        self.ma_plugin.converter.add_attribute_function(anyof2properties)

    def _register_responses(self) -> None:
        self.spec.components.schema("Problem", schema=Problem)
        problem = {"content": {PROBLEM_JSON: {"schema": "Problem"}}}
        for name, description in [*ERROR_RESPONSES.values(), ("Error", "Unexpected error (a bug).")]:
            self.spec.components.response(name, {"description": description, **problem}, lazy=True)

    def _register_etag_headers(self) -> None:
        """No ETags here: nothing to document."""

    def _register_pagination_header(self) -> None:
        """No pagination here: nothing to document."""

    def _register_error_handlers(self) -> None:
        register_error_handlers(self._app)


class Blueprint(flask_smorest.Blueprint):
    """Blueprint parsing JSON with orjson; validation errors are documented by :meth:`documents`."""

    ARGUMENTS_PARSER = OrjsonParser()

    def arguments(self, schema: Any, **kwargs: Any) -> Callable:
        decorator = super().arguments(schema, **kwargs)

        def wrap(func: Callable) -> Callable:
            view = decorator(func)
            view._apidoc["arguments"].pop("responses", None)  # by HTTPStatus name: see documents()
            return view

        return wrap

    def documents(self, *statuses: int) -> Callable:
        """Document these error statuses as references to the shared problem responses."""

        def wrap(func: Callable) -> Callable:
            for status in statuses:
                func = self.alt_response(status, response=ERROR_RESPONSES[status][0])(func)
            return func

        return wrap


def init_api(app: Flask) -> Api:
    """The Api extension for this app (spec served by service.openapi, not by flask-smorest)."""
    app.config.setdefault("API_TITLE", "Attention as a service")
    app.config.setdefault("API_VERSION", "1.0.0")
    app.config.setdefault("OPENAPI_VERSION", "3.1.0")
    return Api(app)
