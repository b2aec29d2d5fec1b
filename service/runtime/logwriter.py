"""The per-request log lines, written to stdout in batches instead of one write per request.

A write per request costs a system call (and the file system's bookkeeping when stdout is a file) on every
request; nginx's ``access_log ... buffer= flush=`` makes the same trade. Lines wait in memory until they
would make a batch larger than LOG_BUFFER_BYTES, for at most LOG_FLUSH_SECONDS (a timer thread
flushes an idle worker), and are written at exit (service.deferred: only a SIGKILL loses lines, at
most one interval's).

A batch is never larger than PIPE_BUF (4096 bytes) by default, so on a pipe (docker's stdout) the
batches of different workers never interleave, as single lines never did.

A write that fails (stdout closed or full) loses its lines and is reported on the app log (stderr);
requests and the timer go on.

Settings: LOG_BUFFER_BYTES [4096], LOG_FLUSH_SECONDS [1]; either <= 0 writes every line at once.
"""

from __future__ import annotations

import functools
import logging
import os

from service.runtime.deferred import Deferred
from service.settings import current

STDOUT = 1  # the fd, not sys.stdout: whatever wraps sys.stdout, one unbuffered write per batch
PIPE_BUF = 4096  # POSIX: writes up to this size to a pipe are atomic


class LineWriter(Deferred):
    """Lines (bytes, newline-terminated) to a file descriptor, in batches of at most ``max_bytes``
    (a longer line goes alone), each line waiting at most ``max_seconds`` (either <= 0: every line at
    once). Thread-safe; a forked child starts with nothing pending (the parent writes its own lines)."""

    def __init__(self, fd: int, max_bytes: int = PIPE_BUF, max_seconds: float = 1.0) -> None:
        self.fd, self.max_bytes = fd, max_bytes
        super().__init__(max_seconds if max_bytes > 0 else 0)

    def _reset(self) -> None:
        self._lines: list[bytes] = []
        self._size = 0

    def write(self, line: bytes) -> None:
        """Add one line; written when the batch is full, within ``max_seconds``, or at exit."""
        if self.max_seconds <= 0:
            self._write(line)
            return
        with self._lock:
            if self._size + len(line) > self.max_bytes:
                self._apply()
            self._lines.append(line)
            self._size += len(line)
            self._added()

    def _apply(self) -> None:
        if self._lines:
            batch = b"".join(self._lines)
            self._reset()
            self._write(batch)

    def _write(self, data: bytes) -> None:
        try:
            _write_all(self.fd, data)
        except OSError as error:
            logging.getLogger(__name__).error("%d bytes of request log lines lost: %s", len(data), error)


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a signal can interrupt a write to a pipe part-way)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@functools.cache
def stdout_lines() -> LineWriter:
    """This process's writer to stdout (shared by every app in it), configured by LOG_BUFFER_BYTES and
    LOG_FLUSH_SECONDS (service.settings) when first asked for."""
    settings = current().observability
    return LineWriter(STDOUT, settings.log_buffer_bytes, settings.log_flush_seconds)
