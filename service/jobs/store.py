"""Records of files, batches and leases, as JSON values in Huey's own storage (its key-value table in SQLite, its
results hash in Redis), so every replica and worker sees the same ones.

No record is updated in place by two writers: what several workers may write at once is written once, by
:meth:`Store.claim` (SQLite's ``insert or abort``, Redis' ``HSETNX``), so a chunk finished twice counts once and a
batch is finished once. Only leases are overwritten (by the one worker that holds them, or the reaper once they ran
out).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from huey.storage import BaseStorage


class Store:
    """JSON records in ``storage`` (a Huey storage: SqliteStorage or a RedisStorage)."""

    def __init__(self, storage: BaseStorage) -> None:
        self.storage = storage
        self.redis = getattr(storage, "result_key", None) is not None  # RedisStorage keeps the records in one hash

    def get(self, key: str) -> Any:
        """The record at ``key``, or None."""
        from huey.constants import EmptyData  # loaded with the storage already (service.jobs.queue.build)

        value = self.storage.peek_data(key)
        return None if value is EmptyData else orjson.loads(value)

    def get_many(self, keys: list[str]) -> list[Any]:
        """The records at ``keys`` (None where there is none), in one round trip."""
        if not keys:
            return []
        if self.redis:
            values = self.storage.conn.hmget(self.storage.result_key, keys)
        else:
            found: dict[str, bytes] = {}
            for start in range(0, len(keys), 500):  # SQLite takes at most 999 parameters per statement
                part = keys[start:start + 500]
                marks = ",".join("?" * len(part))
                rows = self.storage.sql(f"select key, value from kv where queue = ? and key in ({marks})",
                                        (self.storage.name, *part), results=True)
                found.update((key, bytes(value)) for key, value in rows)
            values = [found.get(key) for key in keys]
        return [None if value is None else orjson.loads(value) for value in values]

    def put(self, key: str, value: Any) -> None:
        """Write (or overwrite) the record at ``key``."""
        self.storage.put_data(key, orjson.dumps(value))

    def claim(self, key: str, value: Any) -> bool:
        """Write the record at ``key`` only if there is none; True if this call wrote it."""
        return bool(self.storage.put_if_empty(key, orjson.dumps(value)))

    def delete(self, keys: Iterable[str]) -> None:
        """Remove the records at ``keys`` (missing ones are fine)."""
        keys = list(keys)
        if self.redis and keys:
            self.storage.conn.hdel(self.storage.result_key, *keys)
        else:
            for key in keys:
                self.storage.pop_data(key)

    def scan(self, prefix: str) -> Iterator[tuple[str, Any]]:
        """Every ``(key, record)`` whose key starts with ``prefix``."""
        if self.redis:
            pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
            for key, value in self.storage.conn.hscan_iter(self.storage.result_key, match=pattern, count=1000):
                yield key.decode(), orjson.loads(value)
            return
        rows = self.storage.sql("select key, value from kv where queue = ? and key >= ? and key < ?",
                                (self.storage.name, prefix, prefix + "\U0010ffff"), results=True)
        for key, value in rows:
            yield key, orjson.loads(bytes(value))
