"""A least-recently-used memo bounded by bytes, for seeded weights.

A service builds the same seeded layer on every request; drawing a d_model=512 model's
weights again costs about as much as a quarter of its attention. Keeping the last few
draws makes that free, and a byte budget (not an entry count) keeps a worker's memory
bounded whatever the model sizes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")


class ByteBudgetMemo(Generic[Value]):
    """Memoise ``build(*key)`` results while their total ``size_of`` stays within ``max_bytes``."""

    def __init__(self, build: Callable[..., Value], size_of: Callable[[Value], int], max_bytes: int) -> None:
        self._build, self._size_of, self.max_bytes = build, size_of, max_bytes
        self._entries: OrderedDict[Hashable, tuple[Value, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __call__(self, *key: Hashable) -> Value:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key][0]
        value = self._build(*key)
        size = self._size_of(value)
        if size <= self.max_bytes:
            with self._lock:
                if key in self._entries:                    # built meanwhile by another thread: keep that one
                    self._entries.move_to_end(key)
                    return self._entries[key][0]
                self._entries[key] = (value, size)
                self._bytes += size
                while self._bytes > self.max_bytes:         # evict the least recently used
                    _, (_, evicted) = self._entries.popitem(last=False)
                    self._bytes -= evicted
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
