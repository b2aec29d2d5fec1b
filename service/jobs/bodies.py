"""File bodies and chunk results on disk, under ATTENTION_DATA_DIR (shared by the API and every worker).

Everything is written to a temporary name in the same directory and renamed into place, so a reader never sees
half a file and a chunk computed twice leaves one result (the second rename replaces the first, with the same
lines).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

BLOCK = 1024 * 1024  # uploads are copied in 1 MiB blocks: bounded memory whatever the size


class TooLarge(Exception):
    """An upload past its limit: nothing was stored."""


class Bodies:
    """The ``files/`` and ``batches/`` folders under ``root``."""

    def __init__(self, root: Path) -> None:
        self.files = root / "files"
        self.batches = root / "batches"

    def path(self, file_id: str) -> Path:
        """Where the body of ``file_id`` is."""
        return self.files / file_id

    def chunk(self, batch_id: str, index: int, kind: str) -> Path:
        """Where chunk ``index`` of ``batch_id`` keeps its ``kind`` lines ("out" or "err")."""
        return self.batches / batch_id / f"{index}.{kind}"

    def save(self, file_id: str, blocks: Iterable[bytes], maximum: int) -> int:
        """``blocks`` (of an upload, as they arrive) written as the body of ``file_id``; its size. Past ``maximum``
        bytes: :class:`TooLarge`, and nothing is kept."""
        self.files.mkdir(parents=True, exist_ok=True)
        with _Atomic(self.path(file_id)) as out:
            size = 0
            for block in blocks:
                size += len(block)
                if size > maximum:
                    raise TooLarge(size)
                out.write(block)
        return size

    def write(self, path: Path, blocks: Iterable[bytes]) -> int:
        """``blocks`` written to ``path`` atomically; the bytes written."""
        path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with _Atomic(path) as out:
            for block in blocks:
                size += out.write(block)
        return size

    def concatenate(self, path: Path, parts: Iterable[Path], tail: bytes = b"") -> int:
        """The ``parts`` one after another, then ``tail``, written to ``path`` atomically; its size. A part that is
        missing is a FileNotFoundError, and ``path`` is left as it was."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with _Atomic(path) as out:
            for part in parts:
                with part.open("rb") as source:
                    shutil.copyfileobj(source, out, BLOCK)
            out.write(tail)
            return out.tell()

    def read_range(self, file_id: str, offset: int, length: int) -> bytes:
        """``length`` bytes of the body of ``file_id`` from ``offset``."""
        with self.path(file_id).open("rb") as body:
            body.seek(offset)
            return body.read(length)

    def lines(self, file_id: str, chunk: list[int]) -> list[tuple[int, bytes]]:
        """``(line number, line)`` of each request of a chunk ``[offset, length, first line, requests]`` of the
        file ``file_id`` (service.jobs.validation): blank lines skipped, still counted."""
        offset, length, first, _ = chunk
        return [(first + i, line) for i, line in enumerate(self.read_range(file_id, offset, length).split(b"\n"))
                if line.strip()]

    def remove(self, file_id: str) -> None:
        """The body of ``file_id`` gone (if it was there)."""
        self.path(file_id).unlink(missing_ok=True)

    def remove_batch(self, batch_id: str) -> None:
        """The chunk results of ``batch_id`` gone (once its files are assembled)."""
        shutil.rmtree(self.batches / batch_id, ignore_errors=True)


class _Atomic:
    """A file written under a temporary name beside ``path``, renamed to it on success, removed on failure."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self):  # the open binary file
        descriptor, self.temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".part-")
        self.file = os.fdopen(descriptor, "wb")
        return self.file

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        self.file.close()
        if kind is None:
            os.replace(self.temporary, self.path)
        else:
            os.unlink(self.temporary)
