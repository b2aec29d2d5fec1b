"""Prometheus metrics of the service (no Flask here: compute code and batch can call the hooks).

Under gunicorn the metrics are in prometheus-client's multiprocess mode: service.runtime.metrics_dir sets
PROMETHEUS_MULTIPROC_DIR (and empties it) before any worker imports prometheus_client, marks dead
workers and folds their files into one per kind; :func:`exposition` then sums every worker's files,
so a scrape that lands on any worker sees the whole instance. Without that variable (tests,
``flask run``) the process's own registry is served. Labels are bounded: ``route`` is the URL rule
(``/v1/demos/<string:name>``), never the raw path; unmatched paths share one label. Counter and
histogram updates go through :data:`TALLY` (added up, applied within METRICS_FLUSH_SECONDS [1]);
the in-flight gauge is written at once.
"""

from __future__ import annotations

import bisect
import fcntl
import functools
import glob
import logging
import operator
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
    values,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from service.runtime.deferred import Deferred
from service.settings import current

# In multiprocess mode every update of a value asks os.getpid() (a system call) whether the process
# forked since. prometheus-client's MultiProcessValue takes another process_identifier
# ("at your own risk", its docstring says: it must differ between live processes); ours must be the
# pid (files are named by it, and metrics_dir marks dead pids), so it is read from a box refreshed
# in every forked child, through C callables only (no Python frame per update). values.ValueClass is
# what every metric reads when it creates a value: set before the first metric below.
_PID = [os.getpid()]
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))
    values.ValueClass = values.MultiProcessValue(process_identifier=functools.partial(operator.getitem, _PID, 0))

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
# What the middleware moves by +1/-1 on every request: the gauge's value object itself, as the Tally below
# uses its metrics' (Gauge.inc/dec add two Python calls each in front of the value's locked write; a fork
# resets the value in place, so the reference stays good).
IN_FLIGHT_VALUE = IN_FLIGHT._value
# Its _sum is the attention weights computed in all (a separate counter of them was one more write per request).
ELEMENTS = Histogram("attention_weight_elements_per_request", "Attention weights per engine call (B*h*n_q*n_k, "
                     "summed over layers) of requests that passed every limit and were computed.",
                     buckets=ELEMENT_BUCKETS)
BATCH_ITEMS = Histogram("batch_items", "Items per /v1/batch request.", buckets=BATCH_BUCKETS)


class Tally(Deferred):
    """Counter and histogram updates of this process, added up in memory and applied to the metric values
    in one go: within ``max_seconds`` (METRICS_FLUSH_SECONDS [1]), at exit and before each exposition
    (service.runtime.deferred). In multiprocess mode each update of a value is a locked write to a memory-mapped
    file behind several Python calls, and a request makes several; here an update is a dictionary addition.
    The price: another worker's last second may be missing from a scrape, as from any Prometheus scrape
    interval. ``max_seconds <= 0``: every update goes straight to the metric, through its public methods. An
    update that fails when applied is logged and lost; the others and the timer go on.

    Applying a histogram's added-up observations takes its ``_sum`` and ``_buckets`` values (prometheus-client
    has no public "observe n times"); tests/unit/runtime/test_metrics.py compares the result with plain
    ``observe`` calls.
    """

    def _reset(self) -> None:
        self._pending: dict[object, float] = {}  # a metric's value object -> the amount to add to it

    def add(self, counters: Iterable[Counter] = (), observations: Iterable[tuple[Histogram, float]] = ()) -> None:
        """``counter.inc()`` for each counter and ``histogram.observe(amount)`` for each pair, deferred (a
        histogram's update: its sum, and the count of its first bucket >= amount), under one lock."""
        if self.max_seconds <= 0:
            for counter in counters:
                counter.inc()
            for histogram, amount in observations:
                histogram.observe(amount)
            return
        with self._lock:
            pending = self._pending
            for counter in counters:
                pending[counter._value] = pending.get(counter._value, 0.0) + 1.0
            for histogram, amount in observations:
                if amount == amount:  # as Histogram.observe: NaN goes into the sum and no bucket
                    bucket = histogram._buckets[bisect.bisect_left(histogram._upper_bounds, amount)]
                    pending[bucket] = pending.get(bucket, 0.0) + 1.0
                pending[histogram._sum] = pending.get(histogram._sum, 0.0) + amount
            self._added()

    def observe(self, histogram: Histogram, amount: float) -> None:
        """``histogram.observe(amount)``, deferred."""
        self.add(observations=((histogram, amount),))

    def _apply(self) -> None:
        # One value at a time off the dict: a worker stopped in the middle (gunicorn's SIGABRT on a timeout
        # raises SystemExit wherever it lands) leaves the rest pending for the flush at exit.
        pending = self._pending
        while pending:
            value, amount = pending.popitem()
            try:
                value.inc(amount)
            except Exception:  # e.g. the metrics directory's disk is full: lose this update, keep the others
                logging.getLogger(__name__).exception("a metric update of %s was lost", amount)


TALLY = Tally(current().observability.metrics_flush_seconds)

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
    TALLY.observe(ELEMENTS, elements)


def record(held: list[int]) -> None:
    """Record engine calls held by :func:`unrecorded` after all (the work was kept)."""
    for elements in held:
        count_elements(elements)


def observe_batch(items: int) -> None:
    """Record the number of items of one batch request."""
    TALLY.observe(BATCH_ITEMS, items)


class _SizedFilesCollector(multiprocess.MultiProcessCollector):
    """prometheus-client's collector, minus the metrics files that are still empty.

    A process creates its file and only then sizes it (MmapedDict.__init__), so for a moment the file
    has 0 bytes; prometheus-client 0.26 fails the whole scrape on it (struct.error: its issue #1199),
    and for good if the process was killed in that moment. An empty file holds no values yet, and a
    file never shrinks, so skipping the ones empty when listed loses nothing and races nothing.
    """

    def collect(self) -> Iterable[Metric]:
        with _scrape_lock(self._path):  # never halfway through a fold: each value counted once
            return self.merge([path for path in glob.glob(os.path.join(self._path, "*.db")) if _has_bytes(path)])


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
    """The Prometheus text exposition and its content type: every worker's metrics in multiprocess mode
    (this worker's up to now, the others' up to their last flush), then what ``collectors`` read for this scrape
    only (the edge's batch-jobs census: the runtime does not know the jobs)."""
    TALLY.flush()
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _SizedFilesCollector(registry)
    else:
        registry.register(REGISTRY)  # a registry is a collector too: this process's own metrics
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST
