"""Work a request produces but need not finish: collected in memory, applied in one go a little later.

The per-request log line and the per-request metric updates each cost more done one by one (a write
system call; a locked write to a memory-mapped file per value, 9 per request) than added up and applied
together. :class:`Deferred` is what both share: pending work is applied by ``flush()``, which runs
within ``max_seconds`` of the first pending item (a daemon timer thread per process), at exit (gunicorn's
graceful stops, worker recycling and timeouts (SIGABRT) all reach it: only a SIGKILL loses pending work,
at most one interval's) and whenever a reader asks. A forked child starts with nothing pending (the
parent applies its own). ``max_seconds <= 0``: no deferral, the subclass applies each item at once.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time


class Deferred:
    """Pending work under a lock, applied by :meth:`flush`. Subclasses define ``_reset`` (empty the
    pending state) and ``_apply`` (apply and empty it; called with the lock held), and call
    ``_added()`` with the lock held after adding to it."""

    def __init__(self, max_seconds: float) -> None:
        if not math.isfinite(max_seconds):  # time.sleep(inf or nan) would end the timer thread at once
            raise ValueError(f"an interval in seconds must be finite, got {max_seconds}")
        self.max_seconds = max_seconds
        self._start_empty()
        os.register_at_fork(after_in_child=self._start_empty)  # a fork copies neither the lock's holder nor the timer
        atexit.register(self.flush)

    def _start_empty(self) -> None:
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None
        self._reset()

    def _reset(self) -> None:
        raise NotImplementedError

    def _apply(self) -> None:
        raise NotImplementedError

    def _added(self) -> None:
        """Start the clock at the first pending item in this process."""
        if self._timer is None:
            self._timer = threading.Thread(target=self._flush_every_interval, name=f"{type(self).__name__}-flush",
                                           daemon=True)
            self._timer.start()

    def flush(self) -> None:
        """Apply every pending item now."""
        with self._lock:
            self._apply()

    def _flush_every_interval(self) -> None:
        while True:
            time.sleep(self.max_seconds)
            try:
                self.flush()
            except Exception:  # the timer must outlive one bad flush, or nothing pending is applied until exit
                logging.getLogger(__name__).exception("applying pending %s failed", type(self).__name__)
