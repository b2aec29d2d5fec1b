"""Small fields shared by the request schemas: strict numbers, seeds, lists checked before or in one pass."""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate

# Seeds fit a signed 64-bit integer, as clients and the v2 protocol's INT64 parameters hold them, with room for
# multi-head's s..s+h-1 and s+99. An encoder's layers go further (s + 1000 i, + 200): numpy's SeedSequence
# takes any non-negative integer, so nothing breaks past 2**63.
MAX_SEED = 2**63 - 1 - 1000


class StrictFloat(fields.Float):
    """A finite JSON number; numeric strings such as ``"1.5"`` and booleans are refused."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_nan=False, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        if isinstance(value, str | bool):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


class StrictBool(fields.Boolean):
    """A JSON ``true``/``false`` only (marshmallow's Boolean also takes ``"yes"``, ``1``, ...)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


def strict_bool(**kwargs: Any) -> StrictBool:
    """A :class:`StrictBool` field."""
    return StrictBool(**kwargs)


class StrictInteger(fields.Integer):
    """marshmallow's ``Integer(strict=True)``, answering a JSON integer (a Python ``int``) first: its
    ``isinstance(value, numbers.Integral)`` runs the ABC machinery on every request."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if type(value) is int:  # what marshmallow would return for it (booleans are not exactly int)
            return value
        return super()._deserialize(value, attr, data, **kwargs)


def strict_int(minimum: int = 1, maximum: int | None = None, **kwargs: Any) -> fields.Integer:
    """A JSON integer (no fractions, no strings) in ``[minimum, maximum]``."""
    return StrictInteger(validate=validate.Range(min=minimum, max=maximum), **kwargs)


class QueryInteger(fields.Integer):
    """An integer from the query string, written in ASCII digits (a leading minus is left to the range
    rule to refuse): ``int()`` would also take ``1_000``, ``+3``, `` 3`` or other scripts' digits."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        digits = value.removeprefix("-") if isinstance(value, str) else None
        if digits is not None and not (digits.isascii() and digits.isdigit()):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


def seed(**kwargs: Any) -> fields.Integer:
    """A non-negative integer seed for ``np.random.default_rng``; default 0."""
    return strict_int(0, MAX_SEED, load_default=0, metadata={
        "description": "Seed of the random projection weights (the seed script's defaults at 0).",
        **kwargs.pop("metadata", {})}, **kwargs)


class BoundedList(fields.List):
    """A list whose Length validators judge the raw list before any item is loaded.

    marshmallow's List loads every item, keeping one error per bad item, and only then checks the
    length, so a long list of bad items costs its whole load and an error each before its length is judged.
    """

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> list[Any]:
        if isinstance(value, list):
            for check in self.validators:
                if isinstance(check, validate.Length):
                    check(value)
        return super()._deserialize(value, attr, data, **kwargs)


class BoundedDict(fields.Dict):
    """An object of at most ``max_members`` members, judged by that count before any key or value is loaded
    (as :class:`BoundedList`), documented as ``maxProperties``."""

    def __init__(self, *, max_members: int, **kwargs: Any) -> None:
        kwargs["metadata"] = {**kwargs.get("metadata", {}), "maxProperties": max_members}
        super().__init__(**kwargs)
        self.max_members = max_members

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[Any, Any]:
        if isinstance(value, dict) and len(value) > self.max_members:
            raise ValidationError(f"More than {self.max_members} members.")
        return super()._deserialize(value, attr, data, **kwargs)


class StringList(fields.List):
    """A list of strings checked in one pass, naming the first bad item only, instead of a marshmallow String
    called per item (keeping an error per bad item). ``max_chars``: the longest string allowed.

    Documented in OpenAPI as the usual array of strings (with ``maxLength`` when given).
    """

    def __init__(self, *, max_chars: int | None = None, **kwargs: Any) -> None:
        super().__init__(fields.String(validate=validate.Length(max=max_chars) if max_chars else None), **kwargs)
        self.max_chars = max_chars

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> list[str]:
        if not isinstance(value, list):
            raise self.make_error("invalid")
        if not all(type(item) is str for item in value):
            index = next(i for i, item in enumerate(value) if type(item) is not str)
            raise ValidationError({index: [self.inner.error_messages["invalid"]]})
        if self.max_chars is not None and value and max(map(len, value)) > self.max_chars:
            index = next(i for i, item in enumerate(value) if len(item) > self.max_chars)
            raise ValidationError({index: [f"Longer than maximum length {self.max_chars}."]})
        return value


def tokens(**kwargs: Any) -> StringList:
    """A non-empty list of words from the toy vocabulary (see GET /v1/vocabulary)."""
    return StringList(validate=validate.Length(min=1), **kwargs)
