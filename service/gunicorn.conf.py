"""gunicorn settings: ``gunicorn -c service/gunicorn.conf.py service.wsgi:app``.

Every setting can be overridden by an environment variable (default in brackets):
HOST [127.0.0.1], PORT [8000], WEB_CONCURRENCY [one worker per core], GUNICORN_TIMEOUT [30 s],
GUNICORN_GRACEFUL_TIMEOUT [20 s], GUNICORN_MAX_REQUESTS [10000], GUNICORN_MAX_REQUESTS_JITTER [1000],
GUNICORN_ACCESSLOG [off; "-" for stdout], GUNICORN_LOGLEVEL [info], GUNICORN_MALLOC_KEEP_MB [64],
and the BLAS thread variables OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS [1].
"""

import os

# Workers are the parallelism: one BLAS thread each, set before any worker imports numpy.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
worker_class = "sync"  # numpy work is CPU-bound: one request per process at a time
workers = int(os.environ.get("WEB_CONCURRENCY", len(os.sched_getaffinity(0))))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))  # the limits keep a request far below this
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
# Recycle workers now and then (leaks), but not so often that restarts show up as latency spikes.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "10000"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "1000"))
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")

# glibc hands multi-MB buffers back to the kernel on free, so every request page-faults its tensors,
# weights and answer bytes in again (~40% of a 16 MiB-weights request here). Keep freed blocks up to
# GUNICORN_MALLOC_KEEP_MB [64; 0 = glibc's defaults] in each worker's heap instead.
malloc_keep_mb = int(os.environ.get("GUNICORN_MALLOC_KEEP_MB", "64"))


def post_fork(server, worker) -> None:
    """In each worker: glibc mallopt, M_MMAP_THRESHOLD (-3) and M_TRIM_THRESHOLD (-1); skipped off glibc."""
    if malloc_keep_mb <= 0:
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    keep = malloc_keep_mb * 1024 * 1024
    libc.mallopt(-3, keep)  # blocks below this come from the heap, not a fresh mmap
    libc.mallopt(-1, 2 * keep)  # and the heap's free top is not returned below this
