"""A batch finished: ``completed`` when every chunk is done, or ``cancelled`` / ``expired`` once no chunk is in a
worker's hands. Whoever claims the batch's ``final`` record first finishes it (a claim: once, whatever the race).
Finishing copies nothing: the output file is the done chunks' output lines where they lie, the error file their
error lines plus one ``batch_cancelled`` or ``batch_expired`` line per item of a chunk never done (service.jobs.bodies
reads the parts as one). What the files hold is claimed once (``assembled``), then their records are written, then
``done``: finishing twice (its worker died, the reaper runs it again, a late chunk's counts arrived meanwhile)
writes the same files, so every custom_id stays in exactly one of them.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from service.jobs import files, keys, leases
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
    """Record the files of a claimed batch, then the batch ``done`` (idempotent)."""
    record, validated, final, done = jobs.store.get_many([keys.batch(batch_id), *(
        keys.event(batch_id, name) for name in ("validated", "final", "done"))])
    if record is None or final is None or done is not None:
        return
    with leases.held(jobs, batch_id, "finalize"):
        if jobs.store.get(keys.event(batch_id, "assembled")) is None:
            jobs.store.claim(keys.event(batch_id, "assembled"), _assembly(jobs, record, validated, final["status"]))
        assembled = jobs.store.get(keys.event(batch_id, "assembled"))  # the first finisher's, whoever that was
        for file in assembled["files"]:
            jobs.store.put(keys.file(file["id"]), file)
        ids = {file["id"] for file in assembled["files"]}
        output_id, error_id = (file_id if file_id in ids else None for file_id in keys.output_files(batch_id))
        jobs.store.claim(keys.event(batch_id, "done"), {
            "status": final["status"], "at": int(time.time()), "request_counts": assembled["request_counts"],
            "output_file_id": output_id, "error_file_id": error_id})
    jobs.store.delete([keys.lease(batch_id, str(i)) for i in range(len(validated["chunks"]) if validated else 0)])


def _assembly(jobs: Jobs, record: dict[str, Any], validated: dict[str, Any] | None, status: str) -> dict[str, Any]:
    """The batch's request_counts and its files' records (each listing its parts), from the chunks done now; the
    ended lines of those never done written as a part of their own (named afresh: a finisher that loses the claim
    must not overwrite the winner's)."""
    batch_id, bodies = record["id"], jobs.bodies
    chunks = validated["chunks"] if validated else []
    counts = jobs.store.get_many([keys.chunk(batch_id, i) for i in range(len(chunks))])
    ended = b"".join(_ended(jobs, record, chunk, status) for chunk, count in zip(chunks, counts, strict=True)
                     if count is None)
    done = [(i, count) for i, count in enumerate(counts) if count]
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
        "total": validated["total"] if validated else 0, "completed": sum(count["completed"] for _, count in done),
        "failed": sum(count["failed"] for _, count in done) + ended.count(b"\n")}}


def _ended(jobs: Jobs, record: dict[str, Any], chunk: list[int], status: str) -> bytes:
    """An error line for each request of a chunk that was never done, in a batch ``status`` (cancelled, expired)."""
    code, message = ENDING[status]
    return b"".join(
        dumps({"id": keys.request_ids(record["id"], number)[0], "custom_id": orjson.loads(line)["custom_id"],
               "response": None, "error": {"code": code, "message": message}}) + b"\n"
        for number, line in jobs.bodies.lines(record["input_file_id"], chunk))
