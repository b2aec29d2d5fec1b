"""Batches (POST/GET /v1/batches, cancel): their records and OpenAI's batch object, read from the events the
workers record (service.jobs.keys): ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed``; or
``failed``, ``expired``, ``cancelling`` -> ``cancelled``."""

from __future__ import annotations

import time
from typing import Any

from service.jobs import files, keys, leases, reaping
from service.jobs.endpoints import endpoints
from service.jobs.queue import Jobs
from service.problems import ValidationProblem

EVENTS = ("validated", "failed", "cancel", "final", "done")
ENDED = ("completed", "failed", "expired", "cancelled")


def create(jobs: Jobs, owner: str, request: dict[str, Any]) -> dict[str, Any]:
    """A new batch of the file ``input_file_id``, ``validating``; a worker validates it."""
    try:
        file = files.get(jobs, owner, request["input_file_id"])
    except files.NotFound as error:
        raise ValidationProblem.at("/input_file_id", error.description) from None
    if file["purpose"] != "batch":
        raise ValidationProblem.at("/input_file_id", f"The file's purpose is {file['purpose']!r}, not 'batch'.")
    if request["endpoint"] not in endpoints():
        raise ValidationProblem.at("/endpoint", f"No batch endpoint {request['endpoint'][:80]!r}: one of "
                                   f"{', '.join(sorted(endpoints()))}.")
    now = int(time.time())
    record = {"id": keys.new_id("batch_"), "object": "batch", "endpoint": request["endpoint"],
              "input_file_id": file["id"], "completion_window": request["completion_window"], "created_at": now,
              "expires_at": now + int(jobs.settings.window_seconds), "metadata": request.get("metadata"),
              "owner": owner}
    jobs.store.put(keys.batch(record["id"]), record)
    leases.enqueue(jobs, record["id"], "validate")
    reaping.ensure(jobs)
    return describe(jobs, record)


def get(jobs: Jobs, owner: str, batch_id: str) -> dict[str, Any]:
    """The batch object of ``batch_id`` (404 if there is none for this owner)."""
    record = jobs.store.get(keys.batch(batch_id))
    if record is None or record["owner"] != owner:
        raise files.NotFound(f"No batch {batch_id[:80]!r} (GET /v1/batches lists yours).")
    return describe(jobs, record)


def listing(jobs: Jobs, owner: str, limit: int, after: str | None) -> dict[str, Any]:
    """OpenAI's list of batches, newest first."""
    records = [record for _, record in jobs.store.scan("batch:") if record["owner"] == owner]
    listed = files.page(records, limit, after)
    listed["data"] = describe_many(jobs, listed["data"])
    return listed


def cancel(jobs: Jobs, owner: str, batch_id: str) -> dict[str, Any]:
    """Ask ``batch_id`` to stop: ``cancelling`` until no chunk is in a worker's hands, then ``cancelled``."""
    batch = get(jobs, owner, batch_id)
    if batch["status"] in ENDED:
        raise files.Conflict(f"The batch is {batch['status']}: only an unfinished batch can be cancelled.")
    jobs.store.claim(keys.event(batch_id, "cancel"), {"at": int(time.time())})
    reaping.settle(jobs, batch_id)  # finished at once when it is validated and no worker holds a chunk
    return get(jobs, owner, batch_id)


def describe(jobs: Jobs, record: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's batch object of ``record``, from its events and its chunks' counts."""
    return describe_many(jobs, [record])[0]


def describe_many(jobs: Jobs, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's batch objects of ``records``, in two reads of the store whatever their number (their events, then
    the counts of the chunks of those running), so a list or a scrape of /metrics (service.jobs.census) stays cheap."""
    found = jobs.store.get_many([keys.event(record["id"], name) for record in records for name in EVENTS])
    events = [found[start:start + len(EVENTS)] for start in range(0, len(found), len(EVENTS))]
    # Only a batch validated and not done adds its chunks' counts up: a done one recorded its request_counts.
    chunks = [len(validated["chunks"]) if validated and not done else 0 for validated, *_, done in events]
    counts = iter(jobs.store.get_many([keys.chunk(record["id"], i)
                                       for record, n in zip(records, chunks, strict=True) for i in range(n)]))
    return [_batch_object(record, *happened, [next(counts) for _ in range(n)])
            for record, happened, n in zip(records, events, chunks, strict=True)]


def _status(validated: Any, failed: Any, cancel: Any, final: Any, done: Any) -> str:
    """The batch's status from what has happened to it, the latest event first."""
    if done is not None:
        return done["status"]
    if failed is not None:
        return "failed"
    if final is not None and final["status"] == "completed":
        return "finalizing"
    if cancel is not None:
        return "cancelling"
    return "in_progress" if validated is not None else "validating"


def _batch_object(record: dict[str, Any], validated: Any, failed: Any, cancel: Any, final: Any, done: Any,
                  chunk_counts: list[Any]) -> dict[str, Any]:
    batch_id = record["id"]
    counts = {"total": 0, "completed": 0, "failed": 0}
    if done is not None:
        counts = done["request_counts"]
    elif validated is not None:
        counts["total"] = validated["total"]
        for count in chunk_counts:
            if count is not None:
                counts["completed"] += count["completed"]
                counts["failed"] += count["failed"]
    ending = done["status"] if done else None
    status = _status(validated, failed, cancel, final, done)
    return {
        "id": batch_id, "object": "batch", "endpoint": record["endpoint"],
        "errors": {"object": "list", "data": failed["errors"]} if failed else None,
        "input_file_id": record["input_file_id"], "completion_window": record["completion_window"], "status": status,
        "output_file_id": done["output_file_id"] if done else None,
        "error_file_id": done["error_file_id"] if done else None,
        "created_at": record["created_at"], "in_progress_at": validated["at"] if validated else None,
        "expires_at": record["expires_at"],
        "finalizing_at": final["at"] if final and final["status"] == "completed" else None,
        "completed_at": done["at"] if ending == "completed" else None, "failed_at": failed["at"] if failed else None,
        "expired_at": done["at"] if ending == "expired" else None, "cancelling_at": cancel["at"] if cancel else None,
        "cancelled_at": done["at"] if ending == "cancelled" else None, "request_counts": counts,
        "metadata": record["metadata"]}
