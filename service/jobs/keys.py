"""Record keys, index names and ids. A batch's own records are ``batch:<id>``; what happens to it is under
``job:<id>:``, written once each (service.jobs.records) except the leases. The indexes (service.jobs.store): the
unfinished batches (:data:`OPEN`), each owner's files and batches newest first (:func:`owned`), and what the reaper
deletes by when (:data:`DUE`)."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """``file-`` or ``batch_`` and 24 random hex digits (OpenAI's id shapes)."""
    return prefix + secrets.token_hex(12)


def file(file_id: str) -> str:
    return f"file:{file_id}"


def batch(batch_id: str) -> str:
    return f"batch:{batch_id}"


def event(batch_id: str, name: str) -> str:
    """``validated``, ``failed``, ``cancel``, ``finalizing``, ``outputs`` (what its files hold) or ``finalized`` of
    ``batch_id`` (service.jobs.records)."""
    return f"job:{batch_id}:{name}"


def chunk(batch_id: str, index: int) -> str:
    """The counts of chunk ``index`` once it is done."""
    return f"job:{batch_id}:chunk:{index}"


def lease(batch_id: str, unit: str) -> str:
    """The lease of a unit of work: ``validate``, ``finalize`` or a chunk's index."""
    return f"job:{batch_id}:lease:{unit}"


def output_files(batch_id: str) -> tuple[str, str]:
    """The output and error file ids of ``batch_id``: fixed, so finalizing it twice writes the same files."""
    token = batch_id.removeprefix("batch_")
    return f"file-{token}out", f"file-{token}err"


def request_ids(batch_id: str, line: int) -> tuple[str, str]:
    """The ``id`` and the ``request_id`` of the output or error line of the request on ``line``: fixed, so a chunk
    computed twice writes the same lines."""
    token = batch_id.removeprefix("batch_")
    return f"batch_req_{token}_{line}", f"req_{token}_{line}"


REAPER = "reaper"  # the reaper chain's token and last beat
INDEXED = "indexed"  # written once the records kept before the indexes are in them (service.jobs.reaping.reindex)

OPEN = "open"  # index: the ids of the batches not finished (neither finalized nor failed)
DUE = "due"  # index: ``timed(when, key)`` of each upload and finished batch, deleted by the reaper from ``when`` on


def owned(kind: str, owner: str) -> str:
    """The index of ``owner``'s ``files`` or ``batches``: ``timed(created_at, id)`` of each."""
    return f"{kind}:{owner}"


def timed(at: float, name: str) -> str:
    """An index member ordered by the time ``at`` (whole seconds since the epoch), then by ``name``."""
    return f"{int(at):012d}:{name}"


def untimed(member: str) -> str:
    """The name in a :func:`timed` member."""
    return member.split(":", 1)[1]
