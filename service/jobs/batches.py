"""Batches (POST/GET /v1/batches, cancel): what the views call. A batch's status and OpenAI's batch object are
read from its records (service.jobs.records)."""

from __future__ import annotations

import time
from typing import Any

from service.jobs import files, keys, leases, reaping, records
from service.jobs.context import Jobs
from service.jobs.endpoints import endpoints
from service.problems import ValidationProblem


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
    jobs.store.commit(put={keys.batch(record["id"]): record}, add={
        keys.owned("batches", owner): [keys.timed(now, record["id"])], keys.OPEN: [record["id"]]})
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
    """OpenAI's list of batches, newest first: read from the owner's index, about ``limit`` batches whatever the
    number the store holds."""
    last = None
    if after is not None:
        last = jobs.store.get(keys.batch(after))
        if last is None or last["owner"] != owner:
            raise files.NotFound(f"after={after[:80]!r} names nothing in this list.")

    def read(ids: list[str]) -> list[dict[str, Any]]:
        found = [record for record in jobs.store.get_many([keys.batch(batch_id) for batch_id in ids]) if record]
        return [batch.batch_object() for batch in records.read_many(jobs, found)]

    return files.page(jobs, keys.owned("batches", owner), last, limit, read)


def cancel(jobs: Jobs, owner: str, batch_id: str) -> dict[str, Any]:
    """Ask ``batch_id`` to stop: ``cancelling`` until no chunk is in a worker's hands, then ``cancelled``."""
    batch = get(jobs, owner, batch_id)
    if batch["status"] in records.ENDED:
        raise files.Conflict(f"The batch is {batch['status']}: only an unfinished batch can be cancelled.")
    jobs.store.claim(keys.event(batch_id, "cancel"), {"at": int(time.time())})
    reaping.settle(jobs, batch_id)  # finished at once when it is validated and no worker holds a chunk
    return get(jobs, owner, batch_id)


def describe(jobs: Jobs, record: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's batch object of ``record``, from its events and its chunks' counts."""
    return records.read_many(jobs, [record])[0].batch_object()
