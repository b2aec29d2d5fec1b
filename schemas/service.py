"""Service metadata: health (the limits schema is built from service.settings.Limits)."""

from __future__ import annotations

from marshmallow import fields

from schemas.base import Schema


class Health(Schema):
    """``ok`` when alive, ``ready`` when a tiny attention ran through the engine."""

    status = fields.String(required=True)
