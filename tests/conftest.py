"""Fixtures for the service tests: the app, its test client, the seed script, problem checks, a real gunicorn."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from seed_reference import load_seed

from service import create_app
from service.launch import GUNICORN, LaunchError, gunicorn
from service.launch import ROOT as ROOT  # re-exported: tests read files of the repository
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


@contextmanager
def gunicorn_server(**env: str) -> Iterator[str]:
    """Base URL of the real gunicorn (service/gunicorn.conf.py) on a free loopback port, with ``env``
    added to the environment; always stopped afterwards (see service.launch)."""
    if not GUNICORN.exists():
        pytest.skip(f"gunicorn not installed next to {sys.executable}")
    try:
        with gunicorn(env) as server:
            yield server.url
    except LaunchError as error:
        pytest.fail(str(error))


LIVE_BODY_LIMIT = 2**20  # small, so the 413 tests over real HTTP stay cheap


@pytest.fixture(scope="session")
def live_server() -> Iterator[str]:
    """Base URL of a real gunicorn (2 workers, max_body_bytes 1 MiB) shared by the session (v2 tests)."""
    with gunicorn_server(WEB_CONCURRENCY="2", ATTENTION_MAX_BODY_BYTES=str(LIVE_BODY_LIMIT)) as url:
        yield url
