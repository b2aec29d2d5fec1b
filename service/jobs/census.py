"""What /metrics tells of the batch jobs, read from the store when it is scraped, so every replica tells the same:
the batches by status, their requests by outcome, the tasks waiting in the queue.

A census costs four reads of the store whatever the number of batches: the batch records (one scan), their events
and their running chunks' counts (service.jobs.records.read_many), the queue's length.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.jobs import STATUSES
from service.jobs import records
from service.jobs.context import Jobs


@dataclass(frozen=True)
class Census:
    """``batches``: how many batches are in each status (every status, 0 included); ``requests``: their requests
    ``completed`` and ``failed`` so far, summed over every batch the store holds; ``queued``: tasks waiting in the
    queue (validations, chunks, finalizations, the reaper's next run once due)."""

    batches: dict[str, int]
    requests: dict[str, int]
    queued: int


def counts(jobs: Jobs) -> Census:
    """The census of ``jobs``' store now (raises one of service.jobs.queue.unreachable() when the store does not
    answer)."""
    statuses = dict.fromkeys(STATUSES, 0)
    requests = {"completed": 0, "failed": 0}
    for batch in records.read_many(jobs, [record for _, record in jobs.store.scan("batch:")]):
        statuses[batch.status] += 1
        counts = batch.request_counts()
        for outcome in requests:
            requests[outcome] += counts[outcome]
    return Census(statuses, requests, jobs.huey.pending_count())
