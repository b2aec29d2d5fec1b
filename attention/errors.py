"""Errors the engine raises on invalid arguments.

Every one is a ``ValueError`` so plain callers can catch the usual exception, and each
carries ``argument``: the name of the offending argument, so a caller (the HTTP service)
can point at the field without parsing the message.
"""

from __future__ import annotations


class AttentionError(ValueError):
    """An argument has the wrong rank, shape, dtype or value.

    The message names the argument and what was expected; ``argument`` holds the name alone.
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument
        self.detail = message


class UnknownTokenError(AttentionError):
    """A token is not in the toy vocabulary; ``unknown`` and ``known`` list both sides."""

    def __init__(self, unknown: list[str], known: list[str], argument: str = "tokens") -> None:
        super().__init__(
            argument,
            f"unknown token(s) {unknown!r}; the vocabulary knows {known!r}",
        )
        self.unknown = unknown
        self.known = known
