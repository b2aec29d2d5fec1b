"""Records of files, batches and leases, as JSON values in Huey's own storage (its key-value table in SQLite, its
results hash in Redis), so every replica and worker sees the same ones.

No record is updated in place by two writers: what several workers may write at once is written once, by
:meth:`Store.claim` (SQLite's ``insert or abort``, Redis' ``HSETNX``), so a chunk finished twice counts once and a
batch is finished once. Only leases are overwritten (by the one worker that holds them, or the reaper once they ran
out).

Indexes: named sets of strings kept in order (a table of their own in SQLite, a sorted set of equal scores per index
in Redis, ordered by the member's bytes), read by range: the unfinished batches, each owner's files and batches
newest first, what is due for deletion by when (service.jobs.keys). A list, the reaper and a deletion read what they
need from them, never every record the store holds. :meth:`Store.commit` writes records and index members in one
transaction, so that neither is ever seen without the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from huey.storage import BaseStorage


INDEX_TABLE = ("create table if not exists attention_index (queue text not null, name text not null, "
               "member text not null, primary key (queue, name, member)) without rowid")


class Store:
    """JSON records in ``storage`` (a Huey storage: SqliteStorage or a RedisStorage), and indexes beside them."""

    def __init__(self, storage: BaseStorage) -> None:
        self.storage = storage
        self.redis = getattr(storage, "result_key", None) is not None  # RedisStorage keeps the records in one hash
        if not self.redis:
            storage.sql(INDEX_TABLE, commit=True)

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

    def commit(self, *, put: Mapping[str, Any] | None = None, delete: Iterable[str] = (),
               add: Mapping[str, Iterable[str]] | None = None, remove: Mapping[str, Iterable[str]] | None = None
               ) -> None:
        """In one transaction: write the records ``put`` (key -> record), delete the records ``delete``, add and
        remove index members (index -> members)."""
        put, delete = put or {}, list(delete)
        add = {index: list(members) for index, members in (add or {}).items()}
        remove = {index: list(members) for index, members in (remove or {}).items()}
        if self.redis:
            pipe = self.storage.conn.pipeline(transaction=True)
            if put:
                pipe.hset(self.storage.result_key, mapping={key: orjson.dumps(value) for key, value in put.items()})
            if delete:
                pipe.hdel(self.storage.result_key, *delete)
            for index, members in add.items():
                if members:
                    pipe.zadd(self._index_key(index), dict.fromkeys(members, 0))
            for index, members in remove.items():
                if members:
                    pipe.zrem(self._index_key(index), *members)
            pipe.execute()
            return
        name = self.storage.name
        with self.storage.db(commit=True) as cursor:
            cursor.executemany("insert or replace into kv (queue, key, value) values (?, ?, ?)",
                               [(name, key, orjson.dumps(value)) for key, value in put.items()])
            cursor.executemany("delete from kv where queue = ? and key = ?", [(name, key) for key in delete])
            cursor.executemany("insert or ignore into attention_index (queue, name, member) values (?, ?, ?)",
                               [(name, index, member) for index, members in add.items() for member in members])
            cursor.executemany("delete from attention_index where queue = ? and name = ? and member = ?",
                               [(name, index, member) for index, members in remove.items() for member in members])

    def members(self, index: str, *, below: str | None = None, limit: int | None = None,
                descending: bool = False) -> list[str]:
        """The members of ``index`` in order (``descending``: the greatest first), only those below ``below``
        (exclusive) if given, at most ``limit``."""
        if self.redis:
            high = b"(" + below.encode() if below is not None else b"+"
            paging = {"start": 0, "num": limit} if limit is not None else {}
            key = self._index_key(index)
            found = (self.storage.conn.zrevrangebylex(key, high, b"-", **paging) if descending
                     else self.storage.conn.zrangebylex(key, b"-", high, **paging))
            return [member.decode() for member in found]
        query = "select member from attention_index where queue = ? and name = ?"
        params: list[Any] = [self.storage.name, index]
        if below is not None:
            query += " and member < ?"
            params.append(below)
        query += " order by member desc" if descending else " order by member"
        if limit is not None:
            query += " limit ?"
            params.append(limit)
        return [member for member, in self.storage.sql(query, params, results=True)]

    def queue_head(self, priority: int) -> bytes | None:
        """The serialized task first in line among those queued with ``priority`` (Huey's priority queue: FIFO
        within a priority), or None: one row or member read, whatever the length of the queue."""
        if self.redis:
            score = -priority  # Huey's PriorityRedisStorage scores a task by its priority, negated
            found = self.storage.conn.zrangebyscore(self.storage.queue_key, score, score, start=0, num=1)
            return found[0][8:] if found else None  # after its 8-byte enqueue-time prefix
        rows = self.storage.sql("select data from task where queue = ? and priority = ? order by id limit 1",
                                (self.storage.name, priority), results=True)
        return bytes(rows[0][0]) if rows else None

    def _index_key(self, index: str) -> str:
        return f"{self.storage.result_key}:{index}"
