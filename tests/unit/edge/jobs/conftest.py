"""/v1/files and /v1/batches through the Flask test client of a real app whose jobs live in tmp_path (SQLite), the
queued tasks run by the test (tests/unit/jobs/conftest.py's ``drain``); every answer checked against openapi.yaml."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from service.jobs.context import Jobs
from service.settings import JobSettings
from tests.conftest import app_with
from tests.unit.edge.test_openapi import response_schema, validator
from tests.unit.jobs.conftest import watched


@pytest.fixture
def make_app(tmp_path: Path) -> Callable[..., Flask]:
    """``make_app(limits=..., access=...)``: an app whose batch jobs keep everything under tmp_path/data."""
    def make(**changes: Any) -> Flask:
        return app_with(**{"jobs": JobSettings(data_dir=tmp_path / "data"), **changes})
    return make


@pytest.fixture
def app(make_app) -> Flask:
    return make_app()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def jobs_of(app: Flask) -> Jobs:
    """The app's jobs in this process (the ones its views use), watched for task errors."""
    jobs = app.extensions["jobs"]()
    return jobs if hasattr(jobs, "task_errors") else watched(jobs)


def conforms(response: Any, path: str, method: str) -> Any:
    """The response's JSON, after checking it against what openapi.yaml documents for its status (the problem
    schema for an error)."""
    content_type, media = response_schema(path, method, str(response.status_code))
    assert response.mimetype == content_type, (response.status_code, response.get_data(as_text=True)[:300])
    body = response.get_json()
    validator(media["schema"]).validate(body)
    return body


def upload(client: FlaskClient, content: bytes, filename: str = "requests.jsonl", **headers: str) -> dict[str, Any]:
    """POST /v1/files as the openai client does (a multipart form): the file object."""
    response = client.post("/v1/files", data={"file": (io.BytesIO(content), filename), "purpose": "batch"},
                           content_type="multipart/form-data", headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return conforms(response, "/v1/files", "post")


def stored(tmp_path: Path) -> list[str]:
    """What is under data/files: every body kept, finished or not (temporary parts too)."""
    folder = tmp_path / "data" / "files"
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []
