"""RFC 9457 problem details: the body of every error response (application/problem+json)."""

from __future__ import annotations

from marshmallow import fields

from schemas.base import Schema


class OpenAIError(Schema):
    """OpenAI's error object, which its clients read (`body["error"]`)."""

    message = fields.String(required=True)
    type = fields.String(required=True)
    param = fields.String(required=True, allow_none=True)
    code = fields.String(required=True, allow_none=True)


class ProblemItem(Schema):
    """One invalid part of the request."""

    pointer = fields.String(metadata={"description": "JSON Pointer into the request body, e.g. /query/0/1."})
    parameter = fields.String(metadata={"description": "Name of the invalid query-string parameter."})
    header = fields.String(metadata={"description": "Name of the invalid request header, e.g. Accept."})
    detail = fields.String(required=True)


class LimitInfo(Schema):
    """The service limit a request went past (see GET /v1/limits)."""

    name = fields.String(required=True)
    maximum = fields.Integer(required=True)
    value = fields.Integer(required=True, metadata={"description": "What the request asked for."})


class Problem(Schema):
    """An error. ``type`` is a URI naming the kind of problem (``about:blank``: see ``status``)."""

    type = fields.String(required=True)
    title = fields.String(required=True)
    status = fields.Integer(required=True)
    detail = fields.String(required=True)
    errors = fields.List(fields.Nested(ProblemItem), metadata={"description": "Validation errors."})
    limit = fields.Nested(LimitInfo, metadata={"description": "With the limit-exceeded type."})
    request_id = fields.String(metadata={"description": "The request's X-Request-Id (also a response header and "
                                                         "in the server's log line), to quote in a bug report."})
    known = fields.List(fields.String(), metadata={"description": "With unknown tokens: the known ones."})
    acceptable = fields.List(fields.String(), metadata={
        "description": "With 406: the media types the operation answers, for the Accept header."})
    error = fields.Nested(OpenAIError, metadata={
        "description": "On /v1/chat/completions: OpenAI's error object, which its clients read."})
