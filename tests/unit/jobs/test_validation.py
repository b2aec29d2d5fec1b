"""service.jobs.validation: a batch's file checked line by line before anything is computed. Each problem is
``{code, line, message, param}`` (lines from 1, blank ones counted); a valid file is cut into chunks whose byte
ranges hold exactly its lines."""

from __future__ import annotations

import tracemalloc

import pytest

from service.jobs import batches, keys, validation
from service.settings import Limits
from tests.unit.jobs.conftest import request_line, submit

BODY = {"tokens": ["the", "cat"], "d_model": 4, "n_heads": 2}


@pytest.fixture
def backend():
    return None  # SQLite: validation reads the file, the queue only records the outcome


def validated(jobs, content: bytes) -> dict:
    """The batch object once its file has been validated."""
    batch_id = submit(jobs, content)
    validation.validate(jobs, batch_id)
    return batches.get(jobs, "", batch_id)


def errors_of(jobs, content: bytes) -> list[dict]:
    batch = validated(jobs, content)
    assert batch["status"] == "failed" and batch["failed_at"] is not None, batch
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    return batch["errors"]["data"]


def codes(errors: list[dict]) -> list[tuple]:
    return [(error["code"], error["line"], error["param"]) for error in errors]


def ok(custom_id: str) -> bytes:
    return request_line(custom_id, BODY)


def test_a_line_that_is_not_json_or_not_an_object_or_too_deep_for_orjson(make_jobs):
    too_deep = (b'{"custom_id": "deep", "method": "POST", "url": "/v1/multi-head-attention", "body": {"q": '
                + b"[" * 1030 + b"]" * 1030 + b"}}")
    content = b"\n".join([ok("a"), b"{not json", b"[1, 2]", b'"text"', too_deep, ok("b")]) + b"\n"
    errors = errors_of(make_jobs(), content)
    assert codes(errors) == [("invalid_json_line", 2, None), ("invalid_json_line", 3, None),
                             ("invalid_json_line", 4, None), ("invalid_json_line", 5, None)]
    assert "not valid JSON" in errors[0]["message"] and "not a JSON object" in errors[1]["message"]
    assert "depth limit exceeded" in errors[3]["message"]  # orjson's own limit (1024), no RecursionError


@pytest.mark.parametrize("custom_id", [None, 7, "", "x" * 513, ["a"]])
def test_a_custom_id_missing_or_not_a_string_of_1_to_512_characters(make_jobs, custom_id):
    line = b'{"method": "POST", "url": "/v1/multi-head-attention", "body": {}}' if custom_id is None else \
        request_line(custom_id, BODY)
    errors = errors_of(make_jobs(), ok("a") + b"\n" + line + b"\n")
    assert codes(errors) == [("missing_custom_id", 2, "custom_id")]
    assert "1 to 512" in errors[0]["message"]


def test_a_custom_id_of_512_characters_is_fine(make_jobs):
    assert validated(make_jobs(), ok("x" * 512) + b"\n")["status"] == "in_progress"


def test_a_repeated_custom_id_names_the_line_that_had_it_first(make_jobs):
    content = b"\n".join([ok("a"), ok("b"), b"", ok("a"), ok("b"), ok("a")]) + b"\n"
    errors = errors_of(make_jobs(), content)
    assert codes(errors) == [("duplicate_custom_id", 4, "custom_id"), ("duplicate_custom_id", 5, "custom_id"),
                             ("duplicate_custom_id", 6, "custom_id")]
    assert [error["message"] for error in errors] == ["custom_id 'a' is on line 1 already.",
                                                      "custom_id 'b' is on line 2 already.",
                                                      "custom_id 'a' is on line 1 already."]


def test_a_repeat_is_named_as_a_repeat_among_the_other_problems_in_line_order(make_jobs):
    # The ids are kept as hashes and the repeats named by a second reading: a repeated line's only problem is the
    # repeat (as when the ids were kept whole), the others keep their places, the repeats past max_job_requests
    # are not read.
    content = b"\n".join([ok("a"), b"[1]", request_line("a", BODY, method="GET"), request_line("c", BODY, url="/x"),
                          ok("c"), ok("d"), ok("d")]) + b"\n"
    assert codes(errors_of(make_jobs(limits=Limits(max_job_requests=6)), content)) == [
        ("invalid_json_line", 2, None), ("duplicate_custom_id", 3, "custom_id"), ("mismatched_url", 4, "url"),
        ("duplicate_custom_id", 5, "custom_id"), ("too_many_requests", 7, None)]


def test_a_method_other_than_post_and_a_url_other_than_the_endpoint(make_jobs):
    content = b"\n".join([request_line("a", BODY, method="GET"), request_line("b", BODY, url="/v1/encoder"),
                          request_line("c", BODY, url=None), ok("d")])
    errors = errors_of(make_jobs(), content)
    assert codes(errors) == [("invalid_method", 1, "method"), ("mismatched_url", 2, "url"),
                             ("mismatched_url", 3, "url")]
    assert "'/v1/multi-head-attention'" in errors[1]["message"]


