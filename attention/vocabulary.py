"""The toy vocabulary: five words in a 4-dimensional space whose axes mean something.

Real models learn their embeddings; these are written by hand so that attention
weights come out readable. Each axis is one "meaning slot".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._checks import positive_int
from .errors import AttentionError, UnknownTokenError

DIMENSIONS = ["animal", "action", "food", "pronoun"]

EMBEDDINGS: dict[str, np.ndarray] = {
    "the": np.array([0.0, 0.0, 0.0, 0.0]),   # carries no meaning at all
    "cat": np.array([1.0, 0.0, 0.0, 0.0]),
    "ate": np.array([0.0, 1.0, 0.0, 0.0]),
    "food": np.array([0.0, 0.0, 1.0, 0.0]),
    "it": np.array([0.0, 0.0, 0.0, 1.0]),
}

TOY_DIM = len(DIMENSIONS)
_ROW = {word: row for row, word in enumerate(EMBEDDINGS)}       # word -> row of _TABLE
_TABLE = np.stack(list(EMBEDDINGS.values()))                   # (vocabulary, 4)


def embed(tokens: Sequence[str], d_model: int | None = None, *, dtype=np.float64) -> np.ndarray:
    """(n_tokens, d_model): one row per token, zero-padded from 4 dims to ``d_model``."""
    if isinstance(tokens, str) or not isinstance(tokens, Sequence) or len(tokens) == 0:
        raise AttentionError("tokens", f"expected a non-empty list of words, got {tokens!r}")
    rows = [_ROW.get(t, -1) if isinstance(t, str) else -1 for t in tokens]
    if -1 in rows:
        raise UnknownTokenError([t for t, r in zip(tokens, rows, strict=True) if r < 0], list(EMBEDDINGS))
    width = TOY_DIM if d_model is None else positive_int(d_model, "d_model")
    if width < TOY_DIM:
        raise AttentionError("d_model", f"expected at least {TOY_DIM} (the toy embeddings' width), got {width}")
    matrix = np.zeros((len(tokens), width), dtype=dtype)
    matrix[:, :TOY_DIM] = _TABLE[rows]                          # one gather, not one array per word
    return matrix
