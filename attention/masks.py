"""Masks: boolean arrays where True means "this query may attend to this key"."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._checks import as_real_array, positive_int
from .errors import AttentionError


def causal_mask(n: int) -> np.ndarray:
    """(n, n) lower-triangular mask: query i sees keys 0..i and never a future token.

    This one line is the difference between an encoder that reads the whole sentence
    (BERT) and a decoder that must not peek at the answer (GPT).
    """
    n = positive_int(n, "n")
    return np.tri(n, dtype=bool)


def is_per_head(mask_ndim: int, input_ndim: int) -> bool:
    """Whether a multi-head layer reads its mask as one mask per head: a mask with one axis more than the
    layer's input X (..., n, d_model) is (..., h, n, n); any other mask is shared by every head."""
    return mask_ndim == input_ndim + 1


def padding_mask(lengths: ArrayLike, n: int) -> np.ndarray:
    """(B, 1, n) mask hiding padded keys: key j is visible in item b iff j < lengths[b].

    The middle axis of 1 broadcasts over the queries, so it can be passed wherever a
    (B, n_q, n) mask is expected.
    """
    n = positive_int(n, "n")
    lengths = as_real_array(lengths, "lengths", 1)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths < 0).any() or (lengths > n).any():
        raise AttentionError("lengths", f"expected a 1-D array of integers in [0, {n}], got {lengths!r}")
    return (np.arange(n)[None, :] < lengths[:, None])[:, None, :]


def zero_padding(array: np.ndarray, keep: np.ndarray | None, *, rows: bool = False) -> np.ndarray:
    """``array`` (B, n, d), or with ``rows`` weights (B, h, n, n_keys), with the positions that ``keep`` (B, n)
    marks False (padding) set to 0, in place: a padded query row would otherwise hold weights over the real keys."""
    if keep is not None and not keep.all():
        array *= keep[:, None, :, None] if rows else keep[:, :, None]
    return array
