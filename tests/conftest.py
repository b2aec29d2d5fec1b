"""Fixtures for the service tests: the app, its test client, the seed script, problem checks."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
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
