"""A file's body on disk read as one (service.jobs.bodies.Joined): parts in order, ranges, and a file deleted while
it is read (a download that races DELETE /v1/files/{id}: schemathesis found it with two workers)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from service.jobs.bodies import Joined

PARTS = (b"first line\n", b"second\nthird\n", b"", b"fourth\n")


def written(folder: Path) -> list[tuple[Path, int]]:
    """PARTS stored as files in ``folder``: their ``(path, bytes)``."""
    paths = [folder / f"{i}.out" for i in range(len(PARTS))]
    for path, part in zip(paths, PARTS, strict=True):
        path.write_bytes(part)
    return [(path, len(part)) for path, part in zip(paths, PARTS, strict=True)]


def test_the_parts_read_as_one_body_in_order(tmp_path):
    with Joined(written(tmp_path)) as body:
        assert body.read() == b"".join(PARTS)


@pytest.mark.parametrize(("start", "length"), [(0, 5), (8, 9), (11, 13), (20, 20), (30, 10), (99, 3)])
def test_a_range_reads_only_its_bytes_across_parts(tmp_path, start, length):
    with io.BufferedReader(Joined(written(tmp_path))) as body:  # a raw read stops at a part's end: buffered, it goes on
        body.seek(start)
        assert body.read(length) == b"".join(PARTS)[start:start + length]


def test_a_file_deleted_before_its_download_begins_is_not_found(tmp_path):
    parts = written(tmp_path)
    parts[0][0].unlink()
    with pytest.raises(FileNotFoundError):
        Joined(parts)


def test_a_part_deleted_during_the_download_ends_the_body_short_and_says_so(tmp_path, caplog):
    parts = written(tmp_path)
    with Joined(parts) as body:
        assert body.read(len(PARTS[0])) == PARTS[0]
        for path, _ in parts:
            path.unlink()
        with caplog.at_level(logging.WARNING, logger="service.jobs.bodies"):
            assert body.read() == b""  # the client sees fewer bytes than its Content-Length: a cut download
    assert f"{parts[1][0]} was deleted while it was read: the body ends at byte 11 of 31" in caplog.text


def test_a_part_open_when_it_is_deleted_is_still_read_whole(tmp_path):
    parts = written(tmp_path)
    with Joined(parts) as body:
        parts[0][0].unlink()  # POSIX: an open file outlives its name
        assert body.read(len(PARTS[0])) == PARTS[0]
