"""Record keys and ids. A batch's own records are ``batch:<id>``; what happens to it is under ``job:<id>:``, written
once each (service.jobs.records) except the leases."""

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
