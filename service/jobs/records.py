"""A batch's records, read together, and what they say: its status and OpenAI's batch object. The one place that
reads them; the lifecycle modules (validation, chunks, finalize, reaping) and the views all ask here.

What happens to a batch is written once each, under ``job:<id>:`` (service.jobs.keys): ``validated`` (its total and
its chunks) or ``failed`` (its errors); ``cancel`` when asked; ``finalizing`` once it is to end (the status it ends
in: completed, cancelled or expired), ``outputs`` (what its files hold, claimed by the first finalizer) and
``finalized`` at the end (its counts and files); per chunk, its counts once done. Status, latest event first:
``validating`` -> ``in_progress`` -> ``finalizing`` (or ``cancelling``) -> ``completed``, ``cancelled``, ``expired``;
or ``failed``. A batch past its window that has not ended reads ``finalizing`` (``cancelling`` if a cancel was asked
first): the chunks in workers' hands finish, then it ends ``expired``; never ``in_progress``, and never ``expired``
before its files are written (a client stops polling at ``expired`` and reads ``output_file_id`` then).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.jobs import keys
from service.jobs.context import Jobs

EVENTS = ("validated", "failed", "cancel", "finalizing", "finalized")
WRITTEN_ONCE = (*EVENTS, "outputs")  # every event record a batch may have
ENDED = ("completed", "failed", "expired", "cancelled")

Record = dict[str, Any]


@dataclass(frozen=True)
class Batch:
    """What the store holds of one batch: ``record`` (None: no such batch), its events, and ``counts``, the counts
    of the chunks that were read (index -> None while a chunk is not done)."""

    record: Record | None
    validated: Record | None
    failed: Record | None
    cancel: Record | None
    finalizing: Record | None
    finalized: Record | None
    counts: dict[int, Record | None]

    @property
    def chunks(self) -> list[list[int]]:
        """The chunks ``[offset, length, first line, requests]`` of a validated batch (none before)."""
        return self.validated["chunks"] if self.validated else []

    @property
    def finished(self) -> bool:
        """Nothing more will happen to it: it failed validation or was finalized."""
        return self.failed is not None or self.finalized is not None

    @property
    def status(self) -> str:
        """OpenAI's status, from the latest event (and the clock: past ``expires_at`` it is finishing)."""
        if self.finalized is not None:
            return self.finalized["status"]
        if self.failed is not None:
            return "failed"
        if self.finalizing is not None and self.finalizing["status"] != "cancelled":
            return "finalizing"
        if self.cancel is not None:
            return "cancelling"
        if self.expiring:
            return "finalizing"
        return "in_progress" if self.validated is not None else "validating"

    @property
    def expiring(self) -> bool:
        """Past its window and not ended: what is in workers' hands finishes, nothing more starts."""
        return self.record is not None and not self.finished and time.time() >= self.record["expires_at"]

    @property
    def finalizing_at(self) -> int | None:
        """When it began to finish without a cancel (s since the epoch): its ``finalizing`` claim when it completed,
        the end of its window when it expires; None while running or cancelled."""
        ending = self.finalizing["status"] if self.finalizing is not None else None
        if ending == "completed":
            return self.finalizing["at"]
        if ending == "expired" or (ending is None and self.cancel is None and self.expiring):
            return self.record["expires_at"]
        return None

    def request_counts(self) -> dict[str, int]:
        """``{total, completed, failed}``: the finalized ones, else the done chunks' so far."""
        if self.finalized is not None:
            return self.finalized["request_counts"]
        done = [count for count in self.counts.values() if count is not None]
        return {"total": self.validated["total"] if self.validated else 0,
                "completed": sum(count["completed"] for count in done),
                "failed": sum(count["failed"] for count in done)}

    def batch_object(self) -> dict[str, Any]:
        """OpenAI's batch object (read with the counts of every chunk when it is running: :func:`read_many`)."""
        record, finalized, failed, cancel = self.record, self.finalized, self.failed, self.cancel
        ending = finalized["status"] if finalized else None
        return {
            "id": record["id"], "object": "batch", "endpoint": record["endpoint"],
            "errors": {"object": "list", "data": failed["errors"]} if failed else None,
            "input_file_id": record["input_file_id"], "completion_window": record["completion_window"],
            "status": self.status,
            "output_file_id": finalized["output_file_id"] if finalized else None,
            "error_file_id": finalized["error_file_id"] if finalized else None,
            "created_at": record["created_at"], "in_progress_at": self.validated["at"] if self.validated else None,
            "expires_at": record["expires_at"], "finalizing_at": self.finalizing_at,
            "completed_at": finalized["at"] if ending == "completed" else None,
            "failed_at": failed["at"] if failed else None,
            "expired_at": finalized["at"] if ending == "expired" else None,
            "cancelling_at": cancel["at"] if cancel else None,
            "cancelled_at": finalized["at"] if ending == "cancelled" else None,
            "request_counts": self.request_counts(), "metadata": record["metadata"]}


