"""Request ids, metrics and one JSON log line per request, by a WSGI middleware around the app (:func:`init_app`).

- ``X-Request-Id``: the client's when sane (1-128 chars of ``[A-Za-z0-9._-]``), else a fresh
  random one; on every response, in every problem body (``request_id``) and every log line.
- Metrics (service.runtime.metrics) per request: route (URL rule), method, status, latency, sizes, in flight.
  /metrics adds the batch jobs' census, read from their store at each scrape (:class:`JobsCollector`).
- Log: one JSON line per request on stdout, serialised by orjson (not ``logging``: its record and formatter
  machinery is a large share of a small request) and written in batches (service.runtime.logwriter); app logs
  (``logging``, stderr) are JSON lines too, with the request id of the request they were written in.

Middleware, not Flask hooks: it sees every answer (views, error handlers, routing errors) with the
environ and the status and headers in hand, without the cost of three hooks, ``g`` and the request proxies.

Settings (service.settings.Observability): LOG_REQUESTS [1; 0 turns the per-request line off], and
service.runtime.logwriter's.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
from flask import Flask, Response, current_app, has_request_context, request
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from werkzeug.wsgi import get_content_length

from service.edge.context import current_jobs
from service.jobs import census, queue
from service.jobs.context import Jobs
from service.runtime import metrics
from service.runtime.logwriter import LineWriter, stdout_lines
from service.runtime.requestid import fresh_id
from service.settings import Observability

HEADER = "X-Request-Id"
ENVIRON_KEY = "HTTP_" + HEADER.upper().replace("-", "_")  # where WSGI puts that request header
REQUEST_ID = "attention.request_id"  # where the middleware leaves the id for the app (problem bodies, logs)
SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})  # anything else: "other"


def request_id() -> str | None:
    """The current request's id (None outside a request)."""
    return request.environ.get(REQUEST_ID) if has_request_context() else None


@functools.lru_cache(maxsize=2)
def _second(epoch_second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_second))


def _now() -> str:
    """UTC now as ISO 8601 with milliseconds, e.g. 2026-11-30T07:48:00.123+00:00 (what
    ``datetime.isoformat(timespec="milliseconds")`` writes). The date and time are formatted once per
    second, not through datetime on every request."""
    second, micro = divmod(round(time.time() * 1e6), 1_000_000)  # to the microsecond first, as datetime
    return f"{_second(second)}.{micro // 1000:03d}+00:00"


class RequestObserver:
    """WSGI middleware: gives each request its id, and records its metrics and log line (to ``lines``;
    None: no line) once the app has answered. Latency is until the answer is ready (not sent)."""

    def __init__(self, app: Callable, lines: LineWriter | None, max_body_bytes: int) -> None:
        self.app = app
        self.lines = lines
        # A client may claim any Content-Length (2^64 is past what orjson writes); a body past the limit is
        # refused unread, so a request's size is recorded and logged as at most the limit + 1.
        self.max_recorded_bytes = max_body_bytes + 1
        self.children: dict[tuple[str, str, int], tuple] = {}  # labelled metrics: .labels() once per label set

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        sent = environ.get(ENVIRON_KEY)
        rid = environ[REQUEST_ID] = sent if sent and SANE_ID.fullmatch(sent) else fresh_id()
        started = time.perf_counter()
        answer: list = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
            headers.append((HEADER, rid))
            # The app's Request knows the matched URL rule; Flask drops it from the environ once answered.
            answer[:] = (status, headers, environ.get("werkzeug.request"))
            return start_response(status, headers, exc_info)

        metrics.IN_FLIGHT.inc()
        try:
            body = self.app(environ, start)
        finally:
            metrics.IN_FLIGHT.dec()
        if answer:  # Flask starts the response before it returns (WSGI would allow later: then unrecorded)
            status, headers, req = answer
            self._record(environ, req, rid, int(status[:3]), headers, time.perf_counter() - started)
        return body

    def _metrics(self, route: str, method: str, status: int) -> tuple:
        key = (route, method, status)
        if key not in self.children:  # bounded: routes x methods x statuses
            self.children[key] = (metrics.REQUESTS.labels(route, method, str(status)),
                                  metrics.LATENCY.labels(route, method), metrics.REQUEST_SIZE.labels(route),
                                  metrics.RESPONSE_SIZE.labels(route))
        return self.children[key]

    def _record(self, environ: dict[str, Any], req: Any, rid: str, status: int, headers: list[tuple[str, str]],
                seconds: float) -> None:
        rule = getattr(req, "url_rule", None)
        route = rule.rule if rule is not None else metrics.UNMATCHED
        method = environ.get("REQUEST_METHOD", "GET").upper()  # as werkzeug's request.method
        method = method if method in METHODS else "other"
        sent = min(get_content_length(environ) or 0, self.max_recorded_bytes)
        size = 0
        for name, value in headers:  # a loop, not next(<generator>): on every request
            if name == "Content-Length":
                size = int(value)
                break
        count, latency, request_size, response_size = self._metrics(route, method, status)
        count.inc()
        latency.observe(seconds)
        request_size.observe(sent)
        response_size.observe(size)
        if self.lines is not None:
            path = req.path if req is not None else environ.get("PATH_INFO", "")
            line = {"time": _now(), "level": "info", "event": "request", "request_id": rid, "method": method,
                    "route": route, "path": path[:256], "status": status,
                    "duration_ms": round(seconds * 1000, 3), "request_bytes": sent, "response_bytes": size}
            self.lines.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))


