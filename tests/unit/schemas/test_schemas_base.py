"""schemas.base.Schema loads exactly what marshmallow's own loop loads, and fails exactly as it does.

Every schema of the package is loaded with the documented example requests and with hostile
variants of them (each field absent, null, of a wrong type, nested garbage, unknown members),
once through the lean loop and once through marshmallow's ``Schema._deserialize``.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import inspect
import weakref
from typing import Any

import marshmallow
import numpy as np
import pytest

import schemas.attention
import schemas.batch
import schemas.heatmap
import schemas.models
import schemas.options
import schemas.reference
import schemas.tensor
import schemas.v2
from schemas.base import UNKNOWN_NAMED, Schema
from service.edge.v1 import examples
from service.edge.v1.batch import BatchRequest, BatchResponse
from service.edge.v2.routes import EXAMPLE_REQUEST
from service.operations.registry import OPERATIONS

MODULES = (schemas.attention, schemas.batch, schemas.heatmap, schemas.models, schemas.options, schemas.reference,
           schemas.v2)
BatchItem = BatchRequest().fields["requests"].schema.__class__  # built for the registry's ops
BATCH_SCHEMAS = {BatchRequest, BatchItem, BatchResponse, BatchResponse().fields["responses"].inner.schema.__class__}
SCHEMAS = sorted({cls for module in MODULES for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, Schema) and cls is not Schema} | BATCH_SCHEMAS, key=lambda cls: cls.__name__)
WRONG = [None, "x", 1.5, -1, True, [], {}, [[1, 2], [3]], [["a"]], {"w_q": [[1.0]]}, [{"id": 1}]]


def documented_bodies() -> list[dict[str, Any]]:
    bodies = [examples.request(name) for name in examples.REQUESTS] + [EXAMPLE_REQUEST]
    bodies += examples.REQUESTS["batch"]["requests"] + [item["body"] for item in examples.REQUESTS["batch"]["requests"]]
    bodies += [EXAMPLE_REQUEST["inputs"][0], {"embeddings": [[0.5] * 8] * 5, "n_heads": 4, "causal": True}]
    return bodies


def variants(schema: marshmallow.Schema) -> list[Any]:
    """The documented bodies, each with every field of ``schema`` taken out or made wrong, and more."""
    many_unknown = {f"u{i}": i for i in range(12)}  # their order in the errors must be marshmallow's
    out: list[Any] = [{}, {"unknown": 1}, many_unknown, [], "text", None, 3]
    for body in documented_bodies():
        out += [body, {**body, "unknown": 1, "other": [1]}, {**many_unknown, **body}]
        for key in schema.load_fields:
            out.append({k: v for k, v in body.items() if k != key})
            out += [{**body, key: wrong} for wrong in WRONG]
    return out


def outcome(schema: marshmallow.Schema, data: Any, unknown: str | None) -> tuple[str, Any]:
    try:
        return "loaded", schema.load(data, unknown=unknown)
    except marshmallow.ValidationError as error:
        return "invalid", (error.messages, error.valid_data)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)  # in the same order, too
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("unknown", [None, marshmallow.EXCLUDE, marshmallow.INCLUDE])
@pytest.mark.parametrize("cls", SCHEMAS, ids=lambda cls: cls.__name__)
def test_lean_loop_loads_and_fails_as_marshmallow_does(cls: type[Schema], unknown: str | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    schema = cls()
    cases = variants(schema)
    lean = [outcome(schema, data, unknown) for data in cases]
    monkeypatch.setattr(Schema, "_deserialize", marshmallow.Schema._deserialize)
    reference = [outcome(schema, data, unknown) for data in cases]
    for data, got, expected in zip(cases, lean, reference, strict=True):
        assert same(got, expected), f"{cls.__name__} {data!r}: lean {got!r} != marshmallow {expected!r}"


def test_a_nested_schema_instance_narrowed_by_only_is_loaded_as_marshmallow_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """marshmallow re-initialises the fields of a Nested schema *instance* given ``only``: the lean
    loop must follow (it builds its plan in _init_fields)."""

    class Inner(Schema):
        x = marshmallow.fields.Integer()
        y = marshmallow.fields.Integer()

    class Outer(Schema):
        inner = marshmallow.fields.Nested(Inner(), only=("x",))

    cases = [{"inner": {"x": 1, "y": 2}}, {"inner": {"x": 1}}, {"inner": {"y": "no"}}]
    lean = [outcome(Outer(), data, None) for data in cases]
    monkeypatch.setattr(Schema, "_deserialize", marshmallow.Schema._deserialize)
    reference = [outcome(Outer(), data, None) for data in cases]
    assert lean[0][0] == "invalid"  # y is unknown to the narrowed schema
    for got, expected in zip(lean, reference, strict=True):
        assert same(got, expected)


REQUEST_SCHEMAS = [operation.request for operation in OPERATIONS.values()] + [
    BatchRequest, BatchItem, schemas.v2.InferenceRequest, schemas.v2.RequestInput]


@pytest.mark.parametrize("cls", REQUEST_SCHEMAS, ids=lambda cls: cls.__name__)
def test_request_schemas_take_the_lean_loop_on_valid_and_invalid_bodies(cls: type[marshmallow.Schema]) -> None:
    """Every request schema derives from schemas.base.Schema, and the corpus above both loads and
    fails each of them (so the comparison covers both outcomes)."""
    assert issubclass(cls, Schema)
    kinds = {outcome(cls(), data, None)[0] for data in variants(cls())}
    assert kinds == {"loaded", "invalid"}


class _NoNulls(marshmallow.fields.String):
    def _validate_missing(self, value: Any) -> None:
        if value == "":
            raise self.make_error("null")
        super()._validate_missing(value)


class _Shouting(marshmallow.fields.String):
    def _validate(self, value: Any) -> None:
        if value.isupper():
            raise marshmallow.ValidationError("No shouting.")
        super()._validate(value)


class _Small(marshmallow.fields.Integer):
    @property
    def _validate_all(self) -> Any:
        def below_six(value: int) -> None:
            if value > 5:
                raise marshmallow.ValidationError("Too big.")
        return below_six


def test_fields_whose_deserialize_does_more_still_go_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean loop calls _deserialize and the validators itself only for fields with no load hooks and
    no override of the steps it skips; the others load exactly as through marshmallow's loop."""

    class Hooked(Schema):
        stripped = marshmallow.fields.String(pre_load=[str.strip], post_load=[str.title])
        no_empty = _NoNulls()
        quiet = _Shouting()
        ranged = marshmallow.fields.Integer(validate=[marshmallow.validate.Range(0, 9),
                                                      marshmallow.validate.OneOf([1, 2, 11])])
        small = _Small()
        plain = marshmallow.fields.Integer()

    plans = {entry[1]: entry[4] for entry in Hooked()._plan}
    assert plans == {"stripped": True, "no_empty": False, "quiet": False, "ranged": True, "small": False,
                     "plain": True}  # hooks are asked at each load: see the hook added below
    cases = [{"stripped": "  a b  ", "no_empty": "x", "quiet": "calm", "ranged": 2, "small": 1, "plain": 3},
             {"no_empty": "", "quiet": "LOUD", "ranged": 11, "plain": None},
             {"ranged": 5, "stripped": None, "plain": "7"}, {"ranged": -1, "quiet": 3}, {"small": 9}]

    schema = Hooked()
    schema.fields["plain"].pre_load.append(lambda value: value * 10)  # a hook added after the schema is built
    lean = [outcome(schema, data, None) for data in cases]
    monkeypatch.setattr(Schema, "_deserialize", marshmallow.Schema._deserialize)
    reference = [outcome(schema, data, None) for data in cases]
    assert [kind for kind, _ in lean] == ["loaded", "invalid", "invalid", "invalid", "invalid"]
    assert lean[0][1]["stripped"] == "A B" and lean[0][1]["plain"] == 30
    for got, expected in zip(lean, reference, strict=True):
        assert same(got, expected), f"lean {got!r} != marshmallow {expected!r}"


