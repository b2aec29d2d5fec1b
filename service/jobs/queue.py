"""The jobs of one process built: its Huey (SQLite under ATTENTION_DATA_DIR, or Redis), the store, the bodies, the
tasks, in a :class:`service.jobs.context.Jobs`.

Built on first use in each process (:func:`current`), never in gunicorn's preloaded master: a SQLite connection
or a Redis socket opened before the fork would be shared by every worker.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from service.jobs import tasks
from service.jobs.bodies import Bodies
from service.jobs.context import Jobs
from service.jobs.store import Store
from service.settings import JobSettings, Limits
from service.settings import current as current_settings

if TYPE_CHECKING:
    from huey.api import Huey

QUEUE = "attention-jobs"


def build(settings: JobSettings, limits: Limits) -> Jobs:
    """The jobs for ``settings``: the queue opened (its folder made), the tasks registered."""
    # Imported here: a web worker that never serves a job does without huey and redis-py (~12 MB each).
    from huey import PriorityRedisHuey, SqliteHuey

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.queue_url:
        huey: Huey = PriorityRedisHuey(QUEUE, url=settings.queue_url, results=False, utc=True)
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
