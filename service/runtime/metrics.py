"""Prometheus metrics of the service (no Flask here: compute code and batch can call the hooks).

Under gunicorn the metrics are in prometheus-client's multiprocess mode: service.runtime.metrics_dir sets
PROMETHEUS_MULTIPROC_DIR (and empties it) before any worker imports prometheus_client, marks dead
workers and folds their files into one per kind; :func:`exposition` then sums every worker's files,
so a scrape that lands on any worker sees the whole instance. Without that variable (tests,
``flask run``) the process's own registry is served. Labels are bounded: ``route`` is the URL rule
(``/v1/demos/<string:name>``), never the raw path; unmatched paths share one label. Every update goes
through prometheus-client's own methods, at once.
"""

from __future__ import annotations

import fcntl
import glob
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

UNMATCHED = "<unmatched>"  # the route label of 404s and 405s: raw paths would be unbounded
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = tuple(float(4**k) for k in range(3, 13))  # 64 B .. 16 MiB (the default body limit)
ELEMENT_BUCKETS = tuple(float(16**k) for k in range(1, 7))  # 16 .. 16.7 M attention weights
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0)

REQUESTS = Counter("http_requests", "HTTP requests answered, by route (URL rule), method and status.",
                   ["route", "method", "status"])
LATENCY = Histogram("http_request_duration_seconds", "Time from the request reaching the app to the response "
                    "being ready, by route.", ["route", "method"], buckets=LATENCY_BUCKETS)
REQUEST_SIZE = Histogram("http_request_size_bytes", "Request body size (Content-Length, at most max_body_bytes + 1), "
                         "by route.", ["route"], buckets=SIZE_BUCKETS)
RESPONSE_SIZE = Histogram("http_response_size_bytes", "Response body size, by route.", ["route"],
                          buckets=SIZE_BUCKETS)
IN_FLIGHT = Gauge("http_requests_in_flight", "Requests being answered now (summed over live workers).",
                  multiprocess_mode="livesum")
# Its _sum is the attention weights computed in all (a separate counter of them was one more write per request).
ELEMENTS = Histogram("attention_weight_elements_per_request", "Attention weights per engine call (B*h*n_q*n_k, "
                     "summed over layers) of requests that passed every limit and were computed.",
                     buckets=ELEMENT_BUCKETS)
BATCH_ITEMS = Histogram("batch_items", "Items per /v1/batch request.", buckets=BATCH_BUCKETS)


_held: ContextVar[list[int] | None] = ContextVar("held", default=None)


@contextmanager
def unrecorded() -> Iterator[list[int]]:
    """Compute without counting: the engine calls made inside are held in the yielded list instead.

    For work that is nobody's (the documented examples, computed at start-up), or that may be
    thrown away (a batch's stacked call, recomputed item by item if it fails: see :func:`record`).
    """
    held: list[int] = []
    token = _held.set(held)
    try:
        yield held
    finally:
        _held.reset(token)


def count_elements(elements: int) -> None:
    """Record one engine call computing ``elements`` attention weights (B*h*n_q*n_k per layer)."""
    held = _held.get()
    if held is not None:
        held.append(elements)
        return
    ELEMENTS.observe(elements)


def record(held: list[int]) -> None:
    """Record engine calls held by :func:`unrecorded` after all (the work was kept)."""
    for elements in held:
        count_elements(elements)


def observe_batch(items: int) -> None:
    """Record the number of items of one batch request."""
    BATCH_ITEMS.observe(items)


class SizedFilesCollector(multiprocess.MultiProcessCollector):
    """prometheus-client's collector, minus the metrics files that are still empty.

    A process creates its file and only then sizes it (MmapedDict.__init__), so for a moment the file
    has 0 bytes; prometheus-client 0.26 fails the whole scrape on it (struct.error: its issue #1199),
    and for good if the process was killed in that moment. An empty file holds no values yet, and a
    file never shrinks, so skipping the ones empty when listed loses nothing and races nothing.
    """

    def __init__(self, registry: CollectorRegistry, path: str) -> None:
        super().__init__(registry, path)
        self.directory = path

    def collect(self) -> Iterable[Metric]:
        with _scrape_lock(self.directory):  # never halfway through a fold: each value counted once
            return self.merge([path for path in glob.glob(os.path.join(self.directory, "*.db")) if _has_bytes(path)])


def _has_bytes(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except FileNotFoundError:  # a dead worker's live gauge, removed since the listing
        return False


@contextmanager
def _scrape_lock(directory: str) -> Iterator[None]:
    """A shared flock on the metrics directory itself (no lock file left in it): scrapes share it; the gunicorn
    master's fold of exited workers' files (metrics_dir.MetricsDirectory) takes it alone."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # and with it the lock


def exposition(collectors: Iterable[Collector] = ()) -> tuple[bytes, str]:
    """The Prometheus text exposition and its content type: every worker's metrics in multiprocess mode, then what
    ``collectors`` read for this scrape only (the edge's batch-jobs census: the runtime does not know the jobs)."""
    registry = CollectorRegistry()
    if directory := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # prometheus-client's own variable
        SizedFilesCollector(registry, directory)
    else:
        registry.register(REGISTRY)  # a registry is a collector too: this process's own metrics
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST
