"""Argument checks shared by the engine's public functions.

They turn whatever the caller passed into a float array of the engine's working dtype
(float32 stays float32, everything else becomes float64) and raise ``AttentionError``
naming the argument when a rank, a dimension or a value is wrong.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection

import numpy as np

from .errors import AttentionError

FLOAT32, FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)


def all_finite(array: np.ndarray) -> bool:
    """Whether no value is NaN or infinite.

    On a small array a byte search of the mask for a False is the cheaper test: a numpy reduction
    (``np.isfinite(a).all()``, ``np.logical_and.reduce``) first sets up its iterator, which costs more
    than the test itself on the engine's demo-sized arrays. On a large one the reduction is faster (the
    copy to bytes is not free).
    """
    finite = np.isfinite(np.asarray(array))  # asarray: a masked array's hidden values count, as in the reduction
    if finite.size <= SMALL_CHECK:
        return b"\x00" not in finite.tobytes()
    return bool(np.logical_and.reduce(finite, axis=None))


SMALL_CHECK = 1 << 14  # elements: up to here all_finite searches bytes, well below where the reduction wins


def working_dtype(*arrays: np.ndarray) -> np.dtype:
    """float32 when every input is float32, float64 otherwise (the seed's precision)."""
    for array in arrays:  # a loop, not all(<generator>): called on every engine call
        if array.dtype != FLOAT32:
            return FLOAT64
    return FLOAT32 if arrays else FLOAT64


def as_real_array(value, name: str, min_rank: int = 1) -> np.ndarray:
    """``value`` as a real (non-boolean) numeric array of rank >= ``min_rank``, all finite.

    float32 is kept; other real types are converted to float64 later by ``working_dtype``.
    """
    array = np.asarray(value)
    if array.dtype.kind not in "fiu":  # refuses bool (kind b), complex, strings...; cheaper than `dtype == bool`
        raise AttentionError(name, f"expected a real numeric array, got dtype {array.dtype}")
    if array.ndim < min_rank:
        raise AttentionError(name, f"expected rank >= {min_rank}, got shape {array.shape}")
    if array.size == 0:
        raise AttentionError(name, f"expected no empty axis, got shape {array.shape}")
    if array.dtype.kind == "f" and not all_finite(array):
        raise AttentionError(name, "values must be finite (no NaN or infinity)")
    return array


def in_working_dtype(array: np.ndarray, name: str) -> np.ndarray:
    """One checked array in its own working dtype: float32 and float64 as they are, others as float64."""
    if array.dtype == FLOAT64 or array.dtype == FLOAT32:  # the usual case: no helper calls
        return array
    return to_working(array, working_dtype(array), name)


def to_working(array: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """``array`` (checked by :func:`as_real_array`) in the working ``dtype``. Finite values of a wider
    float (float64 weights for a float32 request, a np.longdouble input) that ``dtype`` cannot hold are
    refused by name, not turned into infinities (with numpy's overflow warning)."""
    if array.dtype == dtype:
        return array
    with np.errstate(over="ignore"):
        cast = array.astype(dtype)
    if array.dtype.kind == "f" and array.dtype.itemsize > dtype.itemsize and not all_finite(cast):
        raise AttentionError(name, f"values beyond the range of {dtype}")
    return cast


def as_bool_mask(mask, name: str, target: tuple[int, ...]) -> np.ndarray:
    """A boolean mask (True = may attend) that broadcasts to ``target`` (..., n_q, n_k)."""
    array = np.asarray(mask)
    if array.dtype.kind != "b":
        raise AttentionError(name, f"expected a boolean array (True = may attend), got dtype {array.dtype}")
    try:
        fits = np.broadcast_shapes(array.shape, target) == tuple(target)
    except ValueError:
        fits = False
    if not fits or array.ndim < 1:
        raise AttentionError(name, f"shape {array.shape} does not broadcast to {tuple(target)} (..., n_q, n_k)")
    return array


def _int_from(value, name: str, minimum: int, expected: str) -> int:
    """``value`` as a Python int >= ``minimum`` (booleans and fractions refused)."""
    if type(value) is int and value >= minimum:  # the usual case, without the costlier ABC check below
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise AttentionError(name, f"expected {expected}, got {value!r}")
    return int(value)


def positive_int(value, name: str) -> int:
    """A strictly positive Python int (booleans and fractions refused)."""
    return _int_from(value, name, 1, "a positive integer")


def seed_int(value, name: str = "seed") -> int:
    """A non-negative integer seed for ``np.random.default_rng``."""
    return _int_from(value, name, 0, "a non-negative integer")


def check_shape(array: np.ndarray, name: str, expected: tuple[int, ...], meaning: str) -> None:
    """Raise unless ``array.shape == expected``; ``meaning`` spells the axes, e.g. '(d_model, d_k)'."""
    if array.shape != tuple(expected):
        raise AttentionError(name, f"expected shape {meaning} = {tuple(expected)}, got {array.shape}")


def chosen_layers(layers: Collection[int] | None, n_layers: int, argument: str) -> Collection[int]:
    """The layers chosen (None: all), each checked: AttentionError naming ``argument`` for one outside the model."""
    if layers is None:
        return range(n_layers)
    chosen = frozenset(layers)
    if any(not 0 <= layer < n_layers for layer in chosen):
        raise AttentionError(argument, f"expected layers in [0, {n_layers}), got {sorted(chosen)}")
    return chosen
