"""JSON in and out with orjson: the Flask JSON provider and the request parser of every view.

orjson refuses NaN/Infinity (the stdlib ``json`` accepts them), is faster,
and serialises numpy arrays natively (no ``.tolist()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from flask import Request, current_app
from flask.json.provider import JSONProvider
from gunicorn.http.errors import ParseException
from marshmallow import EXCLUDE, Schema, ValidationError
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge, UnsupportedMediaType
from werkzeug.wsgi import get_content_length

from service.edge.context import current_limits
from service.operations.jsontext import check_depth, dumps
from service.problems import MalformedJSON, ValidationProblem, invalid

JSON = "application/json"
CHUNK = 64 * 1024


class OrjsonProvider(JSONProvider):
    """Flask JSON provider writing and reading with orjson."""

    mimetype = JSON

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        return dumps(obj, indent=bool(kwargs.get("indent"))).decode()

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return orjson.loads(s)

    def response(self, *args: Any, **kwargs: Any) -> Any:
        """Like jsonify (one value, or several as a list, or keywords as an object), but the body is orjson's
        bytes, not a re-encoded str."""
        if args and kwargs:
            raise TypeError("response() takes positional or keyword arguments, not both")
        value = args[0] if len(args) == 1 else list(args) if args else kwargs or None
        return current_app.response_class(dumps(value), mimetype=self.mimetype)


def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refusing with 413 past ``max_bytes``: by Content-Length before reading,
    and by counting while reading a chunked body (which has no Content-Length); 415 if compressed;
    400 if it cannot be read (gunicorn meets bad chunk framing only as the app reads, and the
    connection may break mid-body: neither is the server's fault).
    (Headers are read from the WSGI environ: werkzeug's header properties parse on every access.)"""
    try:
        return _read_body(request, max_bytes)
    except (ParseException, OSError) as exc:  # e.g. InvalidChunkSize, ChunkMissingTerminator, NoMoreData
        raise BadRequest(f"The body could not be read: {type(exc).__name__} ({str(exc)[:200]}).") from None


def _read_body(request: Request, max_bytes: int) -> bytes:
    environ = request.environ
    encoding = environ.get("HTTP_CONTENT_ENCODING")
    if encoding and encoding.lower() != "identity":
        raise UnsupportedMediaType(f"Content-Encoding {encoding[:40]} is not supported: send the body uncompressed.")
    length = get_content_length(environ)  # None for a chunked body, as werkzeug's request.content_length
    if length is not None:
        if length > max_bytes:
            raise RequestEntityTooLarge(f"The body is {length} bytes; the limit max_body_bytes is {max_bytes} "
                                        "(see GET /v1/limits).")
        return _read_exactly(environ["wsgi.input"], length)
    stream = request.stream
    parts, size = [], 0
    while chunk := stream.read(CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise RequestEntityTooLarge(f"The body is more than {max_bytes} bytes, the limit "
                                        "max_body_bytes (see GET /v1/limits).")
        parts.append(chunk)
    return b"".join(parts)


def _read_exactly(stream: Any, length: int) -> bytes:
    """``length`` bytes of the WSGI input, asked for in one read.

    One read lets gunicorn receive a known length in large pieces straight into one buffer, where
    small reads through werkzeug's stream copy its read-ahead buffer again for every piece. A body
    shorter than its Content-Length is a 400.
    """
    body = stream.read(length)
    while len(body) < length and (more := stream.read(length - len(body))):
        body += more
    if len(body) < length:
        raise BadRequest(f"The body ended after {len(body)} of its {length} bytes (Content-Length).")
    return body


def is_json(mimetype: str) -> bool:
    """application/json or any application/*+json."""
    return mimetype == JSON or (mimetype.startswith("application/") and mimetype.endswith("+json"))


UTF8_READABLE = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})  # charsets whose JSON UTF-8 reads unchanged


def declared_charset(request: Request) -> str | None:
    """The body's declared charset (Content-Type parameter) when UTF-8 may not read it as sent, else None.

    JSON is UTF-8 (RFC 8259) and a charset parameter has no effect on it, so a declared one is only named
    when the body fails to parse: a UTF-16 body is then refused by its charset, not called malformed."""
    if request.environ.get("CONTENT_TYPE") == JSON:
        return None
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    return None if charset in UTF8_READABLE else charset[:40]


def not_utf8(body: bytes | memoryview) -> str | None:
    """Where ``body`` stops being UTF-8 ("byte 0xff at offset 10 (line 1, column 11): invalid start byte"), or
    None when it is UTF-8. Asked only after orjson refused a body: its own message names no byte."""
    try:
        bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        column = exc.start - (exc.object.rfind(b"\n", 0, exc.start) + 1) + 1
        return f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start} (line {line}, column {column}): {exc.reason}"
    return None


def load_json_body(request: Request) -> Any:
    """Check content type, size and depth of the body, then parse it with orjson.

    Raises 415 (not JSON; or not UTF-8 JSON and declared in another charset), 413 (too large), 422 (too deep),
    400 (malformed, or shorter than its Content-Length).
    """
    if request.environ.get("CONTENT_TYPE") != JSON and not is_json(request.mimetype):  # parse it only if need be
        raise UnsupportedMediaType(f"Send the body as application/json, not {request.mimetype or 'nothing'}.")
    limits = current_limits()
    body = read_body(request, limits.max_body_bytes)
    check_depth(body, limits)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if charset := declared_charset(request):
            raise UnsupportedMediaType(f"The body is not valid UTF-8 JSON and declares charset={charset}: "
                                       "send JSON in UTF-8.") from None
        if where := not_utf8(body):
            raise MalformedJSON(f"The body is not valid UTF-8 (JSON is UTF-8): {where}.") from None
        raise MalformedJSON(f"The body is not valid JSON: {exc}") from None


def query_args(request: Request) -> dict[str, str]:
    """The query string, each parameter given once: ``?size=1&size=2`` would otherwise be cut to its
    first value silently (every query parameter here is a scalar)."""
    repeated = [name for name, values in request.args.lists() if len(values) > 1]
    if repeated:
        errors = [{"parameter": name, "detail": "Given more than once."} for name in repeated]
        raise ValidationProblem(f"Give each query parameter once: {', '.join(repeated)}"[:500], errors=errors)
    return request.args.to_dict()


def parse_request(request: Request, schema: Schema, location: str,
                  precheck: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """``schema.load`` of the JSON body (``location="json"``) or of the query string (``"query"``).

    ``request``: the Request itself, not the ``flask.request`` proxy, which looks the request up again on
    every attribute read.
    ``precheck`` sees the parsed JSON before the schema does (e.g. to refuse too many items with 413
    before validating any). Invalid data: 422 with one pointer (body) or parameter (query) per message.
    Unknown query parameters are ignored; unknown body members are refused (the schema's default).
    """
    if location == "json":
        data, unknown = load_json_body(request), None
    else:
        data, unknown = query_args(request), EXCLUDE
    if precheck is not None:
        precheck(data)
    try:
        return schema.load(data, unknown=unknown)
    except ValidationError as error:
        raise invalid(error.messages, query=location != "json") from None
