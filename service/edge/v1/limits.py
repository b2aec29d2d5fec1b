"""GET /v1/limits: the limits every request is checked against."""

from __future__ import annotations

from dataclasses import Field, fields
from typing import Any

from marshmallow import Schema
from marshmallow import fields as ma_fields

from service.edge.context import current_limits
from service.edge.smorest import Blueprint
from service.settings import Limits


def _limit_field(limit: Field) -> Any:
    description = f"{limit.metadata['meaning']} Env {limit.metadata['variable']}, default {limit.default}."
    return ma_fields.Integer(required=True, metadata={"description": description})


LimitsSchema = Schema.from_dict({f.name: _limit_field(f) for f in fields(Limits)}, name="Limits")

blp = Blueprint("limits", __name__, url_prefix="/v1", description="Service limits.")


@blp.route("/limits", methods=["GET"])
@blp.response(200, LimitsSchema, example=Limits().as_dict())
def limits() -> dict[str, int]:
    """The limits in force.

    Requests past a limit are refused before any compute: 413 for the body size, 422 naming the
    limit for shapes. Each is set by an environment variable (see the schema); the example shows
    the defaults.
    """
    return current_limits().as_dict()
