"""service.runtime.metrics.Tally: counter and histogram updates added up in memory, applied in one go."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from service.runtime.metrics import SIZE_BUCKETS, Tally
from tests.conftest import ROOT

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
    tally = Tally(max_seconds=0.2)
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


def test_nan_goes_into_the_sum_and_no_bucket_as_with_observe():
    direct, _, histogram = fresh_metrics()
    histogram.labels("a").observe(float("nan"))
    deferred, _, histogram = fresh_metrics()
    tally = Tally(max_seconds=60)
    tally.observe(histogram.labels("a"), float("nan"))
    tally.flush()
    assert exposition_without_created(deferred) == exposition_without_created(direct)


@pytest.mark.parametrize("seconds", [float("inf"), float("nan")])
def test_an_interval_must_be_finite(seconds):
    with pytest.raises(ValueError, match="finite"):
        Tally(max_seconds=seconds)


class FailsOnce:
    """A metric value whose first update fails (a full disk under the metrics directory, say)."""

    def __init__(self) -> None:
        self.calls = 0

    def inc(self, amount: float) -> None:
        self.calls += 1
        if self.calls == 1:
            raise OSError(28, "No space left on device")


def test_a_failed_update_is_logged_and_neither_the_others_nor_the_timer_stop(caplog):
    _, counter, _ = fresh_metrics()
    failing = FailsOnce()
    tally = Tally(max_seconds=0.2)
    with caplog.at_level(logging.ERROR):
        tally.add((type("Broken", (), {"_value": failing})(), counter.labels("a")))
        deadline = time.monotonic() + 5
        while counter.labels("a")._value.get() == 0:
            assert time.monotonic() < deadline, "the other update was not applied"
            time.sleep(0.01)
        tally.add((counter.labels("a"),))  # the timer goes on: a later update is applied too
        while counter.labels("a")._value.get() < 2:
            assert time.monotonic() < deadline, "the timer stopped after a failed update"
            time.sleep(0.01)
    assert failing.calls == 1 and "metric update" in caplog.text


MULTIPROCESS = """
import os, sys
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
from service.runtime import metrics
direct = Histogram("direct", "d", buckets=metrics.SIZE_BUCKETS)
deferred = Histogram("deferred", "d", buckets=metrics.SIZE_BUCKETS)
pid = os.fork()
if pid == 0:  # a worker: its updates go to its own files, applied at exit
    for amount in (10.0, 64.0, 300.0, 5e6):
        direct.observe(amount)
        metrics.TALLY.observe(deferred, amount)
    sys.exit(0)
os.waitpid(pid, 0)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
lines = generate_latest(registry).decode().splitlines()
print(sorted(line.replace("deferred", "direct") for line in lines if line.startswith("deferred")) ==
      sorted(line for line in lines if line.startswith("direct")) and len(lines) > 10)
"""


def test_in_multiprocess_mode_a_worker_applies_its_updates_at_exit(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "METRICS_FLUSH_SECONDS": "60"}
    root = ROOT
    result = subprocess.run([sys.executable, "-c", MULTIPROCESS], env=env, cwd=root, capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.split()[-1] == "True", result.stdout + result.stderr
