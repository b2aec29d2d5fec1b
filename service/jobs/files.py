"""Files (POST/GET/DELETE /v1/files): a body under ATTENTION_DATA_DIR and its record, as OpenAI's file object.

With API keys, a file belongs to the key that uploaded it (``owner``: a digest of the key, never the key): any
other key is told it does not exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from service.jobs import keys, records
from service.jobs.bodies import Joined, TooLarge
from service.jobs.context import Jobs
from service.problems import TYPE_BASE, Problem

NOT_FOUND = TYPE_BASE + "not-found"
CONFLICT = TYPE_BASE + "conflict"
LIMIT_EXCEEDED = TYPE_BASE + "limit-exceeded"
PRIVATE = ("owner", "batch", "parts")  # a record's members the API never shows


class NotFound(Problem):
    """404: no such file or batch (or one another key owns)."""

    code = 404
    problem_type = NOT_FOUND


class Conflict(Problem):
    """409: the resource is in a state that does not allow this."""

    code = 409
    problem_type = CONFLICT


class FileTooLarge(Problem):
    """413: an upload past max_file_bytes; nothing was kept."""

    code = 413
    problem_type = LIMIT_EXCEEDED

    def __init__(self, size: int, maximum: int) -> None:
        super().__init__(f"The file is more than {maximum} bytes, the limit max_file_bytes (see GET /v1/limits): "
                         "split it.", limit={"name": "max_file_bytes", "maximum": maximum, "value": size})


def save(jobs: Jobs, blocks: Iterable[bytes]) -> tuple[str, int]:
    """Store ``blocks`` (an upload's, as they arrive) as the body of a new file: its id and size. The file exists
    once :func:`record` names it; until then :meth:`Bodies.remove` drops it."""
    file_id = keys.new_id("file-")
    try:
        return file_id, jobs.bodies.save(file_id, blocks, jobs.limits.max_file_bytes)
    except TooLarge as error:
        raise FileTooLarge(error.args[0], jobs.limits.max_file_bytes) from None


def record(jobs: Jobs, owner: str, file_id: str, size: int, filename: str, purpose: str) -> dict[str, Any]:
    """The record of a saved body: the file now exists, listed and due for deletion at its ``expires_at``; its
    public record."""
    file = stored(jobs, file_id, size, filename, purpose, owner)
    jobs.store.commit(put={keys.file(file_id): file}, add={**listed(file), keys.DUE: [due(file)]})
    return public(file)


def listed(file: dict[str, Any]) -> dict[str, list[str]]:
    """The index member that lists ``file`` among its owner's files."""
    return {keys.owned("files", file["owner"]): [keys.timed(file["created_at"], file["id"])]}


def due(file: dict[str, Any]) -> str:
    """The index member that has the reaper delete an upload at its ``expires_at`` (a batch's output and error
    files go with their batch)."""
    return keys.timed(file["expires_at"], keys.file(file["id"]))


def stored(jobs: Jobs, file_id: str, size: int, filename: str, purpose: str, owner: str,
           **where: Any) -> dict[str, Any]:
    """The record of a file made now. An upload's body is its own (service.jobs.bodies); a batch's output or
    error file says ``where`` its body is: ``batch`` (its id) and ``parts`` (``[part, bytes]``, in order)."""
    now = int(time.time())
    return {"id": file_id, "object": "file", "bytes": size, "created_at": now,
            "expires_at": now + jobs.limits.file_retention_seconds, "filename": filename, "purpose": purpose,
            "status": "processed", "owner": owner, **where}


def public(record: dict[str, Any]) -> dict[str, Any]:
    """A record as the API shows it (without its owner or where its body is)."""
    return {key: value for key, value in record.items() if key not in PRIVATE}


def get(jobs: Jobs, owner: str, file_id: str) -> dict[str, Any]:
    """The record of ``file_id`` (404 if there is none for this owner)."""
    record = jobs.store.get(keys.file(file_id))
    if record is None or record["owner"] != owner:
        raise NotFound(f"No file {file_id[:80]!r} (GET /v1/files lists yours).")
    return record


def content(jobs: Jobs, owner: str, file_id: str) -> tuple[dict[str, Any], Joined]:
    """The record of ``file_id`` and its body, open (404 if there is none for this owner)."""
    file = get(jobs, owner, file_id)
    try:
        return file, jobs.bodies.joined(_parts(jobs, file))
    except FileNotFoundError:  # deleted since its record was read
        raise NotFound(f"No file {file_id[:80]!r} (it was just deleted).") from None


def listing(jobs: Jobs, owner: str, limit: int, after: str | None, purpose: str | None) -> dict[str, Any]:
    """OpenAI's list of files, newest first, ``limit`` at most, after the file ``after``."""
    last = None
    if after is not None:
        last = jobs.store.get(keys.file(after))
        if last is None or last["owner"] != owner or purpose not in (None, last["purpose"]):
            raise NotFound(f"after={after[:80]!r} names nothing in this list.")

    def read(ids: list[str]) -> list[dict[str, Any]]:
        found = jobs.store.get_many([keys.file(file_id) for file_id in ids])
        return [public(file) for file in found if file is not None and purpose in (None, file["purpose"])]

    return page(jobs, keys.owned("files", owner), last, limit, read)


def delete(jobs: Jobs, owner: str, file_id: str) -> dict[str, Any]:
    """Delete ``file_id`` (409 while an unfinished batch reads it)."""
    record = get(jobs, owner, file_id)
    for batch in records.unfinished(jobs):
        if batch["input_file_id"] == file_id and not records.read(jobs, batch["id"]).finished:
            raise Conflict(f"Batch {batch['id']} still reads this file: cancel it or wait until it ends.")
    remove(jobs, record)
    return {"id": file_id, "object": "file", "deleted": True}


def remove(jobs: Jobs, record: dict[str, Any]) -> None:
    """The file of ``record`` gone, record and body; the last of a batch's two files takes what is left of its
    chunks' results with it (a chunk late to a cancelled batch, empty results)."""
    jobs.store.commit(delete=[keys.file(record["id"])], remove={**listed(record), keys.DUE: [due(record)]})
    jobs.bodies.remove_parts(_parts(jobs, record))
    if "batch" in record and not any(jobs.store.get_many([keys.file(file_id) for file_id in
                                                          keys.output_files(record["batch"])])):
        jobs.bodies.remove_batch(record["batch"])


def _parts(jobs: Jobs, record: dict[str, Any]) -> list[tuple[str, int]]:
    """The ``(part, bytes)`` of a file's body: a batch file's recorded parts, an upload's one body."""
    return record.get("parts") or [(jobs.bodies.part(jobs.bodies.path(record["id"])), record["bytes"])]


def page(jobs: Jobs, index: str, after: dict[str, Any] | None, limit: int,
         read: Callable[[list[str]], list[dict[str, Any]]]) -> dict[str, Any]:
    """OpenAI's list object of the records of ``index`` (an owner's files or batches), newest first (ties by id),
    the ``limit`` after the record ``after``: ``read`` gives the records of some ids as listed (those that still
    exist and belong in the list). Reads about ``limit`` of them, however many the index holds."""
    below = keys.timed(after["created_at"], after["id"]) if after is not None else None
    found: list[dict[str, Any]] = []
    while len(found) <= limit:
        members = jobs.store.members(index, below=below, limit=limit + 1, descending=True)
        found += read([keys.untimed(member) for member in members])
        if len(members) <= limit:
            break
        below = members[-1]
    data = found[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(found) > limit}
