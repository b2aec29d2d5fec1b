"""GET /v1/demos and /v1/demos/{name}: the seed script's five demos as data."""

from __future__ import annotations

from marshmallow import fields

from schemas.base import Schema


class DemoSummary(Schema):
    """One demo's name, title and one-paragraph summary."""

    name = fields.String(required=True)
    title = fields.String(required=True)
    summary = fields.String(required=True)


class DemoList(Schema):
    """Every demo, in the seed script's order."""

    demos = fields.List(fields.Nested(DemoSummary), required=True)


class DemoResult(DemoSummary):
    """A demo and the numbers it produces (the same numbers the seed script prints)."""

    result = fields.Dict(required=True, metadata={"description": "The demo's data; keys depend on the demo."})
