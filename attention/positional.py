"""Sinusoidal positional encoding (section 3.5).

Attention is a set operation: shuffle the tokens and the outputs shuffle with them.
Adding a distinct wave pattern to each position before attention is what lets the
model tell "cat ate food" from "food ate cat". Nothing is learned: it is computed.
"""

from __future__ import annotations

import numpy as np

from ._checks import positive_int


def positional_encoding(n_positions: int, d_model: int, *, dtype=np.float64) -> np.ndarray:
    """(n_positions, d_model): sin on even dims, cos on odd dims.

    Dims 2i and 2i+1 share the angle pos / 10000**(2i / d_model), so wavelengths run
    from 2*pi (first pair) to about 10000 * 2*pi (last pair).
    """
    n_positions = positive_int(n_positions, "n_positions")
    d_model = positive_int(d_model, "d_model")
    position = np.arange(n_positions)[:, None]                      # (n, 1)
    pair = np.arange(d_model)[None, :] // 2                         # (1, d): 0,0,1,1,2,2...
    angle = position / np.power(10000, (2 * pair) / d_model)        # (n, d)
    encoding = np.empty((n_positions, d_model))
    encoding[:, 0::2] = np.sin(angle[:, 0::2])                      # even dims
    encoding[:, 1::2] = np.cos(angle[:, 1::2])                      # odd dims
    return encoding.astype(dtype, copy=False)
