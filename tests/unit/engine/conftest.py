"""What the engine's tests against torch share (the models themselves: tests/unit/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(scope="module")
def one_thread_each() -> Iterator[None]:
    """numpy's OpenBLAS and torch on one thread each, as the service and the benchmarks run them: on this 2-core
    machine two spinning pools made the decoder's tests several times slower (the cached decoding test: 11.5 s with
    two BLAS threads, 2.4 s with one). A module uses it with ``pytestmark = pytest.mark.usefixtures(...)``; torch
    is imported here, by the modules that need it, not by every engine test."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(threads)
