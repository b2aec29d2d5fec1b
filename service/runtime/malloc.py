"""glibc heap settings for gunicorn's workers: keep freed multi-MB buffers, trim after a very large answer.

glibc returns multi-MB blocks to the kernel on free, so each request page-faulted its tensors, weights and answer
in again; kept in the heap up to ``keep_mb`` they are reused. Blocks freed *below* live ones are never returned,
so after an answer of TRIM_AFTER_BYTES or more ``malloc_trim`` gives back all but the kept top.
"""

from __future__ import annotations

TRIM_AFTER_BYTES = 16 * 1024 * 1024
# glibc's mallopt parameters
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


class MallocTuning:
    """gunicorn's ``post_fork`` and ``post_request`` hooks for one config load; ``keep_mb <= 0``: glibc's defaults."""

    def __init__(self, keep_mb: int) -> None:
        self.keep_mb = keep_mb
        self.applied: tuple | None = None  # in a worker with the settings applied: (libc, bytes kept)

    def post_fork(self, server, worker) -> None:
        """In each worker: mallopt, skipped off glibc."""
        if self.keep_mb <= 0:
            return
        import ctypes

        try:
            libc = ctypes.CDLL("libc.so.6")
        except OSError:
            return
        keep = self.keep_mb * 1024 * 1024
        libc.mallopt(M_MMAP_THRESHOLD, keep)  # blocks below this come from the heap, not a fresh mmap
        libc.mallopt(M_TRIM_THRESHOLD, 2 * keep)  # and the heap's free top is not returned below this
        libc.mallopt(M_TOP_PAD, keep)  # nor, when it is, all of it: a trim keeps this much mapped
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        self.applied = (libc, keep)

    def post_request(self, worker, req, environ, resp) -> None:
        """After an answer of TRIM_AFTER_BYTES or more: malloc_trim, keeping the top the settings keep."""
        if self.applied and resp.sent >= TRIM_AFTER_BYTES:
            libc, keep = self.applied
            libc.malloc_trim(keep)