class JsonFormatter(logging.Formatter):
    """A log record as one JSON line, with the request id when written during a request."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": _now(), "level": record.levelname.lower(), "logger": record.name,
                                "message": record.getMessage(), "request_id": request_id()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def _install_json_logging() -> None:
    """App logs as JSON lines on stderr, unless something (pytest, an embedding app) configured logging."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(logging.INFO)


class JobsCollector:
    """The batch jobs' metrics, for one scrape: a census of the store (service.jobs.census), which every replica
    shares, so each tells the same (aggregate replicas with ``max``, not ``sum``). A store that does not answer
    (Redis down) leaves them out, logged, and ``batch_store_up`` says 0: the scrape still answers."""

    def __init__(self, jobs: Callable[[], Jobs]) -> None:
        self.jobs = jobs  # opened on first use in this process, so opening it is inside the census's guard

    def collect(self) -> Iterator[Metric]:
        try:
            found = census.counts(self.jobs())
        except queue.unreachable() as error:
            logging.getLogger(__name__).warning("the batch jobs' store did not answer the census: %s", error)
            yield GaugeMetricFamily("batch_store_up", STORE_UP, value=0)
            return
        yield GaugeMetricFamily("batch_store_up", STORE_UP, value=1)
        statuses = GaugeMetricFamily("batch_jobs", "Batches in the store by status (every status, 0 included).",
                                     labels=["status"])
        for status, count in found.batches.items():
            statuses.add_metric([status], count)
        yield statuses
        outcomes = CounterMetricFamily("batch_job_items", "Requests of batch jobs completed or failed so far, summed "
                                       "over the batches the store holds (read from it at each scrape: it falls, "
                                       "as a counter reset, only if batch records are removed).", labels=["outcome"])
        for outcome, count in found.requests.items():
            outcomes.add_metric([outcome], count)
        yield outcomes
        yield GaugeMetricFamily("batch_queue_depth", "Tasks waiting in the batch jobs' queue.", value=found.queued)


STORE_UP = "1 if the batch jobs' store answered this scrape's census, 0 if not (then no other batch_ metric)."


def metrics_view() -> Response:
    """GET /metrics: Prometheus text exposition of the whole instance (every worker), and the batch jobs' census."""
    served = current_app.extensions["jobs"].settings.served  # a KServe predictor has no jobs to count
    body, content_type = metrics.exposition([JobsCollector(current_jobs)] if served else [])
    return Response(body, content_type=content_type)


def init_app(app: Flask, settings: Observability) -> None:
    """Wrap ``app`` in the request observer (ids, metrics, log lines), serve /metrics, log app logs as JSON."""
    lines = stdout_lines() if settings.log_requests else None
    app.wsgi_app = RequestObserver(app.wsgi_app, lines, app.extensions["limits"].max_body_bytes)
    app.add_url_rule("/metrics", "metrics", metrics_view, methods=["GET"])
    _install_json_logging()
