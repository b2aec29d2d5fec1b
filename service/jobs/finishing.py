"""A batch finished: ``completed`` when every chunk is done, or ``cancelled`` / ``expired`` once no chunk is in a
worker's hands. Whoever claims the batch's ``final`` record first finishes it (a claim: once, whatever the race);
finishing assembles the output file from the done chunks' output lines, the error file from their error lines
plus one ``batch_cancelled`` or ``batch_expired`` line per item of a chunk never done, then records ``done``.
Finishing twice (its worker died, the reaper runs it again) writes the same files: their ids are the batch's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from service.jobs import keys, leases
from service.jobs.queue import Jobs
from service.operations.jsontext import dumps

ENDING = {"cancelled": ("batch_cancelled", "The batch was cancelled before this request was run."),
          "expired": ("batch_expired", "The batch expired (completion_window) before this request was run.")}


def complete_if_done(jobs: Jobs, batch_id: str) -> None:
    """Finish ``batch_id`` as completed (or cancelled, if asked meanwhile) when its last chunk is done."""
    validated, cancel, final = jobs.store.get_many([keys.event(batch_id, name) for name in
                                                    ("validated", "cancel", "final")])
    if validated is None or final is not None:
        return
    counts = jobs.store.get_many([keys.chunk(batch_id, i) for i in range(len(validated["chunks"]))])
    if all(count is not None for count in counts):
        claim(jobs, batch_id, "cancelled" if cancel is not None else "completed")


def claim(jobs: Jobs, batch_id: str, status: str) -> None:
    """Claim the finishing of ``batch_id`` as ``status`` and finish it, unless someone claimed it first."""
    if jobs.store.claim(keys.event(batch_id, "final"), {"status": status, "at": int(time.time())}):
        leases.enqueue(jobs, batch_id, "finalize")


def finish(jobs: Jobs, batch_id: str) -> None:
    """Assemble the files of a claimed batch and record it ``done`` (idempotent)."""
    record, validated, final, done = jobs.store.get_many([keys.batch(batch_id), *(
        keys.event(batch_id, name) for name in ("validated", "final", "done"))])
    if record is None or final is None or done is not None:
        return
    with leases.held(jobs, batch_id, "finalize"):
        chunks = validated["chunks"] if validated else []
        counts = jobs.store.get_many([keys.chunk(batch_id, i) for i in range(len(chunks))])
        ended = b"".join(_ended(jobs, record, chunk, final["status"])
                         for chunk, count in zip(chunks, counts, strict=True) if count is None)
        request_counts = {"total": validated["total"] if validated else 0,
                          "completed": sum(count["completed"] for count in counts if count),
                          "failed": sum(count["failed"] for count in counts if count) + ended.count(b"\n")}
        done_ones = [i for i, count in enumerate(counts) if count]
        output_id, error_id = keys.output_files(batch_id)
        bodies = jobs.bodies
        outputs = [bodies.chunk(batch_id, i, "out") for i in done_ones]
        errors = [bodies.chunk(batch_id, i, "err") for i in done_ones]
        try:
            output = _file(jobs, record, output_id, "output", request_counts["completed"], outputs, b"")
            error = _file(jobs, record, error_id, "errors", request_counts["failed"], errors, ended)
        except FileNotFoundError:  # a done chunk's results are gone: removed by a finisher that recorded done
            if jobs.store.get(keys.event(batch_id, "done")) is not None:
                return  # its files stand, whole; a concatenation without those results would have replaced them
            raise
        jobs.store.claim(keys.event(batch_id, "done"), {
            "status": final["status"], "at": int(time.time()), "output_file_id": output, "error_file_id": error,
            "request_counts": request_counts})
    bodies.remove_batch(batch_id)
    jobs.store.delete([keys.lease(batch_id, str(i)) for i in range(len(chunks))])


def _file(jobs: Jobs, record: dict[str, Any], file_id: str, kind: str, lines: int, parts: list[Path],
          tail: bytes) -> str | None:
    """The output or error file of a batch (None when it would hold no line), stored with its record."""
    if lines == 0:
        return None
    size = jobs.bodies.concatenate(jobs.bodies.path(file_id), parts, tail)
    now = int(time.time())
    jobs.store.put(keys.file(file_id), {
        "id": file_id, "object": "file", "bytes": size, "created_at": now,
        "expires_at": now + jobs.limits.file_retention_seconds, "filename": f"{record['id']}_{kind}.jsonl",
        "purpose": "batch_output", "status": "processed", "owner": record["owner"]})
    return file_id


def _ended(jobs: Jobs, record: dict[str, Any], chunk: list[int], status: str) -> bytes:
    """An error line for each request of a chunk that was never done, in a batch ``status`` (cancelled, expired)."""
    code, message = ENDING[status]
    return b"".join(
        dumps({"id": keys.request_ids(record["id"], number)[0], "custom_id": orjson.loads(line)["custom_id"],
               "response": None, "error": {"code": code, "message": message}}) + b"\n"
        for number, line in jobs.bodies.lines(record["input_file_id"], chunk))
