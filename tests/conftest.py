"""Fixtures for every test: the app, its test client, the seed script, problem checks (live servers:
tests/live/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

# The tests run the service with its defaults, as CI does, whatever a developer's shell has set: e.g. a
# PROMETHEUS_MULTIPROC_DIR left from running gunicorn by hand puts service.runtime.metrics in multiprocess mode
# at import,
# LOG_REQUESTS=0 silences the log lines tests read, ATTENTION_MAX_* move the limits, GUNICORN_* and WEB_CONCURRENCY
# reach the test servers (which copy this environment). A test that needs a setting passes it to its own app or
# server. tests/unit/test_packaging.py checks that every variable the service reads is cleared here.
SERVICE_VARIABLES = ("PROMETHEUS_MULTIPROC_DIR", "LOG_REQUESTS", "LOG_BUFFER_BYTES", "LOG_FLUSH_SECONDS",
                     "METRICS_FLUSH_SECONDS", "API_KEYS", "CORS_ORIGINS", "WEB_CONCURRENCY", "HOST", "PORT")
SERVICE_PREFIXES = ("ATTENTION_", "GUNICORN_")  # the limits, gunicorn's settings, the metrics master's mark
for variable in [*SERVICE_VARIABLES, *(name for name in os.environ if name.startswith(SERVICE_PREFIXES))]:
    os.environ.pop(variable, None)

from service.edge import create_app  # noqa: E402  (after the clean-up above)
from service.operations.limits import Limits  # noqa: E402
from service.runtime.logwriter import stdout_lines  # noqa: E402
from tests.seed_reference import load_seed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # tests read files of the repository


@pytest.fixture(autouse=True)
def _request_lines_written_in_their_test() -> Iterator[None]:
    """Each test's request log lines are written before its teardown ends, while pytest still captures fd 1.

    The app batches its lines (service/runtime/logwriter.py) and writes them from a timer thread up to
    LOG_FLUSH_SECONDS later, or at exit: written between two tests, or after pytest has given fd 1 back, they
    went to the terminal (a full run ended with hundreds of them). Flushed here, they land in the test's own
    captured output (shown when it fails), and tests that read them (capfd) still do."""
    yield
    if stdout_lines.cache_info().currsize:  # only a writer some app of this process made
        stdout_lines().flush()


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
