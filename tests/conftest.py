"""Fixtures for the service tests: the app, its test client, the seed script, problem checks, a real gunicorn."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from seed_reference import load_seed

# The tests run the service with its defaults, as CI does, whatever a developer's shell has set: e.g. a
# PROMETHEUS_MULTIPROC_DIR left from running gunicorn by hand puts service.runtime.metrics in multiprocess mode
# at import,
# LOG_REQUESTS=0 silences the log lines tests read, ATTENTION_MAX_* move the limits, GUNICORN_* and WEB_CONCURRENCY
# reach the test servers (which copy this environment). A test that needs a setting passes it to its own app or
# server. tests/test_packaging.py checks that every variable the service reads is cleared here.
SERVICE_VARIABLES = ("PROMETHEUS_MULTIPROC_DIR", "LOG_REQUESTS", "LOG_BUFFER_BYTES", "LOG_FLUSH_SECONDS",
                     "METRICS_FLUSH_SECONDS", "API_KEYS", "CORS_ORIGINS", "WEB_CONCURRENCY", "HOST", "PORT")
SERVICE_PREFIXES = ("ATTENTION_", "GUNICORN_")  # the limits, gunicorn's settings, the metrics master's mark
for variable in [*SERVICE_VARIABLES, *(name for name in os.environ if name.startswith(SERVICE_PREFIXES))]:
    os.environ.pop(variable, None)

from launch import GUNICORN, LaunchError, gunicorn  # noqa: E402
from launch import ROOT as ROOT  # noqa: E402  (re-exported: tests read files of the repository)

from service.edge import create_app  # noqa: E402  (after the clean-up above)
from service.operations.limits import Limits  # noqa: E402


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
    added to the environment; always stopped afterwards (see tests/launch.py)."""
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
