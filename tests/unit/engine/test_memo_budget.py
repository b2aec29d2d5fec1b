"""attention._memo.ByteBudgetMemo on cachetools: one object per key across threads, bytes bounded, clear()."""

from __future__ import annotations

import threading
import time

import numpy as np

from attention._memo import ByteBudgetMemo


def test_threads_missing_one_key_together_all_get_the_one_kept():
    built, start = [], threading.Barrier(4)

    def build(n: int) -> np.ndarray:
        built.append(n)
        time.sleep(0.01)                                             # every thread misses before any stores
        return np.zeros(n)

    memo = ByteBudgetMemo(build, lambda a: a.nbytes, max_bytes=8 * 10)
    got: list[np.ndarray] = []

    def call() -> None:
        start.wait()
        got.append(memo(4))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) >= 2 and all(value is got[0] for value in got)  # built twice or more, one kept
    assert memo(4) is got[0]
    memo(6)                                                          # 4 + 6 <= 10 elements: no phantom bytes
    assert memo(4) is got[0]


def test_clear_forgets_every_draw():
    built = []
    memo = ByteBudgetMemo(lambda n: built.append(n) or np.zeros(n), lambda a: a.nbytes, max_bytes=8 * 10)
    memo(2), memo(3)
    memo.clear()
    memo(2), memo(3)
    assert built == [2, 3, 2, 3]
