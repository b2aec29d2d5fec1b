"""service.runtime.gunicorn_patches: headers and body in one sendall; gunicorn's own errors as problem+json."""

from __future__ import annotations

import http.client
import re
import socket
import subprocess
import sys
from types import SimpleNamespace

import orjson
import pytest

from service.runtime.gunicorn_patches import ONE_WRITE_MAX, OneWriteResponse, write_problem


class RecordingSocket:
    """Keeps each sendall's bytes, in order."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def response(length: int | None, *, method: str = "GET") -> OneWriteResponse:
    req = SimpleNamespace(version=(1, 1), method=method, should_close=lambda: False)
    resp = OneWriteResponse(req, RecordingSocket(), SimpleNamespace(sendfile=None))
    resp.status, resp.status_code = "200 OK", 200
    if length is None:
        resp.chunked = True
    else:
        resp.headers = [("Content-Length", str(length))]
        resp.response_length = length
    return resp


def head_and_body(sent: bytes) -> tuple[bytes, bytes]:
    head, _, body = sent.partition(b"\r\n\r\n")
    return head, body


def test_headers_and_a_small_body_go_in_one_sendall():
    resp = response(5)
    resp.write(b"hello")
    [sent] = resp.sock.sent
    head, body = head_and_body(sent)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: 5" in head and body == b"hello"
    assert resp.headers_sent and resp.sent == 5


def test_later_chunks_go_on_their_own():
    resp = response(10)
    resp.write(b"hello")
    resp.write(b"world")
    assert len(resp.sock.sent) == 2 and resp.sock.sent[1] == b"world"


def test_a_body_past_one_write_max_is_not_joined_to_the_headers():
    body = b"x" * (ONE_WRITE_MAX + 1)
    resp = response(len(body))
    resp.write(body)
    head, rest = head_and_body(resp.sock.sent[0])
    assert rest == b"" and b"Content-Length" in head and resp.sock.sent[1:] == [body]


def test_a_body_of_exactly_one_write_max_is_joined():
    resp = response(ONE_WRITE_MAX)
    resp.write(b"y" * ONE_WRITE_MAX)
    assert len(resp.sock.sent) == 1


def test_a_chunked_body_keeps_its_framing():
    resp = response(None)
    resp.write(b"abc")
    resp.close()
    head, rest = head_and_body(resp.sock.sent[0])
    assert b"Transfer-Encoding: chunked" in head and rest == b""
    assert resp.sock.sent[1:] == [b"3\r\nabc\r\n", b"0\r\n\r\n"]


def test_headers_still_go_out_when_no_body_does():
    resp = response(5, method="HEAD")
    resp._omits_body = True  # what gunicorn sets for HEAD, 204 and 304
    resp.write(b"hello")
    [sent] = resp.sock.sent
    assert sent.endswith(b"\r\n\r\n") and b"hello" not in sent


def test_a_write_that_fails_still_sends_the_headers():
    resp = response(5)
    with pytest.raises(TypeError):
        resp.write("not bytes")
    [sent] = resp.sock.sent
    assert sent.startswith(b"HTTP/1.1 200 OK") and sent.endswith(b"\r\n\r\n")


def read_answer(sock: socket.socket) -> http.client.HTTPResponse:
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    return answer


@pytest.mark.parametrize(("status", "reason", "mesg", "title"), [
    (400, "Bad Request", "Invalid request line", "Bad Request"),
    (501, "Bad Request", "Unsupported transfer coding", "Not Implemented"),  # gunicorn's reason is not the title
    (431, "Request Header Fields Too Large", "", "Request Header Fields Too Large"),
])
def test_write_problem_answers_problem_json_with_a_fresh_request_id(status, reason, mesg, title):
    ours, theirs = socket.socketpair()
    with ours, theirs:
        write_problem(ours, status, reason, mesg)
        ours.shutdown(socket.SHUT_WR)
        answer = read_answer(theirs)
        body = orjson.loads(answer.read())
    assert answer.status == status and answer.reason == title
    assert answer.getheader("Content-Type") == "application/problem+json"
    assert answer.getheader("Connection") == "close"
    rid = answer.getheader("X-Request-Id")
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    assert body == {"type": "about:blank", "title": title, "status": status, "detail": mesg or title,
                    "request_id": rid}


def test_write_problem_cuts_a_long_message_and_ids_differ():
    details, ids = [], set()
    for _ in range(2):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            write_problem(ours, 400, "Bad Request", "x" * 1000)
            ours.shutdown(socket.SHUT_WR)
            answer = read_answer(theirs)
            details.append(orjson.loads(answer.read())["detail"])
            ids.add(answer.getheader("X-Request-Id"))
    assert details == ["x" * 300] * 2 and len(ids) == 2


def test_install_patches_gunicorn_only_when_called():
    code = ("from gunicorn import util\n"
            "from gunicorn.http import wsgi\n"
            "from service.runtime import gunicorn_patches as patches\n"
            "print(wsgi.Response is patches.OneWriteResponse, util.write_error is patches.write_problem)\n"
            "patches.install()\n"
            "print(wsgi.Response is patches.OneWriteResponse, util.write_error is patches.write_problem)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.splitlines() == ["False False", "True True"]
