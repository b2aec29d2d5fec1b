"""A batch's input file checked line by line before any item is computed (the batch is ``validating``).

A line that is not a JSON object, has no string ``custom_id``, repeats one, is not ``POST`` to the batch's
``endpoint``, or passes the file's own limits (requests per batch, bytes per line) fails the whole batch, with one
``{code, line, message, param}`` per problem (lines count from 1). What a line's ``body`` holds is its endpoint's to
judge, item by item (service.jobs.chunks). A valid file is cut into chunks of ``chunk_items`` lines, by byte range,
each within max_body_bytes and, for a generating endpoint, max_batch_new_tokens.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import numpy as np
import orjson

from service.jobs import keys, leases, reaping, records
from service.jobs.context import Jobs
from service.jobs.endpoints import CHAT, endpoints
from service.operations import catalogue, chat, generation

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
    ids = _Ids()
    chunks: list[list[int]] = []
    requests, stop, generated = 0, None, 0  # generated: the new tokens the last chunk's lines ask for
    asked = _asked(endpoint)
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
            stop = number
            break
        problem, request = _check(line, number, endpoint, ids)
        if problem:
            _keep(errors, problem)
        elif not errors:
            # A chunk is at most chunk_items lines and at most a /v1/batch body's bytes: what a worker holds at once;
            # and at most max_batch_new_tokens generated, so that a chunk of long generations ends well inside a
            # worker's grace period (as /v1/batch answers within gunicorn's timeout).
            tokens = asked(request.get("body"))
            if (chunks and chunks[-1][3] < size and offset + len(line) - chunks[-1][0] <= limits.max_body_bytes
                    and generated + tokens <= limits.max_batch_new_tokens):
                chunks[-1][1] = offset + len(line) - chunks[-1][0]
                chunks[-1][3] += 1
                generated += tokens
            else:
                chunks.append([offset, len(line), number, 1])
                generated = tokens
    if repeated := ids.repeated():  # a second reading names the repeats exactly, each instead of its line's others
        source.seek(0)
        twice = _repeats(source, limits.max_line_bytes, repeated, stop)
        errors = sorted([error for error in errors if error["line"] not in twice] + list(twice.values()),
                        key=lambda error: error["line"])[:LISTED_ERRORS]
    if requests == 0 and not errors:
        _keep(errors, _error("empty_file", None, "The file holds no request: one JSON object per line."))
    return errors, chunks


class _Ids:
    """The custom_ids of a file as their 64-bit hashes in an array (8 bytes each: 1.6 MB for 200,000, where a dict
    of the ids took ~27 MB of a ~90 MB worker): equal hashes send the file to a second, exact reading."""

    def __init__(self) -> None:
        self.hashes = array("q")

    def add(self, custom_id: str) -> None:
        self.hashes.append(hash(custom_id))  # salted per process: both readings run in this one

    def repeated(self) -> set[int]:
        """The hashes seen more than once."""
        ordered = np.sort(np.frombuffer(self.hashes, dtype=np.int64))
        return set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())


def _repeats(source: BinaryIO, maximum: int, repeated: set[int], stop: int | None) -> dict[int, dict[str, Any]]:
    """line -> its ``duplicate_custom_id`` problem, for the first LISTED_ERRORS lines whose custom_id (one whose
    hash is ``repeated``) an earlier line has, before line ``stop``."""
    first: dict[str, int] = {}
    found: dict[int, dict[str, Any]] = {}
    for number, _, line in _lines(source, maximum):
        if number == stop or len(found) == LISTED_ERRORS:
            break
        try:
            custom_id = _custom_id(orjson.loads(line)) if line and line.strip() else None
        except orjson.JSONDecodeError:
            continue
        if custom_id is not None and hash(custom_id) in repeated and first.setdefault(custom_id, number) != number:
            found[number] = _error("duplicate_custom_id", number, f"custom_id {custom_id[:80]!r} is on line "
                                   f"{first[custom_id]} already.", "custom_id")
    return found


def _custom_id(request: Any) -> str | None:
    """The request's custom_id, if it is a valid one."""
    custom_id = request.get("custom_id") if isinstance(request, dict) else None
    return custom_id if isinstance(custom_id, str) and 0 < len(custom_id) <= MAX_CUSTOM_ID else None


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


def _asked(endpoint: str) -> Callable[[Any], int]:
    """The new tokens a line's body of ``endpoint`` asks for (0: the endpoint generates nothing)."""
    op, path = endpoints()[endpoint]
    if op == CHAT:
        return chat.asked
    if op == "generate":
        model = catalogue.lookup(path["model"])
        return lambda body: generation.asked(model, body)
    return lambda body: 0


def _check(line: bytes, number: int, endpoint: str, ids: _Ids) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The line's problem (None: a valid line) and the line read."""
    try:
        request = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        return _error("invalid_json_line", number, f"The line is not valid JSON: {error}"), {}
    if not isinstance(request, dict):
        return _error("invalid_json_line", number, "The line is not a JSON object {custom_id, method, url, body}."), {}
    if (custom_id := _custom_id(request)) is None:
        return _error("missing_custom_id", number, f"custom_id must be a string of 1 to {MAX_CUSTOM_ID} "
                      "characters.", "custom_id"), request
    ids.add(custom_id)
    if request.get("method") != "POST":
        return _error("invalid_method", number, "method must be \"POST\".", "method"), request
    if request.get("url") != endpoint:
        return _error("mismatched_url", number, f"url must be the batch's endpoint {endpoint!r}.", "url"), request
    return None, request


def _keep(errors: list[dict[str, Any]], error: dict[str, Any]) -> None:
    """``error`` among the listed ones, while fewer than LISTED_ERRORS are: a file of 200,000 bad lines holds 100
    problems in memory, not 200,000."""
    if len(errors) < LISTED_ERRORS:
        errors.append(error)


def _error(code: str, line: int | None, message: str, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "line": line, "message": message, "param": param}
