"""service.runtime.logwriter under a real gunicorn: request lines within the interval, and all of them at a
graceful stop (the writer alone: tests/unit/runtime/test_logwriter.py)."""

from __future__ import annotations

import time

import requests

from tests.harness import Gunicorn


def request_ids(server: Gunicorn) -> list[str]:
    return [line.split('"request_id":"')[1].split('"')[0] for line in server.log().splitlines()
            if '"event":"request"' in line]


def test_gunicorn_writes_request_lines_within_the_interval_and_all_at_a_graceful_stop():
    sent = [f"line-{i}" for i in range(12)]
    with Gunicorn({"LOG_FLUSH_SECONDS": "0.5"}, compose=True) as server:
        for rid in sent[:6]:
            requests.get(f"{server.url}/healthz", headers={"X-Request-Id": rid}, timeout=10)
        deadline = time.monotonic() + 5
        while set(sent[:6]) - set(request_ids(server)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(sent[:6]) <= set(request_ids(server))
    with Gunicorn({"LOG_FLUSH_SECONDS": "600"}, compose=True) as server:
        for rid in sent[6:]:
            requests.get(f"{server.url}/healthz", headers={"X-Request-Id": rid}, timeout=10)
        server.terminate()
        assert server.process.wait(timeout=25) == 0
        assert sorted(rid for rid in request_ids(server) if rid.startswith("line-")) == sorted(sent[6:])
