"""Tensor fields: a nested JSON array becomes one numpy array in one step.

Per-element marshmallow fields would call Python once per number. The parsed list is
re-serialised with orjson (C speed) to check its leaves: a numeric tensor's text may hold only
digits, signs, dots, exponents, commas and brackets, so any other byte (``"``, ``t``, ``n``, ``{``...)
means a string, boolean, null or object leaf (a mask's text may hold only ``true``/``false``, commas
and brackets); only then are the leaves walked to name the bad one. ``np.array`` is called with an
explicit dtype, so booleans and numeric strings never slip through as numbers. Ragged arrays, wrong
ranks, empty arrays and non-finite values are refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson
from marshmallow import ValidationError, fields

# What orjson writes for a nested array of numbers (of booleans): anything else left by bytes.translate is suspect
# (one C pass over the text, not a Python search per byte).
_NUMERIC_TEXT = b"0123456789+-.eE,[]"
_BOOLEAN_TEXT = b"truefals,[]"


def _first_bad_leaf(value: Any, ok: type | tuple[type, ...]) -> tuple[list[int], Any] | None:
    """Index path and value of the first leaf that is not a list and not of type ``ok``.

    Only called after the fast check found a suspect leaf. Depth first with a stack of iterators (nothing
    is copied); a list is first judged by the set of its element types (one C pass) and skipped when every
    one is an exact ``ok`` type, and a row of leaves is searched with C-speed list methods: nothing is
    stacked per leaf.
    """
    exact = {bool} if ok is bool else {int, float}

    def bad(item: Any) -> bool:
        return isinstance(item, bool) != (ok is bool) or not isinstance(item, ok)

    path: list[int] = []                                 # the indices down to the list stack[-1] walks
    stack = [enumerate([value])]                         # the value as the only item of a root list
    while stack:
        for i, item in stack[-1]:
            if not isinstance(item, list):
                if bad(item):
                    return [*path, i][1:], item
                continue
            kinds = set(map(type, item))
            if kinds <= exact:                           # numbers only (or booleans only): nothing here
                continue
            if not any(issubclass(kind, list) for kind in kinds):  # a row of leaves holding a suspect one
                j = _first_bad_in_row(item, exact, bad)
                if j is not None:
                    return [*path, i, j][1:], item[j]
                continue
            path.append(i)
            stack.append(enumerate(item))
            break
        else:
            stack.pop()
            if path:
                path.pop()
    return None


def _first_bad_in_row(row: list, exact: set[type], bad: Any) -> int | None:
    """Index of the first bad leaf of a row of leaves: C-speed ``index`` over its type flags; a leaf of a
    subclass of an ``ok`` type (an IntEnum from a Python caller: orjson writes it) is looked at, and passed over."""
    flags = list(map(exact.__contains__, map(type, row)))
    start = 0
    while True:
        try:
            j = flags.index(False, start)
        except ValueError:
            return None
        if bad(row[j]):
            return j
        start = j + 1


def _nest(path: list[int], message: str) -> dict | list[str]:
    """marshmallow-style nested error dict {0: {1: [message]}} for an index path."""
    error: dict | list[str] = [message]
    for index in reversed(path):
        error = {index: error}
    return error


def _first_ragged(value: Any) -> tuple[list[int], str] | None:
    """Index path of the first sub-array whose length or nesting differs from its first sibling."""
    stack: list[tuple[list[int], Any]] = [([], value)]
    while stack:
        path, item = stack.pop()
        if not isinstance(item, list) or not item:
            continue
        head = item[0]
        for i, sub in enumerate(item):
            same_kind = isinstance(sub, list) == isinstance(head, list)
            if not same_kind or (isinstance(sub, list) and len(sub) != len(head)):
                return [*path, i], f"ragged array: expected {_describe(head)} like element 0"
            stack.append(([*path, i], sub))
    return None


def _describe(item: Any) -> str:
    return f"an array of length {len(item)}" if isinstance(item, list) else "a scalar"


class Tensor(fields.Field):
    """A JSON nested array of numbers loaded as a C-contiguous float64 ``np.ndarray``.

    :param ranks: the allowed numbers of dimensions, e.g. ``(2, 3)`` for ``(n, d)`` or ``(B, n, d)``.
    :param shape: a human description of the shape for errors and docs, e.g. ``"(n_q, d_k)"``.
    Dumping returns the array unchanged: orjson serialises numpy arrays natively.
    """

    dtype: type = np.float64
    leaf_type: type | tuple[type, ...] = (int, float)
    leaf_name = "number"
    clean_text = _NUMERIC_TEXT

    default_error_messages = {  # noqa: RUF012 (marshmallow merges this dict per class)
        "type": "Expected a nested array of {leaf}s with {ranks} dimensions {shape}.",
        "rank": "Expected {ranks} dimensions {shape}, got {got}.",
        "empty": "Expected a non-empty array {shape}: got shape {got}.",
        "leaf": "Expected a {leaf}, got {value}.",
        "finite": "Every number must be finite (NaN and Infinity are not JSON; this one overflowed).",
    }

    def __init__(self, *, ranks: Iterable[int] = (2,), shape: str = "", null_leaves: bool = False,
                 **kwargs: Any) -> None:
        """``null_leaves``: (responses only) some cells may be null, e.g. masked scores."""
        super().__init__(**kwargs)
        self.ranks = tuple(ranks)
        self.shape = shape
        self.null_leaves = null_leaves

    def _message(self, key: str, **kwargs: Any) -> str:
        ranks = " or ".join(str(r) for r in self.ranks)
        return self.error_messages[key].format(ranks=ranks, shape=self.shape, leaf=self.leaf_name, **kwargs)

    def _fail_with(self, key: str, **kwargs: Any) -> ValidationError:
        return ValidationError(self._message(key, **kwargs))

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> np.ndarray:
        if not isinstance(value, list):
            raise self._fail_with("type")
        text = orjson.dumps(value)
        suspect = bool(text.translate(None, self.clean_text))  # a byte other than those of a clean text
        if suspect:
            bad = _first_bad_leaf(value, self.leaf_type)
            if bad is not None:
                path, leaf = bad
                shown = orjson.dumps(leaf).decode()[:40]
                raise ValidationError(_nest(path, self._message("leaf", value=shown)))
        try:
            array = np.array(value, dtype=self.dtype)
        except ValueError as exc:
            ragged = _first_ragged(value)
            if ragged is None:  # e.g. more dimensions than numpy supports
                raise self._fail_with("type") from exc
            raise ValidationError(_nest(*ragged)) from exc
        if array.size == 0:
            raise self._fail_with("empty", got=list(array.shape))
        if array.ndim not in self.ranks:
            raise self._fail_with("rank", got=array.ndim)
        if suspect:  # orjson writes NaN and infinities as null: a text without "n" holds only finite numbers
            self._check_values(array)
        return array

    def _check_values(self, array: np.ndarray) -> None:
        if not np.isfinite(array).all():
            raise self._fail_with("finite")

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> Any:
        return value

    def json_schema(self) -> dict[str, Any]:
        """OpenAPI description: nested arrays of ``leaf_name`` for each allowed rank."""
        leaf_type = "boolean" if self.dtype is np.bool_ else "number"
        variants = []
        for rank in self.ranks:
            schema: dict[str, Any] = {"type": [leaf_type, "null"] if self.null_leaves else leaf_type}
            for _ in range(rank):
                schema = {"type": "array", "minItems": 1, "items": schema}
            variants.append(schema)
        return variants[0] if len(variants) == 1 else {"oneOf": variants}


class BoolTensor(Tensor):
    """A JSON nested array of booleans (``true`` = may attend) loaded as an ``np.ndarray`` of bool."""

    dtype = np.bool_
    leaf_type = bool
    leaf_name = "boolean"
    clean_text = _BOOLEAN_TEXT

    def _check_values(self, array: np.ndarray) -> None:
        """Booleans are always finite."""
