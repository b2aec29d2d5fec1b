"""The real server in a subprocess: gunicorn with service/gunicorn.conf.py on a free loopback port.

For the tests and benchmarks that talk real HTTP. Bounded: waits at most ``start_timeout`` for
/healthz, and always stops the server (SIGTERM, then SIGKILL) when the ``with`` block ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUNICORN = Path(sys.executable).parent / "gunicorn"


class LaunchError(RuntimeError):
    """gunicorn exited or did not answer in time (the message holds its first output)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Server:
    """A running gunicorn: its base URL and master process id."""

    url: str
    pid: int

    def worker_pids(self) -> list[int]:
        """The workers: the master's child processes (Linux /proc)."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        return [int(pid) for pid in children]


@contextmanager
def gunicorn(env: Mapping[str, str] | None = None, *, start_timeout: float = 30.0,
             app: str = "service.wsgi:app") -> Iterator[Server]:
    """Run gunicorn with ``env`` added to this environment (PORT is chosen here) until the block ends.

    ``app`` is the WSGI app (module:name, importable from the repository root)."""
    port = free_port()
    # A file, not a pipe: the app writes a log line per request, and a pipe nobody reads fills up
    # (64 KiB, a few hundred requests) and then blocks every worker.
    output = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    process = subprocess.Popen([str(GUNICORN), "-c", "service/gunicorn.conf.py", app], cwd=ROOT,
                               env={**os.environ, **(env or {}), "PORT": str(port)},
                               stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        workers = int((env or {}).get("WEB_CONCURRENCY", 1))  # at least that many, all forked
        while not _healthy(url) or len(Server(url, process.pid).worker_pids()) < workers:
            if process.poll() is not None:
                output.seek(0)
                raise LaunchError(f"gunicorn exited: {output.read(4000)!r}")
            if time.monotonic() > deadline:
                raise LaunchError(f"gunicorn did not answer within {start_timeout} s")
            time.sleep(0.1)
        yield Server(url, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        output.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False
