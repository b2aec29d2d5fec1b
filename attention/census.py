"""A head census: where each head looks, on average, over many texts (Clark et al. 2019, "What Does BERT Look At?").

Per layer and head, averaged over every real query row of every text: the weight on position 0 ([CLS], or a
decoder's first token), on separator tokens ([SEP]), on the row's own position, on the previous and on the next
position (rows that have one), on punctuation tokens, and the row's entropy in nats. Each mean comes with the count
of rows it averages, so the census of one batch and of another combine exactly (:meth:`Census.combined`): a corpus
can be counted batch by batch, or job line by job line.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import AttentionError

# The statistics, in the order the answer lists them. "separators" only where the model has separator tokens.
STATISTICS = ("first", "separators", "self", "previous", "next", "punctuation", "entropy")


@dataclass(frozen=True)
class Census:
    """``means``: statistic -> (n_layers, h) float64, the mean over ``counts[statistic]`` query rows (weights are
    fractions of a row's attention; entropy is in nats). A statistic a model has no tokens for (a decoder's
    separators) is absent from both."""

    means: dict[str, np.ndarray]
    counts: dict[str, int]

    def combined(self, other: Census) -> Census:
        """This census and another's over more texts, as one: each mean weighted by its count."""
        if self.means.keys() != other.means.keys():
            raise AttentionError("census", f"statistics {sorted(self.means)} and {sorted(other.means)} differ")
        means = {}
        for name, mean in self.means.items():
            total = self.counts[name] + other.counts[name]
            means[name] = (mean * self.counts[name] + other.means[name] * other.counts[name]) / max(total, 1)
        return Census(means, {name: self.counts[name] + other.counts[name] for name in self.means})


def punctuation_marks(tokens: Sequence[str], markers: Sequence[str] = ("##",)) -> np.ndarray:
    """Which tokens (n,) are punctuation: made only of Unicode category P characters once white space and the
    tokenizer's word ``markers`` ("##": WordPiece's continuation; a byte-level BPE's tokens are already decoded, its
    "Ġ" a space) are stripped, and not empty then. -> (n,) bool."""
    marks = np.zeros(len(tokens), bool)
    for index, token in enumerate(tokens):
        for marker in markers:
            token = token.replace(marker, "")
        stripped = "".join(token.split())
        marks[index] = bool(stripped) and all(unicodedata.category(c).startswith("P") for c in stripped)
    return marks


def head_census(weights: Sequence[np.ndarray], punctuation: np.ndarray, lengths: np.ndarray | None = None,
                separators: np.ndarray | None = None) -> Census:
    """The census of one batch of texts from a forward pass's weights: every layer's (B, h, n, n) (every head),
    ``punctuation`` and ``separators`` (B, n) bool marking those tokens (separators None: the model has none),
    ``lengths`` (B,) the real tokens of padded items (None: all real). Padded rows and keys count for nothing: a
    padded batch's census is its items' alone, combined."""
    b, _, n, _ = weights[0].shape
    keep = np.ones((b, n), bool) if lengths is None else np.arange(n) < np.asarray(lengths)[:, None]  # (B, n)
    rows = keep.astype(np.float64)                                            # (B, n): the rows that count
    follow = rows[:, 1:]                                                      # (B, n - 1): rows with a predecessor
    counts = {"first": int(keep.sum()), "separators": int(keep.sum()), "self": int(keep.sum()),
              "previous": int(follow.sum()), "next": int(follow.sum()), "punctuation": int(keep.sum()),
              "entropy": int(keep.sum())}
    sums = {name: [] for name in STATISTICS}
    for layer in weights:
        w = layer.astype(np.float64, copy=False)                              # (B, h, n, n)
        on = {"first": w[..., 0],                                             # (B, h, n) each: per query row
              "self": np.diagonal(w, axis1=-2, axis2=-1),
              "punctuation": _weight_on(w, punctuation),
              "entropy": -np.add.reduce(w * np.log(np.where(w > 0, w, 1)), axis=-1)}
        if separators is not None:
            on["separators"] = _weight_on(w, separators)
        for name, values in on.items():
            sums[name].append(np.einsum("bhn,bn->h", values, rows))
        # Row i's previous is key i - 1 (rows 1..n-1), its next key i + 1 (rows 0..n-2, real when i + 1 is).
        sums["previous"].append(np.einsum("bhn,bn->h", np.diagonal(w, -1, axis1=-2, axis2=-1), follow))
        sums["next"].append(np.einsum("bhn,bn->h", np.diagonal(w, 1, axis1=-2, axis2=-1), follow))
    names = [name for name in STATISTICS if sums[name]]
    return Census({name: np.array(sums[name]) / max(counts[name], 1) for name in names},
                  {name: counts[name] for name in names})


def _weight_on(weights: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Each row's total weight on the marked keys: weights (B, h, n, n), marked (B, n) bool -> (B, h, n)."""
    return (weights @ marked[:, None, :, None].astype(weights.dtype))[..., 0]
