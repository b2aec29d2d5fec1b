"""An answer rounded to the request's ``decimals``, as every endpoint rounds it."""

from __future__ import annotations

from typing import Any

import numpy as np


def round_arrays(result: Any, decimals: int | None) -> Any:
    """``result`` with every float array and float rounded with ``np.round`` (None: unchanged).

    Walks only dicts and lists of the result's structure, never into arrays.
    """
    if decimals is None:
        return result
    if isinstance(result, dict):
        return {key: round_arrays(value, decimals) for key, value in result.items()}
    if isinstance(result, list):
        return [round_arrays(value, decimals) for value in result]
    if isinstance(result, np.ndarray | float | np.floating) and np.asarray(result).dtype.kind == "f":
        return _round(result, decimals)
    return result


def _round(values: Any, decimals: int) -> Any:
    """``np.round``, except where it overflows (it scales by 10**decimals): a number that large has no
    digits past the point to drop, so it stays as it is instead of becoming inf or NaN (JSON null)."""
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.round(values, decimals)
    if np.isfinite(rounded).all():  # nearly always: one pass
        return rounded
    overflowed = ~np.isfinite(rounded) & np.isfinite(values)
    return np.where(overflowed, values, rounded)[()]  # [()]: a scalar stays a scalar
