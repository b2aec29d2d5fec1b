"""Two patches of gunicorn 27's sync worker, applied by :func:`install` (from service/gunicorn.conf.py).

- :class:`OneWriteResponse`: the status line and headers go out with the first body chunk, in one sendall.
  gunicorn wrote them in two: a replica killed in between left nginx holding headers it had passed on, unable to
  retry the request elsewhere (the client saw a truncated response). One write also saves a syscall and a segment.
- :func:`write_problem`: what gunicorn's HTTP parser refuses before the app sees it (a malformed request line,
  method or header, a request line past limit_request_line, too many or too large headers...) is answered as the
  app answers every other error, application/problem+json with a fresh X-Request-Id, instead of an HTML page.
"""

from __future__ import annotations

import http

from gunicorn import util
from gunicorn.http import wsgi

ONE_WRITE_MAX = 1 << 20  # bodies up to this size are joined to the headers for one sendall


def install() -> None:
    """Patch gunicorn in this process (the workers inherit it)."""
    wsgi.Response = OneWriteResponse  # wsgi.create() builds every response from this module global
    util.write_error = write_problem  # the workers call it as util.write_error


class _Capture:
    """Stands in for the socket while gunicorn writes the headers, keeping the bytes."""

    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


class OneWriteResponse(wsgi.Response):
    """gunicorn's Response, sending the headers with the first body chunk (``_emit_body``, gunicorn 27)."""

    _held = b""

    def write(self, arg):
        if self.headers_sent:
            return super().write(arg)
        sock, self.sock = self.sock, _Capture()
        try:
            self.send_headers()
        finally:
            self.sock, self._held = sock, self.sock.data
        try:
            return super().write(arg)
        finally:
            if self._held:  # no body went out (HEAD, 204, an error): the headers still must
                held, self._held = self._held, b""
                self.sock.sendall(held)

    def _emit_body(self, data):
        held, self._held = self._held, b""
        if held and not self.chunked and len(data) <= ONE_WRITE_MAX:
            return self.sock.sendall(held + data)
        if held:  # a large body goes out in many segments anyway: no joining copy of it
            self.sock.sendall(held)
        return super()._emit_body(data)


def write_problem(sock, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's ``util.write_error``, writing an RFC 9457 problem instead of an HTML page. The title is
    the status's own phrase (gunicorn passes "Bad Request" with its 501 and 500)."""
    # Imported in the worker: with GUNICORN_PRELOAD=0 the master keeps no app code (a SIGHUP reloads it).
    from service.problems import problem_bytes
    from service.runtime.requestid import fresh_id

    rid = fresh_id()
    title = http.HTTPStatus(status_int).phrase
    body = problem_bytes(status_int, title, (mesg or title)[:300], request_id=rid)
    head = (f"HTTP/1.1 {status_int} {title}\r\nConnection: close\r\nContent-Type: application/problem+json\r\n"
            f"X-Request-Id: {rid}\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)
