"""service.jobs.store on both backends (Huey's SqliteStorage in tmp_path, a RedisStorage on a real redis-server):
records read and written, a claim won once, scans that see only their prefix."""

from __future__ import annotations

import threading

import pytest

from tests.unit.jobs.conftest import build


@pytest.fixture
def store(make_jobs):
    return make_jobs().store


def test_a_record_is_read_back_as_written_and_overwritten_by_put(store):
    assert store.get("file:none") is None
    store.put("file:a", {"id": "a", "bytes": 12, "nested": [1, 2.5, None, "é"]})
    assert store.get("file:a") == {"id": "a", "bytes": 12, "nested": [1, 2.5, None, "é"]}
    store.put("file:a", {"id": "a", "bytes": 13})
    assert store.get("file:a") == {"id": "a", "bytes": 13}


def test_get_many_answers_in_the_order_asked_with_none_for_missing_ones(store):
    for i in range(0, 1200, 2):  # more keys than SQLite takes parameters in one statement
        store.put(f"job:b:chunk:{i}", {"i": i})
    asked = [f"job:b:chunk:{i}" for i in reversed(range(1200))]
    assert store.get_many(asked) == [{"i": i} if i % 2 == 0 else None for i in reversed(range(1200))]
    assert store.get_many([]) == []


def test_a_claim_writes_only_the_first_time(store):
    assert store.claim("job:b:final", {"status": "completed"}) is True
    assert store.claim("job:b:final", {"status": "cancelled"}) is False
    assert store.get("job:b:final") == {"status": "completed"}


def test_of_many_connections_racing_to_claim_one_wins(tmp_path, backend):
    # Each racer has its own connection (its own Jobs), as two workers do.
    racers = [build(tmp_path / "data", backend).store for _ in range(8)]

    def claim(store, key: str, barrier: threading.Barrier, won: list[int]) -> None:
        barrier.wait()
        if store.claim(key, {"by": id(store)}):
            won.append(id(store))

    for round_ in range(5):
        key, barrier, won = f"job:b:chunk:{round_}", threading.Barrier(len(racers)), []
        threads = [threading.Thread(target=claim, args=(store, key, barrier, won)) for store in racers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1
        assert racers[0].get(key) == {"by": won[0]}


def test_delete_removes_those_keys_only_and_missing_ones_are_fine(store):
    for key in ("job:b:lease:0", "job:b:lease:1", "job:b:lease:2"):
        store.put(key, {"state": "queued"})
    store.delete(["job:b:lease:0", "job:b:lease:2", "job:b:lease:9"])
    store.delete([])
    assert store.get_many(["job:b:lease:0", "job:b:lease:1", "job:b:lease:2"]) == [None, {"state": "queued"}, None]


def test_scan_sees_exactly_the_keys_with_that_prefix(store):
    keys = ["file:a", "file:b", "filex", "file", "batch:a", "job:batch_1:chunk:0", "job:batch_10:chunk:0"]
    for key in keys:
        store.put(key, {"key": key})
    assert sorted(store.scan("file:")) == [("file:a", {"key": "file:a"}), ("file:b", {"key": "file:b"})]
    assert [key for key, _ in store.scan("job:batch_1:")] == ["job:batch_1:chunk:0"]
    assert list(store.scan("nothing:")) == []


@pytest.mark.parametrize("prefix", ["a*", "a?", "a[b]", "a\\", "a%", "a_"])
def test_scan_takes_a_prefix_literally_even_with_glob_or_like_characters(store, prefix):
    decoys = ["a", "ab", "a*", "a?", "a[b]", "a\\", "a%", "a_", "b"]
    for key in decoys:
        store.put(key + ":1", {"key": key + ":1"})
        store.put(key + "x:2", {"key": key + "x:2"})
    found = sorted(key for key, _ in store.scan(prefix))
    assert found == [prefix + ":1", prefix + "x:2"]  # as a glob "ab" would match "a?" and "a[b]"


def test_scan_reads_many_records(store):
    for i in range(2500):  # several pages of Redis' HSCAN (count 1000)
        store.put(f"batch:{i:05}", {"i": i})
    store.put("file:other", {})
    assert sorted(record["i"] for _, record in store.scan("batch:")) == list(range(2500))
