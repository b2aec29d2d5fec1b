"""service.edge.smorest: how the spec documents the any-of fields."""

from __future__ import annotations

import itertools


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
