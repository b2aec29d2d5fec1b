"""gunicorn settings: ``gunicorn -c service/gunicorn.conf.py service.wsgi:app``.

Every setting can be overridden by an environment variable (default in brackets):
HOST [127.0.0.1], PORT [8000], WEB_CONCURRENCY [one worker per core], GUNICORN_TIMEOUT [30 s],
GUNICORN_GRACEFUL_TIMEOUT [20 s], GUNICORN_MAX_REQUESTS [10000], GUNICORN_MAX_REQUESTS_JITTER [1000],
GUNICORN_ACCESSLOG [off; "-" for stdout; the app writes its own JSON line per request],
GUNICORN_LOGLEVEL [info], GUNICORN_MALLOC_KEEP_MB [64], GUNICORN_PRELOAD [1], the BLAS thread variables
OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS [1], and PROMETHEUS_MULTIPROC_DIR [a fresh
directory per instance under $TMPDIR, removed at exit; one directory per instance, never shared: a
directory you name is emptied of *.db files at start and exit, not removed; the two masters of an
upgrade in place (USR2) share a named directory: the new one does not empty it, and a master leaves
it as it is while the other runs].
"""

import os

# Workers are the parallelism: one BLAS thread each, set before any worker imports numpy.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

from service.runtime import malloc  # noqa: E402
from service.runtime.metrics_dir import MetricsDirectory, metrics_file  # noqa: E402

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
worker_class = "sync"  # numpy work is CPU-bound: one request per process at a time
workers = int(os.environ.get("WEB_CONCURRENCY", len(os.sched_getaffinity(0))))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))  # the limits keep a request far below this
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
# Recycle workers now and then (leaks), but not so often that restarts show up as latency spikes.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "10000"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "1000"))
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
# gunicorn 25+'s admin socket (gunicornc: scale, reload, stop) is one path per user, each new master unlinking the
# last one's: replicas on one host took it from each other. Nothing here uses it: off.
control_socket_disable = True
# gunicorn answers a longer request line itself (problem+json: write_problem below); up to it, the app does.
limit_request_line = 8190
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")


# Freed multi-MB buffers stay in each worker's heap instead of being page-faulted in again per request.
malloc_keep_mb = int(os.environ.get("GUNICORN_MALLOC_KEEP_MB", "64"))
_malloc = malloc.MallocTuning(malloc_keep_mb)
post_fork, post_request = _malloc.post_fork, _malloc.post_request
TRIM_AFTER_BYTES = malloc.TRIM_AFTER_BYTES  # the tests read it through the loaded config

# Load the app once in the master and fork workers from it: a recycled worker (max_requests) is
# serving again in milliseconds instead of spending 1-2 s importing numpy, Flask and the schemas,
# which showed up as 150-300 ms p99 spikes under load. GUNICORN_PRELOAD=0 turns it off.
preload_app = os.environ.get("GUNICORN_PRELOAD", "1") != "0"

# Made and emptied here, at config load: before anything (a preloaded app) imports prometheus_client.
_metrics = MetricsDirectory.at_config_load()
metrics_dir = _metrics.path
pre_exec, child_exit, on_exit = _metrics.pre_exec, _metrics.child_exit, _metrics.on_exit
# The tests fold and write metrics files through the loaded config, as the master does.
_fold_exited_workers, _metrics_file = _metrics.fold_exited_workers, metrics_file


# One sendall per response (bodies up to ONE_WRITE_MAX): gunicorn writes the status line and headers,
# then the body, in two writes. A replica killed between them leaves nginx holding headers it already passed on, so it
# can no longer retry the request elsewhere (the client sees a truncated response; seen in
# tests/test_topology.py). Sending both at once also saves a syscall and a TCP segment per request.
from gunicorn.http import wsgi as _wsgi  # noqa: E402

ONE_WRITE_MAX = 1 << 20  # bodies up to this size are joined to the headers for one sendall


class _Capture:
    """Stands in for the socket while gunicorn writes the headers, keeping the bytes."""

    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


class OneWriteResponse(_wsgi.Response):
    """gunicorn's Response, sending the headers with the first body chunk (``_emit_body``, gunicorn 27)."""

    _held = b""

    def write(self, arg):
        if self.headers_sent:
            return super().write(arg)
        sock, self.sock = self.sock, _Capture()
        try:
            self.send_headers()
        finally:
            self.sock, self._held = sock, self.sock.data
        try:
            return super().write(arg)
        finally:
            if self._held:  # no body went out (HEAD, 204, an error): the headers still must
                held, self._held = self._held, b""
                self.sock.sendall(held)

    def _emit_body(self, data):
        held, self._held = self._held, b""
        if held and not self.chunked and len(data) <= ONE_WRITE_MAX:
            return self.sock.sendall(held + data)
        if held:  # a large body goes out in many segments anyway: no joining copy of it
            self.sock.sendall(held)
        return super()._emit_body(data)


_wsgi.Response = OneWriteResponse  # wsgi.create() builds every response from this module global


# What gunicorn's HTTP parser refuses before the app sees it (a malformed request line, method or header,
# a request line past limit_request_line, too many or too large headers, conflicting Content-Length and
# Transfer-Encoding...) it answers itself, in HTML. The same answer here as the app gives every other
# error: application/problem+json with a fresh X-Request-Id (the request's own could not be read).
from gunicorn import util as _util  # noqa: E402


def write_problem(sock, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's ``util.write_error``, writing an RFC 9457 problem instead of an HTML page. The title is
    the status's own phrase (gunicorn passes "Bad Request" with its 501 and 500)."""
    import http

    from service.edge.observability import fresh_id
    from service.problems import problem_bytes

    rid = fresh_id()
    title = http.HTTPStatus(status_int).phrase
    body = problem_bytes(status_int, title, (mesg or title)[:300], request_id=rid)
    head = (f"HTTP/1.1 {status_int} {title}\r\nConnection: close\r\nContent-Type: application/problem+json\r\n"
            f"X-Request-Id: {rid}\r\nContent-Length: {len(body)}\r\n\r\n")
    _util.write_nonblock(sock, head.encode("latin-1") + body)


_util.write_error = write_problem  # the workers call it as util.write_error
