"""Comparisons of computed answers that allow what the BLAS kernel decides: the last digits.

OpenBLAS picks its kernel by processor (SkylakeX on one machine, Haswell, forced by OPENBLAS_CORETYPE, on another),
and a kernel's sums depend on the matrix shapes: a padded batch of three sentences and each sentence alone, or
openapi.yaml's examples computed on one machine and the answers on another, differ by a few float32 units in the
last place, and a value rounded to 3 decimals by one unit at most.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import numpy as np

FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}  # a few float32 units in the last place (eps 1.2e-7) of values near 1
EXAMPLE = {"rtol": 1e-5, "atol": 1.000001e-3}  # a documented answer, its numbers to 3 decimals (one unit apart)
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
DECIMALS = re.compile(r"-?\d+\.(\d+)")  # a NUMBER's printed decimals


def assert_close(got: Any, want: Any, where: str = "", rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """``got`` equals ``want`` (parsed JSON), numbers within ``rtol``/``atol``, everything else exactly."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            assert_close(got[key], want[key], f"{where}/{key}", rtol, atol)
    elif isinstance(want, list) and want and not isinstance(want[0], (dict, str)):
        np.testing.assert_allclose(np.asarray(got, float), np.asarray(want, float), rtol=rtol, atol=atol,
                                   err_msg=where)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (left, right) in enumerate(zip(got, want, strict=True)):
            assert_close(left, right, f"{where}/{i}", rtol, atol)
    elif isinstance(want, float):
        assert np.isclose(got, want, rtol=rtol, atol=atol), (where, got, want)
    else:
        assert got == want, where


def assert_text_close(got: str, want: str, rtol: float = FLOAT32["rtol"]) -> None:
    """``got`` is ``want`` letter for letter outside its decimal numbers, and each number within ``rtol`` or one
    unit of its last printed decimal (an SVG's data-value, a YAML example's 3-decimal weight)."""
    assert NUMBER.split(got) == NUMBER.split(want), "the texts differ outside their numbers"
    for left, right in zip(NUMBER.findall(got), NUMBER.findall(want), strict=True):
        unit = 10.0 ** -min(len(DECIMALS.match(number)[1]) for number in (left, right))
        assert abs(float(left) - float(right)) <= max(rtol * abs(float(right)), 1.000001 * unit), (left, right)


def _unit(*written: str) -> float:
    """One unit of the last decimal written in the shorter of ``written`` (``1.25e-07`` -> 1e-09)."""
    return max(10.0 ** Decimal(number).as_tuple().exponent for number in written)


def assert_documents_match(got: Any, want: Any, where: str = "", example: bool = False) -> None:
    """Two OpenAPI documents (plain JSON values) are equal, exactly outside their examples; inside an ``example``,
    each number (a float, or a decimal number inside a text) within one unit of its last written decimal: the
    digits another BLAS kernel may move (service.edge.examples writes them short)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), (where, sorted(set(got) ^ set(want)))
        for key in want:
            assert_documents_match(got[key], want[key], f"{where}/{key}", example or key == "example")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (left, right) in enumerate(zip(got, want, strict=True)):
            assert_documents_match(left, right, f"{where}/{i}", example)
    elif example and isinstance(want, float) and isinstance(got, float):
        assert abs(got - want) <= 1.000001 * _unit(repr(got), repr(want)), (where, got, want)
    elif example and isinstance(want, str) and isinstance(got, str):
        assert NUMBER.split(got) == NUMBER.split(want), (where, "the texts differ outside their numbers")
        for left, right in zip(NUMBER.findall(got), NUMBER.findall(want), strict=True):
            assert abs(float(left) - float(right)) <= 1.000001 * _unit(left, right), (where, left, right)
    else:
        assert got == want and type(got) is type(want), (where, got, want)
