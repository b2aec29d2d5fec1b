"""gunicorn settings: ``gunicorn -c service/gunicorn.conf.py service.wsgi:app``. The hooks are service.runtime's.

Environment [default]: HOST [127.0.0.1], PORT [8000], WEB_CONCURRENCY [the cgroup's CPU quota rounded up, at most
the cores of the affinity; no quota: one per core (service.runtime.cpus)], GUNICORN_TIMEOUT [30],
GUNICORN_GRACEFUL_TIMEOUT [20], GUNICORN_MAX_REQUESTS [10000], GUNICORN_MAX_REQUESTS_JITTER [1000],
GUNICORN_ACCESSLOG [off; "-": stdout], GUNICORN_LOGLEVEL [info], GUNICORN_PRELOAD [1],
GUNICORN_MALLOC_KEEP_MB [64; 0: glibc's defaults], OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS [1],
PROMETHEUS_MULTIPROC_DIR [a fresh directory per instance under $TMPDIR; see service.runtime.metrics_dir],
ATTENTION_EMBEDDED_WORKERS [1; 0: none; job workers beside the web workers, see service.runtime.embedded].
"""

import os

# Workers are the parallelism: one BLAS thread each, set before any worker imports numpy.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

from service.runtime import cpus, embedded, gunicorn_patches, malloc  # noqa: E402
from service.runtime.metrics_dir import MetricsDirectory  # noqa: E402

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
worker_class = "sync"  # numpy work is CPU-bound: one request per process at a time
# In a pod the affinity is the node's cores: 64 workers of ~150 MiB for a 2-CPU limit. The quota says what it gets.
workers = int(os.environ["WEB_CONCURRENCY"]) if "WEB_CONCURRENCY" in os.environ else cpus.default_workers()
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))  # the limits keep a request far below this
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
# Recycle workers now and then (leaks), but not so often that restarts show up as latency spikes.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "10000"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "1000"))
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None  # the app writes its own JSON line per request
# The admin socket is one path per user: replicas on one host took it from each other. Nothing uses it.
control_socket_disable = True
# gunicorn answers a longer request line itself (problem+json: gunicorn_patches); up to it, the app does.
limit_request_line = 8190
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")
# Workers fork from the loaded app: a recycled one serves in milliseconds, not after 1-2 s of imports.
preload_app = os.environ.get("GUNICORN_PRELOAD", "1") != "0"

# Freed multi-MB buffers stay in each worker's heap instead of being page-faulted in again per request.
malloc_keep_mb = int(os.environ.get("GUNICORN_MALLOC_KEEP_MB", "64"))
_malloc = malloc.MallocTuning(malloc_keep_mb)
post_fork, post_request = _malloc.post_fork, _malloc.post_request

# Made and emptied here, at config load: before anything (a preloaded app) imports prometheus_client.
_metrics = MetricsDirectory.at_config_load()
metrics_dir = _metrics.path
pre_exec, child_exit = _metrics.pre_exec, _metrics.child_exit

# Huey consumers for the batch jobs, started by this master and stopped before its metrics directory goes.
_jobs = embedded.EmbeddedWorkers.at_config_load(graceful_timeout)
when_ready, on_exit = _jobs.when_ready, embedded.chain(_jobs.on_exit, _metrics.on_exit)

gunicorn_patches.install()
