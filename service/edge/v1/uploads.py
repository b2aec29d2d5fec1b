"""An upload read as it arrives, in bounded memory: the file's bytes go straight to disk (service.jobs.bodies),
never into the worker's memory nor /tmp (werkzeug's form parser spools large files there, a 64 MiB tmpfs in the
pod). Two forms: ``multipart/form-data`` with ``file`` and ``purpose`` (what the openai client sends), or the raw
body (``application/x-ndjson``, for curl) with ``?purpose=batch``.
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Request
from gunicorn.http.errors import ParseException
from werkzeug.exceptions import BadRequest
from werkzeug.sansio.multipart import NEED_DATA, Data, Epilogue, Field, File, MultipartDecoder
from werkzeug.wsgi import get_content_length

from service.jobs.bodies import BLOCK
from service.jobs.files import FileTooLarge

FORM_EXTRA = 64 * 1024  # a form's boundaries, headers and small fields, beyond the file itself
FIELD_BYTES = 1024  # a form field (purpose) is a word


class Upload:
    """The parts of one request's upload: :meth:`blocks` yields the file's bytes as they arrive; ``fields`` and
    ``filename`` are known once it is consumed (a form may send its fields after the file)."""

    def __init__(self, request: Request, maximum: int) -> None:
        self.request, self.maximum = request, maximum
        self.form = request.mimetype == "multipart/form-data"
        self.fields: dict[str, str] = {}
        self.filename: str | None = None  # the form's file part names it; a raw body's is the query's
        length = get_content_length(request.environ)
        if length is not None and length > maximum + (FORM_EXTRA if self.form else 0):
            raise FileTooLarge(length, maximum)  # before a byte is read

    def blocks(self) -> Iterator[bytes]:
        """The file's bytes, block by block."""
        return self._form() if self.form else self._read()

    def _read(self) -> Iterator[bytes]:
        """The body in blocks, at most the limit (plus a form's overhead): a chunked body has no length to judge."""
        stream, size, allowed = self.request.stream, 0, self.maximum + (FORM_EXTRA if self.form else 0)
        try:
            while block := stream.read(BLOCK):
                size += len(block)
                if size > allowed:
                    raise FileTooLarge(size, self.maximum)
                yield block
        except (ParseException, OSError) as exc:  # bad chunk framing, a connection broken mid-body
            raise BadRequest(f"The body could not be read: {type(exc).__name__} ({str(exc)[:200]}).") from None

    def _form(self) -> Iterator[bytes]:
        boundary = self.request.mimetype_params.get("boundary", "").encode("latin-1", "replace")
        if not boundary:
            raise BadRequest("A multipart/form-data body needs its boundary parameter in the Content-Type.")
        decoder, blocks = MultipartDecoder(boundary, max_form_memory_size=BLOCK + FIELD_BYTES), self._read()
        part: str | None = None  # "file", the name of a field, or None (a part ignored)
        while True:
            try:
                event = decoder.next_event()
            except ValueError as error:  # werkzeug's word for a form that ends before its closing boundary (it
                # never asks for more data once told the body ended) or a part without its Content-Disposition
                raise BadRequest("The multipart/form-data body ended before its closing boundary or is malformed "
                                 f"({str(error)[:200]}).") from None
            if event is NEED_DATA:
                decoder.receive_data(next(blocks, None))
            elif isinstance(event, File):
                part = "file" if event.name == "file" and self.filename is None else None
                if part:
                    self.filename = (event.filename or "input.jsonl")[:255]
            elif isinstance(event, Field):
                part = event.name if event.name != "file" else None
                self.fields[event.name] = ""
            elif isinstance(event, Data):
                if part == "file":
                    yield event.data
                elif part is not None and len(self.fields[part]) + len(event.data) <= FIELD_BYTES:
                    self.fields[part] += event.data.decode("utf-8", "replace")
            elif isinstance(event, Epilogue):
                return