@pytest.mark.parametrize("lean", [True, False])
def test_a_refused_load_leaves_nothing_behind(lean):
    """marshmallow raises its error from a frame holding the error and the data: a reference cycle that kept
    every refused body alive until the cyclic GC ran. Nothing may point at the data once the error is gone."""
    class Marker:  # something in the body a weak reference can follow
        pass

    class Body(dict):  # a dict subclass goes to marshmallow's own loop, a dict to the lean one
        pass

    marker = Marker()
    body = (dict if lean else Body)(query="not a tensor", stray=marker)
    held = weakref.ref(marker)
    gc.disable()
    try:
        with contextlib.suppress(marshmallow.ValidationError):
            schemas.attention.AttentionRequest().load(body)
        del body, marker
        assert held() is None
    finally:
        gc.enable()


def test_unknown_keys_are_named_up_to_a_bound():
    """A body of many stray keys is refused naming UNKNOWN_NAMED of them (all of them took seconds per MB)."""
    strays = {f"stray{i}": i for i in range(UNKNOWN_NAMED + 5)}
    with pytest.raises(marshmallow.ValidationError) as refused:
        schemas.attention.AttentionRequest().load({"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], **strays})
    assert len(refused.value.messages) == UNKNOWN_NAMED
    assert set(refused.value.messages) < set(strays)
    few = {"stray0": 0, "stray1": 1}
    with pytest.raises(marshmallow.ValidationError) as refused:
        schemas.attention.AttentionRequest().load({"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], **few})
    assert set(refused.value.messages) == set(few)


def test_a_tensors_first_bad_leaf_is_named_past_leaves_of_number_subclasses():
    """Python callers may hand int subclasses (orjson writes them as numbers): fine leaves, passed over."""
    class Level(enum.IntEnum):
        LOW = 1

    field = schemas.tensor.Tensor(ranks=(2,))
    with pytest.raises(marshmallow.ValidationError) as refused:
        field.deserialize([[Level.LOW, 2, 3.5, Level.LOW], [1.0, Level.LOW, True, "x"]])
    assert refused.value.messages == {1: {2: ["Expected a number, got true."]}}
    assert field.deserialize([[Level.LOW, 2.5]]).tolist() == [[1.0, 2.5]]
    mask = schemas.tensor.BoolTensor(ranks=(2,))
    with pytest.raises(marshmallow.ValidationError) as refused:
        mask.deserialize([[True], [False], [1]])
    assert refused.value.messages == {2: {0: ["Expected a boolean, got 1."]}}


def test_a_tensors_first_bad_leaf_is_found_through_list_subclasses():
    """Lists of a list subclass are walked like lists, before and after a row of plain leaves."""
    class Row(list):
        pass

    field = schemas.tensor.Tensor(ranks=(3,))
    with pytest.raises(marshmallow.ValidationError) as refused:
        field.deserialize([[Row([1.0, 2.0]), Row([3.0, 4.0])], [[1.0, 2.0], [3.0, True]]])
    assert refused.value.messages == {1: {1: {1: ["Expected a number, got true."]}}}
