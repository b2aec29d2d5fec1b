"""Leases: how a batch knows its work is still being done. Huey does not deliver a task again when its worker dies
(SIGKILL, out of memory): the task is simply gone. So each unit of a batch's work (``validate``, a chunk's index,
``finalize``) has a lease record: ``queued`` when its task is enqueued, ``running`` with an ``until`` that its
worker pushes forward while it works. The reaper (service.jobs.reaping) runs a unit again when its lease says it
cannot be in anyone's hands any more.

A ``queued`` unit whose task a worker took from the queue and died before its lease said ``running`` is found
without reading the queue: each task carries the time its lease was written, Huey's queue is first in, first out
within a priority, so once the task first in line at that priority was queued later than the unit (or none is
left), the unit's own task is no longer queued. The reaper reads one task per priority (:func:`heads`), never the
whole queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from service.jobs import keys
from service.jobs.context import Jobs

QUEUED_GRACE = 2.0  # seconds a queued unit may be missing from the queue: between a worker's dequeue and its lease
CLOCK_SKEW = 1.0  # seconds the clocks of two machines that enqueue may differ by: a task queued just after another
# may carry an earlier time
PRIORITIES = {"validate": 50, "chunk": 0, "finalize": 80}  # each unit's task's (a batch starts soon, ends sooner)


def task_of(batch_id: str, unit: str) -> tuple[Any, ...]:
    """The task doing ``unit`` of ``batch_id``, as (its name, its arguments...): ``("chunk", batch_id, 3)``."""
    return (unit, batch_id) if unit in ("validate", "finalize") else ("chunk", batch_id, int(unit))


def enqueue(jobs: Jobs, batch_id: str, unit: str) -> None:
    """Queue ``unit`` of ``batch_id``: its lease first (so the reaper never sees a queued task without one), then
    its task, carrying the lease's time as its last argument."""
    at = time.time()
    jobs.store.put(keys.lease(batch_id, unit), {"state": "queued", "at": at})
    name, *args = task_of(batch_id, unit)
    getattr(jobs.tasks, name)(*args, at)


def heads(jobs: Jobs) -> dict[str, float | None]:
    """For each task name of :data:`PRIORITIES`, when the task first in line among those of its priority was
    queued (None: none is queued). One task read and deserialised per priority."""
    found: dict[str, float | None] = {}
    for name, priority in PRIORITIES.items():
        data = jobs.store.queue_head(priority)
        if data is None:
            found[name] = None
            continue
        last = jobs.huey.deserialize_task(data).args[-1]
        # A task queued by a version before the time was an argument: older than any lease's time.
        found[name] = last if isinstance(last, float) else 0.0
    return found


def live(lease: dict[str, Any] | None, now: float) -> bool:
    """A unit in a worker's hands: running, its lease not run out."""
    return lease is not None and lease["state"] == "running" and lease["until"] >= now


def lost(lease: dict[str, Any] | None, now: float, first: dict[str, float | None], name: str) -> bool:
    """Nobody will do a unit (its task named ``name``) unless it is queued again: no lease, a running lease that ran
    out, or a queued one whose task is no longer in the queue (dequeued by a worker that died before taking the
    lease): the task ``first`` in line at its priority was queued after it, or none is left (:func:`heads`)."""
    if lease is None:
        return True
    if lease["state"] == "running":
        return lease["until"] < now
    if now - lease["at"] <= QUEUED_GRACE:
        return False
    head = first.get(name)
    return head is None or head > lease["at"] + CLOCK_SKEW


@contextmanager
def held(jobs: Jobs, batch_id: str, unit: str) -> Iterator[None]:
    """The lease of ``unit`` held while the block runs: renewed every third of the lease (a long chunk is not taken
    for lost), dropped at the end (done or failed: the reaper decides what comes next)."""
    if jobs.leases is None:
        jobs.leases = Renewer(jobs)
    key = keys.lease(batch_id, unit)
    jobs.leases.hold(key)
    try:
        yield
    finally:
        jobs.leases.release(key)


class Renewer:
    """The leases held in this process, renewed by one thread every third of the lease while any is held; the
    thread ends when none is, and the next hold starts another. (A thread per unit cost each chunk a thread start
    and a join: two waits for the scheduler, ~20 ms of a ~60 ms chunk on a busy 2-core machine.)"""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.keys: set[str] = set()
        self.lock = threading.Lock()  # leases are written and deleted under it: none is renewed once released
        self.thread: threading.Thread | None = None

    def hold(self, key: str) -> None:
        """Write the lease ``key`` as running, and keep renewing it until :meth:`release`."""
        with self.lock:
            self._write(key)
            self.keys.add(key)
            if self.thread is None:
                self.thread = threading.Thread(target=self._renew, name="leases", daemon=True)
                self.thread.start()

    def release(self, key: str) -> None:
        """Stop renewing the lease ``key`` and delete it."""
        with self.lock:
            self.keys.discard(key)
            self.jobs.store.delete([key])

    def _renew(self) -> None:
        while True:
            time.sleep(self.jobs.settings.lease_seconds / 3)
            with self.lock:
                if not self.keys:
                    self.thread = None
                    return
                try:
                    for key in self.keys:
                        self._write(key)
                except Exception:  # the store silent or down a moment: this thread must outlive it, or no lease
                    logging.getLogger(__name__).exception("could not renew the leases")  # is renewed again

    def _write(self, key: str) -> None:
        now = time.time()
        self.jobs.store.put(key, {"state": "running", "at": now, "until": now + self.jobs.settings.lease_seconds})
