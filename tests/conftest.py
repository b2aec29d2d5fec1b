"""Fixtures for every test: the app, its test client, the seed script, problem checks (live servers:
tests/live/conftest.py)."""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from service.settings import VARIABLES

# The tests run the service with its defaults, as CI does, whatever a developer's shell has set: e.g. a
# PROMETHEUS_MULTIPROC_DIR left from running gunicorn by hand puts service.runtime.metrics in multiprocess mode
# at import, LOG_REQUESTS=0 silences the log lines tests read, ATTENTION_MAX_* move the limits, GUNICORN_* and
# WEB_CONCURRENCY reach the test servers (which copy this environment). Every variable the service reads is declared
# in service.settings; the prefixes also catch the metrics master's mark. A test that needs a setting passes it to
# its own app (``create_app({"SETTINGS": ...})``) or server.
SERVICE_PREFIXES = ("ATTENTION_", "GUNICORN_")
for variable in [*VARIABLES, *(name for name in os.environ if name.startswith(SERVICE_PREFIXES))]:
    os.environ.pop(variable, None)
# The batch jobs' files and queue of every app and server the tests start: never the checkout's ./data.
os.environ["ATTENTION_DATA_DIR"] = tempfile.mkdtemp(prefix="attention-data-")
atexit.register(shutil.rmtree, os.environ["ATTENTION_DATA_DIR"], True)

from service.edge import create_app  # noqa: E402  (after the clean-up above)
from service.runtime.logwriter import stdout_lines  # noqa: E402
from service.settings import Limits, Settings, current  # noqa: E402
from tests.seed_reference import load_seed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # tests read files of the repository


# In this process the apps' request log lines are written as each request ends, inside its test, where pytest
# captures fd 1: batched (service/runtime/logwriter.py), a timer thread wrote them up to LOG_FLUSH_SECONDS later,
# between tests or after pytest gave fd 1 back, onto the terminal (a flush in each test's teardown still let
# some through). Batching itself is tested in tests/unit/runtime/test_logwriter.py.
stdout_lines().max_seconds = 0


def settings_with(**changes: Any) -> Settings:
    """The tests' settings (the service's defaults, the batch jobs' data in a temporary folder) with ``changes``
    (``limits=Limits(...)``, ``access=Access(...)``...)."""
    return dataclasses.replace(current(), **changes)


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """``monkeypatch`` for the variables service.settings reads: the process's settings are read again at the next
    ``current()`` (an app built in the test), and once more after it."""
    current.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    current.cache_clear()


def app_with(**changes: Any) -> Flask:
    """A test app of :func:`settings_with` ``changes``."""
    return create_app({"TESTING": True, "SETTINGS": settings_with(**changes)})


@pytest.fixture
def limits() -> Limits:
    """Default limits (tests that probe a boundary build their own app)."""
    return Limits()


@pytest.fixture
def app(limits: Limits) -> Flask:
    return app_with(limits=limits)


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
