"""A batch's input file checked line by line before any item is computed (the batch is ``validating``).

A line that is not a JSON object, has no string ``custom_id``, repeats one, is not ``POST`` to the batch's
``endpoint``, or passes the file's own limits (requests per batch, bytes per line) fails the whole batch, with one
``{code, line, message, param}`` per problem (lines count from 1). What a line's ``body`` holds is its endpoint's to
judge, item by item (service.jobs.chunks). A valid file is cut into chunks of ``chunk_items`` lines, by byte range.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, BinaryIO

import orjson

from service.jobs import keys, leases, reaping, records
from service.jobs.context import Jobs

LISTED_ERRORS = 100  # a failed batch lists this many problems at most (the first ones)
MAX_CUSTOM_ID = 512


def validate(jobs: Jobs, batch_id: str) -> None:
    """Validate the input of ``batch_id``: ``failed`` with its errors, or ``validated`` with its chunks, which are
    then queued. Run again (a lost validation), it finds its record and only queues what is missing."""
    record = jobs.store.get(keys.batch(batch_id))
    if record is None:
        return
    with leases.held(jobs, batch_id, "validate"):
        if jobs.store.get(keys.event(batch_id, "validated")) is None:
            with jobs.bodies.path(record["input_file_id"]).open("rb") as source:
                errors, chunks = _read(source, record["endpoint"], jobs)
            if errors:
                failed = {"at": int(time.time()), "errors": errors}
                jobs.store.claim(keys.event(batch_id, "failed"), failed)
                records.retire(jobs, records.read(jobs, batch_id))
                return
            total = sum(count for _, _, _, count in chunks)
            jobs.store.claim(keys.event(batch_id, "validated"), {"at": int(time.time()), "total": total,
                                                                 "chunks": chunks})
    # Queued by the reaper's rules: whatever has no result and nobody's lease (all of them, the first time).
    reaping.settle(jobs, batch_id, first={})


def _read(source: BinaryIO, endpoint: str, jobs: Jobs) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """The problems of the file, and its chunks ``[offset, length, first line, requests]``."""
    limits, size = jobs.limits, jobs.settings.chunk_items
    errors: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    chunks: list[list[int]] = []
    requests = 0
    for number, offset, line in _lines(source, limits.max_line_bytes):
        if line is None:
            _keep(errors, _error("line_too_long", number, f"The line is longer than max_line_bytes="
                                 f"{limits.max_line_bytes} (see GET /v1/limits)."))
            continue
        if not line.strip():
            continue
        requests += 1
        if requests > limits.max_job_requests:
            _keep(errors, _error("too_many_requests", number, f"The file has more than max_job_requests="
                                 f"{limits.max_job_requests} requests (see GET /v1/limits): split it."))
            break
        if problem := _check(line, number, endpoint, seen):
            _keep(errors, problem)
        elif not errors:
            # A chunk is at most chunk_items lines and at most a /v1/batch body's bytes: what a worker holds at once.
            if chunks and chunks[-1][3] < size and offset + len(line) - chunks[-1][0] <= limits.max_body_bytes:
                chunks[-1][1] = offset + len(line) - chunks[-1][0]
                chunks[-1][3] += 1
            else:
                chunks.append([offset, len(line), number, 1])
    if requests == 0 and not errors:
        _keep(errors, _error("empty_file", None, "The file holds no request: one JSON object per line."))
    return errors, chunks


def _lines(source: BinaryIO, maximum: int) -> Iterator[tuple[int, int, bytes | None]]:
    """``(line number, byte offset, line)`` of ``source``, None for a line past ``maximum`` bytes (skipped to its
    end without holding it)."""
    number, offset = 0, 0
    while True:
        line = source.readline(maximum + 2)  # its bytes and its "\r\n": one more says it is too long
        if not line:
            return
        number += 1
        start = offset
        offset += len(line)
        if len(line.rstrip(b"\r\n")) > maximum:
            while not line.endswith(b"\n") and (line := source.readline(1 << 20)):
                offset += len(line)
            yield number, start, None
        else:
            yield number, start, line


def _check(line: bytes, number: int, endpoint: str, seen: dict[str, int]) -> dict[str, Any] | None:
    try:
        request = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        return _error("invalid_json_line", number, f"The line is not valid JSON: {error}")
    if not isinstance(request, dict):
        return _error("invalid_json_line", number, "The line is not a JSON object {custom_id, method, url, body}.")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
        return _error("missing_custom_id", number, f"custom_id must be a string of 1 to {MAX_CUSTOM_ID} characters.",
                      "custom_id")
    if (first := seen.setdefault(custom_id, number)) != number:
        return _error("duplicate_custom_id", number, f"custom_id {custom_id[:80]!r} is on line {first} already.",
                      "custom_id")
    if request.get("method") != "POST":
        return _error("invalid_method", number, "method must be \"POST\".", "method")
    if request.get("url") != endpoint:
        return _error("mismatched_url", number, f"url must be the batch's endpoint {endpoint!r}.", "url")
    return None


def _keep(errors: list[dict[str, Any]], error: dict[str, Any]) -> None:
    """``error`` among the listed ones, while fewer than LISTED_ERRORS are: a file of 200,000 bad lines holds 100
    problems in memory, not 200,000."""
    if len(errors) < LISTED_ERRORS:
        errors.append(error)


def _error(code: str, line: int | None, message: str, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "line": line, "message": message, "param": param}
