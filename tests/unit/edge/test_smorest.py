"""service.smorest: what the lean request-time wrappers keep from a schema."""

from __future__ import annotations

import itertools

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
    assert _loaded_from_nothing(FormatQuery()) == {"color_scale": "fixed", "format": None}


def test_required_parameters_callable_defaults_and_hooks_are_loaded_per_request():
    assert _loaded_from_nothing(CausalMaskQuery()) is None       # size is required
    assert _loaded_from_nothing(Counting()) is None              # a post_load hook must run every time

    class Fresh(Schema):
        ids = fields.List(fields.Integer(), load_default=list)

    assert _loaded_from_nothing(Fresh()) is None                 # a callable default: a new list each time



def test_an_anyof_lists_no_schema_after_one_whose_required_members_are_a_subset_of_its_own(client):
    """A generated client takes the first alternative that parses: a batch answer of a model (tokens, output,
    layers...) after the encoder's (output, layers) was read as an encoder's."""
    schemas = client.get("/openapi.json").get_json()["components"]["schemas"]
    alternatives = [[ref["$ref"].rsplit("/", 1)[1] for ref in member["anyOf"]] for schema in schemas.values()
                    for member in schema.get("properties", {}).values()
                    if "anyOf" in member and all("$ref" in ref for ref in member["anyOf"])]
    assert len(alternatives) == 2  # the batch item's body and its answer's
    for names in alternatives:
        required = [set(schemas[name].get("required", [])) for name in names]
        for i, j in itertools.combinations(range(len(names)), 2):
            assert not required[j] > required[i], f"{names[j]} must come before {names[i]}"
