"""File bodies and chunk results on disk, under ATTENTION_DATA_DIR (shared by the API and every worker).

An upload's body is one file under ``files/``. A batch's output and error files are the results its chunks wrote
under ``batches/<id>/``, read one after another (:class:`Joined`): finalizing a batch lists them, it copies nothing
(a 10,000-item output is 23 MB, which a copy took 50-100 ms to write, every other result waiting).

Everything is written to a temporary name in the same directory and renamed into place, so a reader never sees
half a file and a chunk computed twice leaves one result (the second rename replaces the first, with the same
lines).
"""

from __future__ import annotations

import bisect
import io
import itertools
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

BLOCK = 1024 * 1024  # files stream in (uploads) and out (downloads) in 1 MiB blocks: bounded memory whatever the size


class TooLarge(Exception):
    """An upload past its limit: nothing was stored."""


class Bodies:
    """The ``files/`` and ``batches/`` folders under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = root / "files"
        self.batches = root / "batches"

    def path(self, file_id: str) -> Path:
        """Where the body of ``file_id`` is."""
        return self.files / file_id

    def chunk(self, batch_id: str, index: int, kind: str) -> Path:
        """Where chunk ``index`` of ``batch_id`` keeps its ``kind`` lines ("out" or "err")."""
        return self.batches / batch_id / f"{index}.{kind}"

    def ended(self, batch_id: str) -> Path:
        """A new name under ``batch_id`` for the error lines of the requests it never ran (cancelled, expired)."""
        return self.batches / batch_id / f"ended-{secrets.token_hex(4)}.err"

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

    def part(self, path: Path) -> str:
        """The name of ``path`` (a chunk's result, an upload's body) in a file record's parts: relative to the data
        folder, which each machine may mount elsewhere."""
        return path.relative_to(self.root).as_posix()

    def joined(self, parts: Sequence[tuple[str, int]]) -> Joined:
        """The ``(part, bytes)`` of a file read as one body."""
        return Joined([(self.root / name, size) for name, size in parts])

    def remove_parts(self, parts: Iterable[tuple[str, int]]) -> None:
        """The ``parts`` gone (those that were there)."""
        for name, _ in parts:
            (self.root / name).unlink(missing_ok=True)

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
        """Whatever is left of the chunk results of ``batch_id`` gone (its files are)."""
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


class Joined(io.RawIOBase):
    """Files read one after another as one seekable body: a range request reads only the parts it asks for.

    The first part is opened at once (FileNotFoundError: the file was deleted before its download began); a later
    part deleted meanwhile ends the body short, which the client sees as a download cut off (its Content-Length
    was promised), and the log says why.
    """

    def __init__(self, parts: Sequence[tuple[Path, int]]) -> None:
        super().__init__()
        self._paths = [path for path, _ in parts]
        self._starts = list(itertools.accumulate((size for _, size in parts), initial=0))  # len(parts) + 1
        self._position = 0
        self._open: tuple[int, io.BufferedReader] | None = (0, self._paths[0].open("rb")) if parts else None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._starts[-1]}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """At most ``len(buffer)`` bytes from the part the position is in (0 at the end)."""
        if self._position >= self._starts[-1] or not len(buffer):
            return 0
        index = bisect.bisect_right(self._starts, self._position) - 1  # the part holding the position
        if self._open is None or self._open[0] != index:
            self._close_part()
            try:
                self._open = (index, self._paths[index].open("rb"))
            except FileNotFoundError:  # deleted (DELETE /v1/files/{id}) while it was being read
                logging.getLogger(__name__).warning("%s was deleted while it was read: the body ends at byte %d of "
                                                    "%d", self._paths[index], self._position, self._starts[-1])
                self._position = self._starts[-1]
                return 0
        part = self._open[1]
        part.seek(self._position - self._starts[index])
        wanted = min(len(buffer), self._starts[index + 1] - self._position)
        read = part.readinto(memoryview(buffer)[:wanted])
        if not read:
            raise OSError(f"{self._paths[index]} is shorter than its record says")
        self._position += read
        return read

    def close(self) -> None:
        self._close_part()
        super().close()

    def _close_part(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None
