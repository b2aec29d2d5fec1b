"""gunicorn settings: ``gunicorn -c service/gunicorn.conf.py service.wsgi:app``.

Every value comes from service.settings (docs/configuration.md lists the variables); the hooks are
service.runtime.server's.
"""

from service.runtime import process  # noqa: F401, I001  (first: one BLAS thread a process, before numpy is imported)
from service.runtime import cpus
from service.runtime.server import Hooks
from service.settings import current

_settings = current()
_server = _settings.server

bind = f"{_server.host}:{_server.port}"
worker_class = "sync"  # numpy work is CPU-bound: one request per process at a time
# In a pod the affinity is the node's cores: 64 workers of ~150 MiB for a 2-CPU limit. The quota says what it gets.
workers = _server.workers or cpus.default_workers()
timeout = _server.timeout  # the limits keep a request far below this
graceful_timeout = _server.graceful_timeout
# Recycle workers now and then (leaks), but not so often that restarts show up as latency spikes.
max_requests = _server.max_requests
max_requests_jitter = _server.max_requests_jitter
accesslog = _server.accesslog  # the app writes its own JSON line per request
# The admin socket is one path per user: replicas on one host took it from each other. Nothing uses it.
control_socket_disable = True
# gunicorn answers a longer request line itself (problem+json: gunicorn_patches); up to it, the app does.
limit_request_line = 8190
loglevel = _server.loglevel
# Workers fork from the loaded app: a recycled one serves in milliseconds, not after 1-2 s of imports.
preload_app = _server.preload

_hooks = Hooks(_settings)
on_starting, on_exit = _hooks.on_starting, _hooks.on_exit
post_fork, post_request = _hooks.post_fork, _hooks.post_request
pre_exec, child_exit = _hooks.pre_exec, _hooks.child_exit
