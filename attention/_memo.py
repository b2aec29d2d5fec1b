"""A least-recently-used memo bounded by bytes, for seeded weights.

A service builds the same seeded layer on every request; drawing a d_model=512 model's
weights again costs about as much as a quarter of its attention. Keeping the last few
draws makes that free, and a byte budget (not an entry count) keeps a worker's memory
bounded whatever the model sizes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from cachetools import LRUCache, cached

Value = TypeVar("Value")


class ByteBudgetMemo(Generic[Value]):
    """Memoise ``build(*key)`` results while their total ``size_of`` stays within ``max_bytes``.

    cachetools' LRUCache sized by ``size_of``: a value larger than the budget is built and returned but never
    kept; two threads missing one key both build it and the first one stored is kept (``setdefault``)."""

    def __init__(self, build: Callable[..., Value], size_of: Callable[[Value], int], max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._cache: LRUCache[Hashable, Value] = LRUCache(maxsize=max_bytes, getsizeof=size_of)
        self._memoised = cached(self._cache, key=lambda *key: key, lock=threading.Lock())(build)

    def __call__(self, *key: Hashable) -> Value:
        return self._memoised(*key)

    def clear(self) -> None:
        self._memoised.cache_clear()
