"""Prometheus metrics of the service (no Flask here: compute code and batch can call the hooks).

Under gunicorn the metrics are in prometheus-client's multiprocess mode: gunicorn.conf.py sets
PROMETHEUS_MULTIPROC_DIR (and empties it) before any worker imports prometheus_client, and marks
dead workers; :func:`exposition` then sums every worker's files, so a scrape that lands on any
worker sees the whole instance. Without that variable (tests, ``flask run``) the process's own
registry is served. Labels are bounded: ``route`` is the URL rule (``/v1/demos/<name>``), never
the raw path; unmatched paths share one label.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Iterator
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

# In multiprocess mode every update of a value asks os.getpid() (a system call) whether the process
# forked since: 11 per request. prometheus-client's MultiProcessValue takes another process_identifier
# ("at your own risk", its docstring says: it must differ between live processes); ours must be the
# pid (files are named by it, and gunicorn.conf.py marks dead pids), so it is read from a box refreshed
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
REQUEST_SIZE = Histogram("http_request_size_bytes", "Request body size (Content-Length), by route.",
                         ["route"], buckets=SIZE_BUCKETS)
RESPONSE_SIZE = Histogram("http_response_size_bytes", "Response body size, by route.", ["route"],
                          buckets=SIZE_BUCKETS)
IN_FLIGHT = Gauge("http_requests_in_flight", "Requests being answered now (summed over live workers).",
                  multiprocess_mode="livesum")
# Its _sum is the attention weights computed in all (a separate counter of them was one more write per request).
ELEMENTS = Histogram("attention_weight_elements_per_request", "Attention weights per engine call (B*h*n_q*n_k, "
                     "summed over layers) of requests that passed every limit.", buckets=ELEMENT_BUCKETS)
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


def exposition() -> tuple[bytes, str]:
    """The Prometheus text exposition and its content type: every worker's metrics in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
