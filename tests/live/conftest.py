"""Fixtures for the live tests (real gunicorn, nginx, redis-server, Chromium): servers from tests/harness.py, always
stopped."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.harness import GUNICORN, Gunicorn, LaunchError, RedisServer, in_ci, nginx_available, redis_available

LIVE_BODY_LIMIT = 2**20  # small, so the 413 tests over real HTTP stay cheap


@contextmanager
def gunicorn_server(**env: str) -> Iterator[str]:
    """Base URL of the real gunicorn (service/gunicorn.conf.py) on a free loopback port, with ``env``
    added to the environment; always stopped afterwards (see tests/harness.py)."""
    if not GUNICORN.exists():
        pytest.skip(f"gunicorn not installed next to {GUNICORN.parent}")
    try:
        with Gunicorn(env) as server:
            yield server.url
    except LaunchError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def live_server() -> Iterator[str]:
    """Base URL of a real gunicorn (2 workers, max_body_bytes 1 MiB) shared by the session (v2 tests)."""
    with gunicorn_server(WEB_CONCURRENCY="2", ATTENTION_MAX_BODY_BYTES=str(LIVE_BODY_LIMIT)) as url:
        yield url


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """URL of a fresh redis-server on a free loopback port, one per test module (its queues start empty), always
    stopped. Skipped, saying why, where redis-server is not installed; in CI that is a failure."""
    if not redis_available():
        why = "redis-server not installed (apt-get install -y redis-server); CI installs it"
        (pytest.fail if in_ci() else pytest.skip)(why)
    try:
        with RedisServer() as server:
            yield server.url
    except LaunchError as error:
        pytest.fail(str(error))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs_nginx``: skipped, saying why, where nginx is not installed; in CI (tests/harness.py
    in_ci) a missing nginx is a failure, not a skip."""
    if item.get_closest_marker("needs_nginx") and not nginx_available() and not in_ci():
        pytest.skip("nginx not installed (apt-get install -y nginx); CI installs it")
