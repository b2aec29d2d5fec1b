"""Fixtures for the service tests: the app, its test client, the seed script, problem checks, a real gunicorn."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient
from seed_reference import load_seed

from service import create_app
from service.limits import Limits


@pytest.fixture
def limits() -> Limits:
    """Default limits (tests that probe a boundary build their own app)."""
    return Limits()


@pytest.fixture
def app(limits: Limits) -> Flask:
    return create_app({"TESTING": True, "LIMITS": limits})


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture(scope="session")
def seed_script() -> ModuleType:
    """The seed script from <clone>/../shared/seed/ (skipped, saying so, when it is not there)."""
    return load_seed()


def assert_problem(response: Any, status: int, *pointers: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status, pointing at exactly these pointers."""
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    body = response.get_json(force=True)
    assert body["status"] == status
    assert {"type", "title", "detail"} <= body.keys()
    if pointers:
        assert [e.get("pointer", e.get("parameter")) for e in body["errors"]] == list(pointers)
    return body


ROOT = Path(__file__).resolve().parents[1]
GUNICORN = Path(sys.executable).parent / "gunicorn"
START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def gunicorn_server(**env: str) -> Iterator[str]:
    """Base URL of the real gunicorn (service/gunicorn.conf.py) on a free loopback port, with ``env``
    added to the environment; always stopped afterwards."""
    if not GUNICORN.exists():
        pytest.skip(f"gunicorn not installed next to {sys.executable}")
    port = free_port()
    process = subprocess.Popen([str(GUNICORN), "-c", "service/gunicorn.conf.py", "service.wsgi:app"], cwd=ROOT,
                               env={**os.environ, "PORT": str(port), **env},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if process.poll() is not None:
                pytest.fail(f"gunicorn exited: {process.stdout.read(4000)!r}")
            if time.monotonic() > deadline:
                pytest.fail(f"gunicorn did not answer within {START_TIMEOUT} s")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        process.stdout.close()


LIVE_BODY_LIMIT = 2**20  # small, so the 413 tests over real HTTP stay cheap


@pytest.fixture(scope="session")
def live_server() -> Iterator[str]:
    """Base URL of a real gunicorn (2 workers, max_body_bytes 1 MiB) shared by the session (v2 tests)."""
    with gunicorn_server(WEB_CONCURRENCY="2", ATTENTION_MAX_BODY_BYTES=str(LIVE_BODY_LIMIT)) as url:
        yield url
