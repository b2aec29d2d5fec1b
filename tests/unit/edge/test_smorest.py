"""service.smorest: what the lean request-time wrappers keep from a schema."""

from __future__ import annotations

from marshmallow import fields, post_load

from schemas.base import Schema
from schemas.heatmap import FormatQuery
from schemas.reference import CausalMaskQuery
from service.edge.smorest import _loaded_from_nothing


class Counting(Schema):
    size = fields.Integer(load_default=3)

    @post_load
    def _count(self, data, **kwargs):
        return {**data, "seen": True}


def test_an_empty_query_string_is_loaded_once_when_that_is_constant():
    assert _loaded_from_nothing(FormatQuery()) == {"format": "json"}


def test_required_parameters_callable_defaults_and_hooks_are_loaded_per_request():
    assert _loaded_from_nothing(CausalMaskQuery()) is None       # size is required
    assert _loaded_from_nothing(Counting()) is None              # a post_load hook must run every time

    class Fresh(Schema):
        ids = fields.List(fields.Integer(), load_default=list)

    assert _loaded_from_nothing(Fresh()) is None                 # a callable default: a new list each time

