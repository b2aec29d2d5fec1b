"""service.jsonio: the JSON depth scan that guards every body before it is parsed."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from service.operations.jsontext import json_depth

# Strings full of the characters that could fool a byte scan: brackets, quotes, backslashes.
TRICKY = st.text(alphabet=st.sampled_from('[]{}"\\ab\n\u00e9'), max_size=8)
SCALARS = (st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)  # orjson writes 64-bit integers
           | st.floats(allow_nan=False, allow_infinity=False) | TRICKY)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
                    max_leaves=30)


def depth(value: object) -> int:
    """Nesting depth of arrays/objects, computed on the Python value."""
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_json_depth_equals_the_depth_of_the_parsed_value(value):
    assert json_depth(orjson.dumps(value)) == depth(value)


def test_brackets_and_escaped_quotes_inside_strings_do_not_count():
    assert json_depth(b'{"a": "[[[{{{", "b": [1, 2]}') == 2
    assert json_depth(b'["\\"[[[", ["]]]\\\\"]]') == 2
    assert json_depth(b'"[[["') == 0
    assert json_depth(b"3") == 0


def test_json_depth_of_a_deep_text_is_counted_without_recursion():
    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000
