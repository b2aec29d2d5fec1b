"""A batch finalized: ``completed`` when every chunk is done, or ``cancelled`` / ``expired`` once no chunk is in a
worker's hands. Whoever claims the batch's ``finalizing`` record first queues its ``finalize`` task (a claim: once,
whatever the race). Finalizing copies nothing: the output file is the done chunks' output lines where they lie, the
error file their error lines plus one ``batch_cancelled`` or ``batch_expired`` line per item of a chunk never done
(service.jobs.bodies reads the parts as one). What the files hold is claimed once (``outputs``), then their records
are written, then ``finalized``: finalizing twice (its worker died, the reaper runs it again, a late chunk's counts
arrived meanwhile) writes the same files, so every custom_id stays in exactly one of them.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from service.jobs import files, keys, leases, records
from service.jobs.context import Jobs
from service.operations.jsontext import dumps

ENDING = {"cancelled": ("batch_cancelled", "The batch was cancelled before this request was run."),
          "expired": ("batch_expired", "The batch expired (completion_window) before this request was run.")}


def if_complete(jobs: Jobs, batch_id: str) -> None:
    """Finalize ``batch_id`` as completed (or cancelled, if asked meanwhile) when its last chunk is done."""
    batch = records.read(jobs, batch_id, counts=True)
    if batch.validated is None or batch.finalizing is not None:
        return
    if all(count is not None for count in batch.counts.values()):
        claim(jobs, batch_id, "cancelled" if batch.cancel is not None else "completed")


def claim(jobs: Jobs, batch_id: str, status: str) -> None:
    """Claim the finalizing of ``batch_id`` as ``status`` and queue it, unless someone claimed it first."""
    if jobs.store.claim(keys.event(batch_id, "finalizing"), {"status": status, "at": int(time.time())}):
        leases.enqueue(jobs, batch_id, "finalize")


def run(jobs: Jobs, batch_id: str) -> None:
    """Record the files of a claimed batch, then the batch ``finalized`` (idempotent)."""
    batch = records.read(jobs, batch_id)
    if batch.record is None or batch.finalizing is None or batch.finalized is not None:
        return
    status = batch.finalizing["status"]
    with leases.held(jobs, batch_id, "finalize"):
        if jobs.store.get(keys.event(batch_id, "outputs")) is None:  # the chunks done now, under the lease
            jobs.store.claim(keys.event(batch_id, "outputs"),
                             _outputs(jobs, records.read(jobs, batch_id, counts=True), status))
        outputs = jobs.store.get(keys.event(batch_id, "outputs"))  # the first finalizer's, whoever that was
        for file in outputs["files"]:  # listed among the owner's files; deleted with the batch
            jobs.store.commit(put={keys.file(file["id"]): file}, add=files.listed(file))
        ids = {file["id"] for file in outputs["files"]}
        output_id, error_id = (file_id if file_id in ids else None for file_id in keys.output_files(batch_id))
        jobs.store.claim(keys.event(batch_id, "finalized"), {
            "status": status, "at": int(time.time()), "request_counts": outputs["request_counts"],
            "output_file_id": output_id, "error_file_id": error_id})
    jobs.store.delete([keys.lease(batch_id, str(i)) for i in range(len(batch.chunks))])
    records.retire(jobs, records.read(jobs, batch_id))


def _outputs(jobs: Jobs, batch: records.Batch, status: str) -> dict[str, Any]:
    """The batch's request_counts and its files' records (each listing its parts), from the chunks done now; the
    ended lines of those never done written as a part of their own (named afresh: a finalizer that loses the claim
    must not overwrite the winner's)."""
    record, bodies = batch.record, jobs.bodies
    batch_id = record["id"]
    ended = b"".join(_ended(jobs, record, chunk, status) for chunk, count in zip(
        batch.chunks, batch.counts.values(), strict=True) if count is None)
    done = [(i, count) for i, count in batch.counts.items() if count]
    outputs = [bodies.chunk(batch_id, i, "out") for i, count in done if count["completed"]]
    errors = [bodies.chunk(batch_id, i, "err") for i, count in done if count["failed"]]
    if ended:
        errors.append(bodies.ended(batch_id))
        bodies.write(errors[-1], [ended])
    stored = []
    for file_id, kind, paths in zip(keys.output_files(batch_id), ("output", "errors"), (outputs, errors), strict=True):
        if paths:
            parts = [[bodies.part(path), path.stat().st_size] for path in paths]
            stored.append(files.stored(jobs, file_id, sum(size for _, size in parts), f"{batch_id}_{kind}.jsonl",
                                       "batch_output", record["owner"], batch=batch_id, parts=parts))
    return {"files": stored, "request_counts": {
        "total": batch.validated["total"] if batch.validated else 0,
        "completed": sum(count["completed"] for _, count in done),
        "failed": sum(count["failed"] for _, count in done) + ended.count(b"\n")}}


def _ended(jobs: Jobs, record: dict[str, Any], chunk: list[int], status: str) -> bytes:
    """An error line for each request of a chunk that was never done, in a batch ``status`` (cancelled, expired)."""
    code, message = ENDING[status]
    return b"".join(
        dumps({"id": keys.request_ids(record["id"], number)[0], "custom_id": orjson.loads(line)["custom_id"],
               "response": None, "error": {"code": code, "message": message}}) + b"\n"
        for number, line in jobs.bodies.lines(record["input_file_id"], chunk))
