"""The batch jobs' settings, read from the environment: where the data lives, which queue, and the timings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def _number(environ: Mapping[str, str], variable: str, default: float, *, integer: bool = False) -> float:
    """A positive number from ``environ`` (an integer where ``integer``), or a ValueError naming the variable."""
    raw = environ.get(variable)
    if raw is None:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = 0
    if not value > 0 or value == float("inf"):
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ValueError(f"{variable} must be {kind}, got {raw!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """``data_dir``: file bodies, chunk results and (without ``queue_url``) the SQLite queue, shared by the API and
    every worker. ``queue_url``: ``redis://...`` to share the queue across machines. ``chunk_items``: items a worker
    computes in one task. ``lease_seconds``: how long a chunk's worker may go silent before the chunk is run again
    elsewhere; ``reap_seconds``: how often lost chunks, cancellations and expiries are looked for;
    ``window_seconds``: what ``completion_window: "24h"`` means."""

    data_dir: Path = Path("data")
    queue_url: str | None = None
    chunk_items: int = 256
    lease_seconds: float = 60.0
    reap_seconds: float = 10.0
    window_seconds: float = 86400.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """ATTENTION_DATA_DIR, ATTENTION_QUEUE_URL, ATTENTION_BATCH_CHUNK_ITEMS, ATTENTION_BATCH_LEASE_SECONDS,
        ATTENTION_BATCH_REAP_SECONDS, ATTENTION_BATCH_WINDOW_SECONDS; unset ones keep the defaults."""
        url = environ.get("ATTENTION_QUEUE_URL") or None
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"ATTENTION_QUEUE_URL must be a redis:// URL (unset: SQLite), got {url[:80]!r}")
        return cls(
            data_dir=Path(environ.get("ATTENTION_DATA_DIR") or cls.data_dir),
            queue_url=url,
            chunk_items=int(_number(environ, "ATTENTION_BATCH_CHUNK_ITEMS", cls.chunk_items, integer=True)),
            lease_seconds=_number(environ, "ATTENTION_BATCH_LEASE_SECONDS", cls.lease_seconds),
            reap_seconds=_number(environ, "ATTENTION_BATCH_REAP_SECONDS", cls.reap_seconds),
            window_seconds=_number(environ, "ATTENTION_BATCH_WINDOW_SECONDS", cls.window_seconds))
