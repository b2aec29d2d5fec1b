"""The Huey tasks of the jobs, registered on each process's Huey (service.jobs.queue.build) with fixed names, so
the API that enqueues them and the workers that run them agree. Each only calls its lifecycle module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.jobs import chunks, finalize, leases, reaping, validation
from service.jobs.context import Jobs

if TYPE_CHECKING:  # huey itself is imported when a process first builds its queue (service.jobs.queue)
    from huey.api import TaskWrapper


@dataclass(frozen=True)
class Tasks:
    """Calling one enqueues it: ``tasks.chunk(batch_id, 3)``. The reaper goes first, then what finalizes a batch,
    then validation (a batch starts soon), then the chunks in the order they were queued."""

    validate: TaskWrapper
    chunk: TaskWrapper
    finalize: TaskWrapper
    reap: TaskWrapper


def register(jobs: Jobs) -> Tasks:
    """The tasks of ``jobs``, registered on its Huey. A unit's task takes, last, the time its lease was written
    (``queued_at``, s since the epoch), which only the reaper reads, from the queue (service.jobs.leases.heads);
    a task queued without it (by the version before) runs too."""
    task, priority = jobs.huey.task, leases.PRIORITIES
    return Tasks(
        validate=task(name="validate", priority=priority["validate"])(
            lambda batch_id, queued_at=0.0: validation.validate(jobs, batch_id)),
        chunk=task(name="chunk", priority=priority["chunk"])(
            lambda batch_id, index, queued_at=0.0: chunks.run(jobs, batch_id, index)),
        finalize=task(name="finalize", priority=priority["finalize"])(
            lambda batch_id, queued_at=0.0: finalize.run(jobs, batch_id)),
        reap=task(name="reap", priority=100)(lambda token: reaping.chain(jobs, token)))
