"""The Redis the batch-job tests queue on (tests/harness.py RedisServer): it answers at its URL, as redis-py (Huey's
client) reads one, on loopback only, and persists nothing."""

from __future__ import annotations

import redis


def test_the_tests_redis_answers_at_its_url_and_keeps_nothing_on_disk(redis_url):
    client = redis.Redis.from_url(redis_url)
    assert client.ping()
    client.set("greeting", "hello")
    assert client.get("greeting") == b"hello"
    assert client.config_get("bind") == {"bind": "127.0.0.1"}
    assert client.config_get("save") == {"save": ""} and client.config_get("appendonly") == {"appendonly": "no"}