def padded(custom_id: str, size: int, ending: bytes = b"\n") -> bytes:
    """A valid line of exactly ``size`` bytes before its ``ending`` (spaces inside the object)."""
    line = ok(custom_id)
    return line[:-1] + b" " * (size - len(line)) + b"}" + ending


def test_a_line_past_max_line_bytes_but_not_one_at_it(make_jobs):
    jobs = make_jobs(limits=Limits(max_line_bytes=200))
    assert validated(jobs, padded("a", 200) + padded("b", 200, b""))["status"] == "in_progress"
    errors = errors_of(jobs, padded("a", 200) + padded("b", 201) + padded("c", 200) + padded("d", 5000))
    assert codes(errors) == [("line_too_long", 2, None), ("line_too_long", 4, None)]
    assert "max_line_bytes=200" in errors[0]["message"]


def test_crlf_line_endings_are_not_counted_in_a_line_nor_shift_the_line_numbers(make_jobs):
    jobs = make_jobs(limits=Limits(max_line_bytes=200))
    content = padded("a", 200, b"\r\n") + padded("b", 199, b"\r\n") + ok("a") + b"\r\n"
    assert codes(errors_of(jobs, content)) == [("duplicate_custom_id", 3, "custom_id")]


def test_a_10_mb_line_is_refused_in_bounded_memory(make_jobs):
    jobs = make_jobs()  # max_line_bytes 1 MiB
    huge = request_line("huge", {"tokens": ["the"] * 1_700_000})
    assert len(huge) > 10_000_000
    batch_id = submit(jobs, ok("a") + b"\n" + huge + b"\n" + ok("b") + b"\n")
    tracemalloc.start()
    try:
        validation.validate(jobs, batch_id)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert codes(batches.get(jobs, "", batch_id)["errors"]["data"]) == [("line_too_long", 2, None)]
    # Read in pieces of max_line_bytes, never held whole: a few pieces at most, whatever the line's length.
    assert peak < 4 * jobs.limits.max_line_bytes < len(huge) / 2, peak


def test_more_requests_than_max_job_requests(make_jobs):
    jobs = make_jobs(limits=Limits(max_job_requests=5))
    five = b"\n".join(ok(f"r{i}") for i in range(5))
    assert validated(jobs, b"\n\n" + five + b"\n\n")["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    errors = errors_of(jobs, b"\n" + five + b"\n\n" + ok("r5") + b"\n" + ok("r6") + b"\n")
    assert codes(errors) == [("too_many_requests", 8, None)]  # the first request past it; reading stops there
    assert "max_job_requests=5" in errors[0]["message"]


@pytest.mark.parametrize("content", [b"", b"\n", b"\n \n\t\r\n"])
def test_a_file_without_a_request(make_jobs, content):
    assert codes(errors_of(make_jobs(), content)) == [("empty_file", None, None)]


def test_blank_lines_are_skipped_but_counted(make_jobs):
    content = b"\n\n" + ok("a") + b"\n   \n" + b"{bad\n"
    assert codes(errors_of(make_jobs(), content)) == [("invalid_json_line", 5, None)]


def test_at_most_100_errors_are_listed_the_first_ones(make_jobs):
    content = b"\n".join([ok("fine")] + [b"{bad"] * 150)
    errors = errors_of(make_jobs(), content)
    assert len(errors) == validation.LISTED_ERRORS == 100
    assert [error["line"] for error in errors] == list(range(2, 102))


def test_the_chunks_byte_ranges_read_back_give_exactly_the_lines(make_jobs):
    jobs = make_jobs(chunk_items=3)
    lines = [ok(f"r{i}") for i in range(10)]
    layout = [b"", lines[0], lines[1], b"", b"", lines[2], lines[3], b"  ", lines[4], lines[5], lines[6],
              lines[7] + b"\r", b"", lines[8], lines[9]]  # the last without its newline
    batch = validated(jobs, b"\n".join(layout))
    assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == 10
    chunks = jobs.store.get(keys.event(batch["id"], "validated"))["chunks"]
    assert [(first, count) for _, _, first, count in chunks] == [(2, 3), (7, 3), (11, 3), (15, 1)]
    for offset, length, first, count in chunks:
        text = jobs.bodies.read_range(batch["input_file_id"], offset, length)
        numbered = [(first + i, line) for i, line in enumerate(text.split(b"\n")) if line.strip()]
        assert len(numbered) == count
        for number, line in numbered:
            assert line == layout[number - 1]


def test_a_chunk_holds_at_most_a_batch_request_s_bytes(make_jobs):
    # What a worker holds at once stays what /v1/batch would take in one request, however many lines fit.
    lines = [ok(f"r{i}") for i in range(7)]
    jobs = make_jobs(chunk_items=256, limits=Limits(max_body_bytes=3 * (len(lines[0]) + 1)))
    batch = validated(jobs, b"\n".join(lines) + b"\n")
    chunks = jobs.store.get(keys.event(batch["id"], "validated"))["chunks"]
    assert [count for _, _, _, count in chunks] == [3, 3, 1]
    assert all(length <= jobs.limits.max_body_bytes for _, length, _, _ in chunks)
