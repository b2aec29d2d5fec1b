"""POST /v1/batch: many v1 requests in one call, one status per item.

Only the envelope is validated here (ids, ops, the shape of each item): each item's ``body`` is
validated later, alone, with the schema of its op's v1 endpoint, so one bad body fails only its
own item. The body is documented as any of those endpoints' schemas. The ops are the service's (its
operation registry): :func:`batch_schemas` builds the envelope's schemas for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from marshmallow import ValidationError, fields, validate, validates_schema

from schemas.base import Schema
from schemas.fields import strict_int
from schemas.problem import Problem
from schemas.reference import PositionalEncodingQuery


class PositionalEncodingBody(PositionalEncodingQuery):
    """GET /v1/positional-encoding's parameters as a JSON body: strict integers.

    The query-string schema converts text, so it would also take ``3.5`` (truncated to 3) or
    ``"3"`` from JSON; a batch body gets JSON integers only.
    """

    n_positions = strict_int(1, required=True)
    d_model = strict_int(1, required=True)
    decimals = strict_int(0, 15, load_default=None)


class AnyOfSchemas(fields.Raw):
    """A JSON value validated elsewhere, documented as ``anyOf`` these schemas (see service.smorest).

    ``anyOf``, not ``oneOf``: the schemas overlap (an attention answer is also a model answer).
    """

    def __init__(self, schemas: list[type[Schema]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schemas = list(dict.fromkeys(schemas))


def batch_schemas(ops: Mapping[str, tuple[type[Schema], type[Schema]]]) -> tuple[type[Schema], type[Schema]]:
    """(BatchRequest, BatchResponse) for ``ops``: op name -> (its item body schema, its answer's schema)."""

    class BatchItem(Schema):
        """One request: the ``op`` names the v1 endpoint, ``body`` is what that endpoint takes."""

        error_messages: ClassVar[dict[str, str]] = {"type": "Not an object: each request is {id, op, body}."}

        id = fields.String(required=True, validate=validate.Length(1, 200), metadata={
            "description": "Your name for the item, unique in the batch; its response carries it back."})
        op = fields.String(required=True, validate=validate.OneOf(list(ops)), metadata={
            "description": "The v1 endpoint: POST /v1/{op} (positional-encoding: the GET's parameters as a body)."})
        body = AnyOfSchemas([request for request, _ in ops.values()], required=True, metadata={
            "description": "The request body of the op's endpoint, validated alone: a bad body fails only its item, "
                           "with pointers from the root of the batch (/requests/3/body/query/0)."})

    class BatchRequest(Schema):
        """Up to ``max_batch_items`` requests (GET /v1/limits), answered in the same order."""

        requests = fields.Nested(BatchItem, many=True, required=True, validate=validate.Length(min=1),
                                 error_messages={"type": "Not a valid list."})

        @validates_schema
        def _unique_ids(self, data: dict[str, Any], **kwargs: Any) -> None:
            seen: dict[str, int] = {}
            errors = {}
            for index, item in enumerate(data["requests"]):
                first = seen.setdefault(item["id"], index)
                if first != index:
                    errors[index] = {"id": [f"Duplicate id {item['id']!r}: item {first} has it already."]}
            if errors:
                raise ValidationError({"requests": errors})

    class BatchItemResponse(Schema):
        """One answer: ``body`` (status 200) as the op's endpoint answers, or ``error`` (4xx/5xx)."""

        id = fields.String(required=True)
        status = fields.Integer(required=True, metadata={
            "description": "The status the single endpoint would send."})
        body = AnyOfSchemas([response for _, response in ops.values()], metadata={
            "description": "With status 200: exactly the single endpoint's answer."})
        error = fields.Nested(Problem, metadata={
            "description": "Otherwise: the problem the single endpoint would send (pointers from the root of the "
                           "batch)."})

    class BatchResponse(Schema):
        """One response per request, in request order."""

        responses = fields.List(fields.Nested(BatchItemResponse), required=True)

    return BatchRequest, BatchResponse
