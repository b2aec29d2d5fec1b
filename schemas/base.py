"""The base of every schema here: marshmallow's ``Schema`` with a leaner loop over the fields of one object.

marshmallow's own loop builds a closure and a keyword dict for every field of every object it loads,
and calls three functions to learn that an absent optional field takes its default, paid again by every
item of a batch. The loop below runs the same fields with the same rules, messages and error layout, for
the common case only (one object, no ``partial``); anything else goes to marshmallow's loop. A present,
non-null value of a field with no load hooks goes straight to its ``_deserialize`` and, if it has any, its
validators: what ``Field.deserialize`` does for it after five calls that do nothing there (its missing and
null checks, and an ``And`` of no validators built and called).
``tests/unit/schemas/test_schemas_base.py`` loads valid and invalid requests through both and checks they agree;
tests/unit/test_library_surface.py checks the marshmallow names it relies on. Kept for the figure in
docs/architecture.md (a /v1/batch of 64 demo items 1.26x as fast as through marshmallow's loop).
"""

from __future__ import annotations

import itertools
from typing import Any

import marshmallow
from marshmallow import EXCLUDE, INCLUDE, RAISE, ValidationError, missing
from marshmallow.error_store import ErrorStore
from marshmallow.fields import Field

ASK = object()  # in a plan: an absent field's value needs the field (required, or a callable default)
# Unknown keys named per object, at most: naming them all makes a body of stray keys slow to answer, with a
# problem as large as the body (the rest are refused just the same).
UNKNOWN_NAMED = 20


def _deserializes_plainly(field: Field) -> bool:
    """Whether ``field.deserialize`` of a present, non-null value is just its load hooks, ``_deserialize`` and
    ``_validate``: none of the methods it goes through is overridden. (The hooks are asked at each load.)"""
    kind = type(field)
    return (kind.deserialize is Field.deserialize and kind._validate_missing is Field._validate_missing
            and kind._validate is Field._validate and kind._validate_all is Field._validate_all)


class Schema(marshmallow.Schema):
    """marshmallow's Schema; loading one JSON object takes the lean loop (see the module docstring)."""

    def _init_fields(self) -> None:
        """marshmallow (re)builds the fields here: at __init__, and on the copy a Nested field makes of a
        schema instance (narrowed by its ``only``/``exclude``, if any). The loop's plan follows."""
        super()._init_fields()
        # (JSON key, key in the loaded dict, field, value when absent, direct) for every loaded field, in
        # declaration order. The value when absent is what Field.deserialize gives an absent optional field: its
        # fixed load_default (``missing`` if none), known now; ASK for a required field or a callable default.
        # direct: see _deserializes_plainly.
        self._plan: tuple[tuple[str, str, Field, Any, bool], ...] = tuple(
            (field.data_key if field.data_key is not None else name, field.attribute or name, field,
             ASK if field.required or callable(field.load_default) else field.load_default,
             _deserializes_plainly(field))
            for name, field in self.load_fields.items())
        self._known = frozenset(entry[0] for entry in self._plan)
        self._lean = not any("." in entry[1] for entry in self._plan)  # dotted attributes nest: marshmallow's

    def load(self, data: Any, *, many: bool | None = None, partial: Any = None, unknown: str | None = None) -> Any:
        """marshmallow's load, whose ValidationError leaves without the frames it was raised through.

        marshmallow raises it from a frame holding both the error and the data in its locals: a reference
        cycle (error -> traceback -> frame -> error) that keeps a refused body in memory until the cyclic GC
        runs, which parsed strings and numbers do not prompt. Without the traceback nothing points back at
        the error.
        """
        try:
            return super().load(data, many=many, partial=partial, unknown=unknown)
        except ValidationError as error:
            error.__traceback__ = None
            raise

    def _deserialize(self, data: Any, *, error_store: ErrorStore, many: bool = False, partial: Any = None,
                     unknown: str = RAISE, index: int | None = None) -> Any:
        if many or partial is not None or type(data) is not dict or not self._lean:
            return super()._deserialize(data, error_store=error_store, many=many, partial=partial,
                                        unknown=unknown, index=index)
        index = index if self.opts.index_errors else None
        loaded = self.dict_class()
        for key, name, field, absent, direct in self._plan:
            raw = data.get(key, missing)
            if raw is missing and absent is not ASK:
                value = absent
            elif raw is missing and not field.required:  # a callable default
                value = field.load_default()
            else:
                try:
                    if direct and raw is not missing and raw is not None and not (field.pre_load or field.post_load):
                        value = field._deserialize(raw, key, data)
                        if field.validators:
                            field._validate(value)
                    else:
                        value = field.deserialize(raw, key, data)
                except ValidationError as error:
                    error_store.store_error(error.messages, key, index=index)
                    value = error.valid_data or missing  # a Nested field keeps what it could load
            if value is not missing:
                loaded[name] = value
        if unknown == INCLUDE:
            for key in set(data) - self._known:
                loaded[key] = data[key]
        elif unknown != EXCLUDE:  # RAISE: marshmallow's order of unknown keys, the first UNKNOWN_NAMED of them
            for key in itertools.islice(set(data) - self._known, UNKNOWN_NAMED):
                error_store.store_error([self.error_messages["unknown"]], key, index)
        return loaded
