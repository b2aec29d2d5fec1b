"""The jobs of one process built: its Huey (SQLite under ATTENTION_DATA_DIR, or Redis), the store, the bodies, the
tasks, in a :class:`service.jobs.context.Jobs`.

Built on first use in each process (:func:`current`), never in gunicorn's preloaded master: a SQLite connection
or a Redis socket opened before the fork would be shared by every worker.

Every Redis connection has socket timeouts (ATTENTION_QUEUE_TIMEOUT_SECONDS, above Huey's 1 s blocking read) and is
tried twice: a Redis that stops answering (stopped, not refusing) fails a call within about twice the timeout, which
the API answers as a 503 (:class:`Unavailable`) and a worker's loop survives, instead of hanging on a socket read
that never ends (redis-py's default).
"""

from __future__ import annotations

import math
import os
import sqlite3
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from service.jobs import tasks
from service.jobs.bodies import Bodies
from service.jobs.context import Jobs
from service.jobs.store import Store
from service.problems import TYPE_BASE, Problem
from service.settings import JobSettings, Limits
from service.settings import current as current_settings

if TYPE_CHECKING:
    from huey.api import Huey
    from redis import ConnectionPool

QUEUE = "attention-jobs"
UNAVAILABLE = TYPE_BASE + "queue-unavailable"
RETRY_BACKOFF_SECONDS = 0.2  # before the second try: a connection reset by a Redis restart is usually back by then


class Unavailable(Problem):
    """503: the batch jobs' queue or records did not answer (Redis down, stopped or refusing the credentials; the
    SQLite file locked or the data folder unwritable): try again after ``Retry-After`` seconds."""

    code = 503
    problem_type = UNAVAILABLE

    def __init__(self, retry_after: float) -> None:
        super().__init__("The batch jobs' queue and records did not answer in time (or refused the service's "
                         "credentials): try again later.")
        self.retry_after = math.ceil(retry_after)

    def get_headers(self) -> list[tuple[str, str]]:
        return [("Retry-After", str(self.retry_after))]


def unreachable() -> tuple[type[Exception], ...]:
    """What a store that does not answer raises: Redis down, silent or refusing (redis-py imported only then: ~8 MB
    a web worker otherwise), SQLite's file locked past its timeout or unreadable, ATTENTION_DATA_DIR not writable
    (the queue is opened on first use)."""
    from redis.exceptions import RedisError

    return (RedisError, sqlite3.Error, OSError)


def shown(url: str) -> str:
    """``url`` as a log line may show it: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rsplit('@', 1)[1]}").geturl()


def redis_pool(settings: JobSettings) -> ConnectionPool:
    """The connection pool of ``settings.queue_url``: its timeouts, two tries, and ATTENTION_QUEUE_PASSWORD (which
    wins over the URL's password); TLS with ``rediss://`` (its query sets ``ssl_ca_certs``, ``ssl_cert_reqs``...)."""
    from redis import ConnectionPool
    from redis.backoff import ConstantBackoff
    from redis.retry import Retry

    timeout = settings.queue_timeout_seconds
    pool = ConnectionPool.from_url(settings.queue_url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                   socket_keepalive=True, retry=Retry(ConstantBackoff(RETRY_BACKOFF_SECONDS), 1))
    if settings.queue_password is not None:
        pool.connection_kwargs["password"] = settings.queue_password  # the URL's options would win over from_url's
    return pool


def build(settings: JobSettings, limits: Limits) -> Jobs:
    """The jobs for ``settings``: the queue opened (its folder made), the tasks registered."""
    # Imported here: a web worker that never serves a job does without huey and redis-py (~12 MB each).
    from huey import PriorityRedisHuey, SqliteHuey

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.queue_url:
        huey: Huey = PriorityRedisHuey(QUEUE, connection_pool=redis_pool(settings), results=False, utc=True)
    else:  # WAL (Huey's default): the API and the workers read and write the same file at once
        huey = SqliteHuey(QUEUE, filename=str(settings.data_dir / "queue.sqlite3"), results=False, utc=True,
                          timeout=30)
    jobs = Jobs(settings, limits, huey, Store(huey.storage), Bodies(settings.data_dir))
    jobs.tasks = tasks.register(jobs)
    return jobs


class PerProcess:
    """The jobs of ``settings`` and ``limits``, built once in each process that asks (a forked child builds its
    own: the parent's connection is not its to use)."""

    def __init__(self, settings: JobSettings, limits: Limits) -> None:
        self.settings, self.limits = settings, limits
        self._built: tuple[int, Jobs] | None = None

    def __call__(self) -> Jobs:
        if self._built is None or self._built[0] != os.getpid():
            self._built = (os.getpid(), build(self.settings, self.limits))
        return self._built[1]


_from_env: PerProcess | None = None


def current() -> Jobs:
    """This process's jobs, from the environment (a worker's)."""
    global _from_env
    if _from_env is None:
        _from_env = PerProcess(current_settings().jobs, current_settings().limits)
    return _from_env()