def read(jobs: Jobs, batch_id: str, *, counts: bool = False, chunk: int | None = None) -> Batch:
    """The records of ``batch_id`` in one read of the store: with ``chunk``, that chunk's counts too; with
    ``counts``, every chunk's (a second read, once the chunks are known)."""
    found = jobs.store.get_many([keys.batch(batch_id), *(keys.event(batch_id, name) for name in EVENTS),
                                 *([keys.chunk(batch_id, chunk)] if chunk is not None else [])])
    batch = Batch(*found[:6], counts={chunk: found[6]} if chunk is not None else {})
    if counts and batch.validated is not None:
        indices = range(len(batch.chunks))
        batch.counts.update(zip(indices, jobs.store.get_many([keys.chunk(batch_id, i) for i in indices]),
                                strict=True))
    return batch


def read_many(jobs: Jobs, records: Sequence[Record]) -> list[Batch]:
    """The batches of ``records`` in two reads of the store whatever their number (their events, then the counts of
    the chunks of those running), so a list or a scrape of /metrics (service.jobs.census) stays cheap."""
    found = jobs.store.get_many([keys.event(record["id"], name) for record in records for name in EVENTS])
    events = [found[start:start + len(EVENTS)] for start in range(0, len(found), len(EVENTS))]
    # Only a batch validated and not finalized adds its chunks' counts up: a finalized one recorded its counts.
    sizes = [len(validated["chunks"]) if validated and not finalized else 0 for validated, *_, finalized in events]
    counts = iter(jobs.store.get_many([keys.chunk(record["id"], i)
                                       for record, n in zip(records, sizes, strict=True) for i in range(n)]))
    return [Batch(record, *happened, counts={i: next(counts) for i in range(n)})
            for record, happened, n in zip(records, events, sizes, strict=True)]


def unfinished(jobs: Jobs) -> list[Record]:
    """The records of the batches not finished: what the reaper settles, read from their index (never every batch
    the store holds)."""
    ids = jobs.store.members(keys.OPEN)
    return [record for record in jobs.store.get_many([keys.batch(batch_id) for batch_id in ids]) if record is not None]


def retire(jobs: Jobs, batch: Batch) -> None:
    """A finished batch out of the unfinished ones, and due for deletion (:func:`due`)."""
    jobs.store.commit(remove={keys.OPEN: [batch.record["id"]]}, add={keys.DUE: [due(jobs, batch)]})


def due(jobs: Jobs, batch: Batch) -> str:
    """The deletions' index member of a finished batch: ``file_retention_seconds`` after its end (the same however
    often it is asked: its end is its first finisher's)."""
    end = (batch.finalized or batch.failed)["at"]
    return keys.timed(end + jobs.limits.file_retention_seconds, keys.batch(batch.record["id"]))


def keys_of(batch: Batch) -> list[str]:
    """Every record key a batch may have: its own, its events, its chunks' counts and every lease."""
    batch_id = batch.record["id"]
    units = ["validate", "finalize", *map(str, range(len(batch.chunks)))]
    return [keys.batch(batch_id), *(keys.event(batch_id, name) for name in WRITTEN_ONCE),
            *(keys.chunk(batch_id, index) for index in range(len(batch.chunks))),
            *(keys.lease(batch_id, unit) for unit in units)]
