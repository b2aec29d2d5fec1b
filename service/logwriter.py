"""The per-request log lines, written to stdout in batches instead of one write per request.

Through gunicorn, a write per request cost ~20 µs of a demo-sized request's ~550 µs of worker CPU
(the system call, and the file system's bookkeeping when stdout is a file): ~4% of throughput.
nginx's ``access_log ... buffer= flush=`` makes the same trade. Lines wait in memory until they
would make a batch larger than LOG_BUFFER_BYTES, for at most LOG_FLUSH_SECONDS (a timer thread
flushes an idle worker), and are written at exit, which gunicorn's graceful stops, worker recycling
and timeouts (SIGABRT) all reach: only a SIGKILL loses lines, at most one interval's.

A batch is never larger than PIPE_BUF (4096 bytes) by default, so on a pipe (docker's stdout) the
batches of different workers never interleave, as single lines never did.

A write that fails (stdout closed or full) loses its lines and is reported on the app log (stderr);
requests and the timer go on.

Env: LOG_BUFFER_BYTES [4096], LOG_FLUSH_SECONDS [1]; either <= 0 writes every line at once.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time

STDOUT = 1  # the fd, not sys.stdout: whatever wraps sys.stdout, one unbuffered write per batch
PIPE_BUF = 4096  # POSIX: writes up to this size to a pipe are atomic


class LineWriter:
    """Lines (bytes, newline-terminated) to a file descriptor, in batches of at most ``max_bytes``
    (a longer line goes alone), each line waiting at most ``max_seconds`` (either <= 0: every line at
    once). Thread-safe; a forked child starts with nothing pending (the parent writes its own lines)."""

    def __init__(self, fd: int, max_bytes: int = PIPE_BUF, max_seconds: float = 1.0) -> None:
        self.fd, self.max_bytes, self.max_seconds = fd, max_bytes, max_seconds
        self._start_empty()
        os.register_at_fork(after_in_child=self._start_empty)  # a fork copies neither the lock's holder nor the timer
        atexit.register(self.flush)

    def _start_empty(self) -> None:
        self._lines: list[bytes] = []
        self._size = 0
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None

    def write(self, line: bytes) -> None:
        """Add one line; written when the batch is full, within ``max_seconds``, or at exit."""
        if self.max_bytes <= 0 or self.max_seconds <= 0:
            self._write(line)
            return
        with self._lock:
            if self._size + len(line) > self.max_bytes:
                self._flush_locked()
            self._lines.append(line)
            self._size += len(line)
            if self._timer is None:  # the first line in this process: start the clock
                self._timer = threading.Thread(target=self._flush_every_interval, name="log-flush", daemon=True)
                self._timer.start()

    def flush(self) -> None:
        """Write every pending line now."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._lines:
            batch = b"".join(self._lines)
            self._lines.clear()
            self._size = 0
            self._write(batch)

    def _write(self, data: bytes) -> None:
        try:
            _write_all(self.fd, data)
        except OSError as error:
            logging.getLogger(__name__).error("%d bytes of request log lines lost: %s", len(data), error)

    def _flush_every_interval(self) -> None:
        while True:
            time.sleep(self.max_seconds)
            self.flush()


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a signal can interrupt a write to a pipe part-way)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@functools.cache
def stdout_lines() -> LineWriter:
    """This process's writer to stdout (shared by every app in it), configured by LOG_BUFFER_BYTES and
    LOG_FLUSH_SECONDS when first asked for."""
    return LineWriter(STDOUT, int(os.environ.get("LOG_BUFFER_BYTES", str(PIPE_BUF))),
                      float(os.environ.get("LOG_FLUSH_SECONDS", "1")))
