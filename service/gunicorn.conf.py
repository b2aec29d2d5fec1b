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

import contextlib
import fcntl
import glob
import os
import re
import shutil
import struct
import tempfile
import time

# Workers are the parallelism: one BLAS thread each, set before any worker imports numpy.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

from service.runtime import malloc  # noqa: E402

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

# Prometheus multiprocess mode: each worker writes its metrics to files in this directory, which
# must exist before anything imports prometheus_client (the master does, with preload_app) and be
# emptied first (stale files of dead pids would be summed). So: here, when the config is loaded.
# A directory the operator names is only emptied of metrics files (*.db), never removed; and only at
# the first load in this master: a configuration reload (SIGHUP) must not wipe the live workers' files.
# An upgrade in place (USR2) runs a new master beside this one until the operator stops one of them:
# neither may empty or remove what the other's workers write. The new master (GUNICORN_PID set) keeps
# a named directory's files (so its counters go on), never gets this master's own directory (pre_exec),
# and a master with a partner leaves a named directory's files at exit (on_exit).
_own_dir = os.path.join(tempfile.gettempdir(), f"attention-metrics-{os.getpid()}")
metrics_dir = os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", _own_dir)


def _remove_metrics_files() -> None:
    for stale in glob.glob(os.path.join(metrics_dir, "*.db")):
        os.remove(stale)


os.makedirs(metrics_dir, exist_ok=True)
if os.environ.get("ATTENTION_METRICS_MASTER") != f"{os.getpid()}:{metrics_dir}":
    os.environ["ATTENTION_METRICS_MASTER"] = f"{os.getpid()}:{metrics_dir}"
    if metrics_dir == _own_dir or "GUNICORN_PID" not in os.environ:
        _remove_metrics_files()  # stale files of dead pids would be summed in


def child_exit(server, worker):  # master, after a worker exited (recycled, killed, timed out)
    from prometheus_client import multiprocess

    try:
        multiprocess.mark_process_dead(worker.pid)  # its in-flight gauge no longer counts
        _fold_exited_workers()
    except Exception:  # e.g. a full disk: the files stay, still counted, and the master goes on
        server.log.exception("could not tidy exited workers' metrics files")


# Exited workers' counter and histogram files are added up into <kind>_exited.db, one per kind: left
# there, every recycled or killed worker's two files stayed for good, and a scrape reads every file
# (~0.2 ms each: 0.22 s after 500 exited workers, seconds after weeks). Here, not in service.runtime.metrics:
# with GUNICORN_PRELOAD=0 the master must not import the app (a SIGHUP would no longer reload it).
_PER_PROCESS = re.compile(r"(counter|histogram)_(\d+)\.db")
_FOLD_WAIT_SECONDS = 0.5  # this loop also times out stuck workers: never wait long for the lock


def _fold_exited_workers() -> None:
    """Fold the files of every process that no longer exists (this exited worker's, and any a busy lock left)
    under an exclusive flock on the directory, which scrapes share (service.runtime.metrics): each value seen once."""
    fd = os.open(metrics_dir, os.O_RDONLY)
    try:
        if not _lock_within(fd, _FOLD_WAIT_SECONDS):
            return  # scrapes are reading: the next worker exit folds these too
        exited: dict[str, list[str]] = {}
        for name in os.listdir(metrics_dir):
            if (match := _PER_PROCESS.fullmatch(name)) and not _exists(int(match[2])):
                exited.setdefault(match[1], []).append(os.path.join(metrics_dir, name))
        for kind, paths in exited.items():
            _fold(os.path.join(metrics_dir, f"{kind}_exited.db"), paths)
    finally:
        os.close(fd)  # and with it the lock


def _lock_within(fd: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # someone else's, or no pid at all (a stray file): not ours to fold
        pass
    return True


def _fold(total_path: str, paths: list[str]) -> None:
    """Add the values in ``paths`` into the file at ``total_path``, key by key, then remove them. All or nothing:
    the new total is written with plain writes (a full disk raises; prometheus-client's mmap writes would kill
    the master with SIGBUS) and swapped in whole before any file goes."""
    from prometheus_client.mmap_dict import MmapedDict

    totals: dict[str, list[float]] = {}
    for path in (total_path, *paths):
        if os.path.exists(path) and os.path.getsize(path):  # an empty one (killed while creating it) holds nothing
            for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(path):
                total = totals.setdefault(key, [0.0, 0.0])
                total[0] += value
                total[1] = max(total[1], timestamp)
    partial = os.path.join(os.path.dirname(total_path), ".exited.partial")  # not *.db: no scrape lists it
    try:
        with open(partial, "wb") as out:
            out.write(_metrics_file(totals))
        os.replace(partial, total_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
    for path in paths:
        os.remove(path)


def _metrics_file(values: dict[str, list[float]]) -> bytes:
    """prometheus-client's file layout (see MmapedDict): the bytes used (int32) and 4 padding bytes, then per key
    its length (int32), the UTF-8 key padded with spaces to 8-byte alignment, the value and timestamp (doubles)."""
    entries = []
    for key, (value, timestamp) in values.items():
        encoded = key.encode()
        padded = encoded + b" " * (8 - (len(encoded) + 4) % 8)
        entries.append(struct.pack(f"i{len(padded)}sdd", len(encoded), padded, value, timestamp))
    body = b"".join(entries)
    return struct.pack("ii", 8 + len(body), 0) + body


def pre_exec(server):  # the new master of an upgrade in place (USR2), before it execs
    # After a SIGHUP, the environment it is given holds this master's variables: it makes its own directory.
    server.cfg.env_orig.pop("ATTENTION_METRICS_MASTER", None)
    if server.cfg.env_orig.get("PROMETHEUS_MULTIPROC_DIR") == _own_dir:
        del server.cfg.env_orig["PROMETHEUS_MULTIPROC_DIR"]


def _partner_alive(server) -> bool:
    """Whether the other master of an upgrade in place still runs. gunicorn's own marks lag: master_pid stays set
    until the loop notices the old master left (~1 s), reexec_pid until the new one is reaped. (Both masters
    stopped at once each see the other alive: the files stay until the next start empties them.)"""
    if server.master_pid and server.master_pid == os.getppid():  # the old master, our parent, is still there
        return True
    if server.reexec_pid:  # the new master, our child: running unless waitpid reaps it now
        try:
            return os.waitpid(server.reexec_pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False
    return False


def on_exit(server):
    if metrics_dir == _own_dir:
        shutil.rmtree(metrics_dir, ignore_errors=True)  # nobody else's
    elif not _partner_alive(server):  # else the other master's workers still write there
        _remove_metrics_files()


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
