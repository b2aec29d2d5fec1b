"""gunicorn settings: ``gunicorn -c service/gunicorn.conf.py service.wsgi:app``.

Every setting can be overridden by an environment variable (default in brackets):
HOST [127.0.0.1], PORT [8000], WEB_CONCURRENCY [one worker per core], GUNICORN_TIMEOUT [30 s],
GUNICORN_GRACEFUL_TIMEOUT [20 s], GUNICORN_MAX_REQUESTS [10000], GUNICORN_MAX_REQUESTS_JITTER [1000],
GUNICORN_ACCESSLOG [off; "-" for stdout], GUNICORN_LOGLEVEL [info], and the BLAS thread
variables OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS [1].
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
