"""A replica that has gone wrong (tests/live/test_topology.py): it reads each request whole, so nginx has sent it,
then answers 502; only /healthz answers 200, so tests.harness.Gunicorn sees it start."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
    """The WSGI app: 502 with an empty body for everything but /healthz, once the body has been read."""
    environ["wsgi.input"].read()
    healthy = environ["PATH_INFO"] == "/healthz"
    start_response("200 OK" if healthy else "502 Bad Gateway", [("Content-Length", "0")])
    return [b""]
