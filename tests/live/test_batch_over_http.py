"""POST /v1/batch over real HTTP: the documented example through gunicorn (the rest:
tests/unit/edge/v1/test_service_batch.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from service.edge.v1 import examples
from tests.live.conftest import gunicorn_server


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with gunicorn_server(WEB_CONCURRENCY="1") as url:
        yield url


def test_the_example_batch_over_real_http_with_gunicorn(server):
    """The real server: the documented example, answered as the single endpoints answer."""
    response = requests.post(f"{server}/v1/batch", json=examples.request("batch"), timeout=10)
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    answers = response.json()["responses"]
    assert [(a["id"], a["status"]) for a in answers] == [("lookup", 200), ("typo", 422), ("causal", 200), ("pe", 200)]
    assert answers[0]["body"] == requests.post(f"{server}/v1/attention", json=examples.request("attention"),
                                               timeout=10).json()
