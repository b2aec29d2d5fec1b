"""service.metrics.Tally: counter and histogram updates added up in memory, applied in one go."""

from __future__ import annotations

import os
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from service.metrics import SIZE_BUCKETS, Tally

AMOUNTS = [0.0, 63.9, 64.0, 64.1, 300.0, 1e9, 5.0, 64.0, 2**24]  # on, under, over and past the bounds


def fresh_metrics() -> tuple[CollectorRegistry, Counter, Histogram]:
    registry = CollectorRegistry()
    counter = Counter("things", "Things.", ["kind"], registry=registry)
    histogram = Histogram("sizes", "Sizes.", ["kind"], buckets=SIZE_BUCKETS, registry=registry)
    return registry, counter, histogram


def exposition_without_created(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_flush_gives_what_the_same_updates_one_by_one_give():
    direct, counter, histogram = fresh_metrics()
    for amount in AMOUNTS:
        counter.labels("a").inc()
        histogram.labels("a").observe(amount)
    counter.labels("b").inc(2)

    deferred, counter, histogram = fresh_metrics()
    tally = Tally(max_seconds=60)
    for amount in AMOUNTS:
        tally.add((counter.labels("a"),), ((histogram.labels("a"), amount),))
    tally.add((counter.labels("b"), counter.labels("b")))
    assert histogram.labels("a")._sum.get() == 0 and counter.labels("b")._value.get() == 0  # nothing applied yet
    tally.flush()
    assert exposition_without_created(deferred) == exposition_without_created(direct)
    tally.flush()  # nothing pending: nothing changes
    assert exposition_without_created(deferred) == exposition_without_created(direct)


def test_without_an_interval_every_update_is_applied_at_once():
    _, counter, histogram = fresh_metrics()
    tally = Tally(max_seconds=0)
    tally.add((counter.labels("a"),))
    tally.observe(histogram.labels("a"), 100.0)
    assert counter.labels("a")._value.get() == 1.0
    assert histogram.labels("a")._sum.get() == 100.0


def test_pending_updates_are_applied_within_the_interval():
    _, counter, _ = fresh_metrics()
    tally = Tally(max_seconds=0.05)
    tally.add((counter.labels("a"),))
    deadline = time.monotonic() + 5
    while counter.labels("a")._value.get() == 0:
        assert time.monotonic() < deadline, "not applied by the timer"
        time.sleep(0.01)
    assert counter.labels("a")._value.get() == 1.0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_nothing_pending():
    _, counter, _ = fresh_metrics()
    tally = Tally(max_seconds=60)
    tally.add([counter.labels("a")] * 3)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its flush must not apply the parent's pending update a second time
        tally.flush()
        os.write(write, str(counter.labels("a")._value.get()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 64) == b"0.0"
    os.close(read)
    os.close(write)
    tally.flush()
    assert counter.labels("a")._value.get() == 3.0
