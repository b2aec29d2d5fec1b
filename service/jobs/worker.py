"""``attention-worker``: one process running the batch jobs' tasks (a Huey consumer with one worker thread).

Start as many as you like, on as many machines as share ATTENTION_QUEUE_URL (Redis) and ATTENTION_DATA_DIR; without
a URL the queue is SQLite under ATTENTION_DATA_DIR (one machine). The API starts ATTENTION_EMBEDDED_WORKERS of them
itself (service.runtime.embedded). SIGINT: finish the running task, then stop; SIGTERM: stop now (the chunk's lease
runs out and the reaper gives it to another worker).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from service.runtime import process  # noqa: F401  (one BLAS thread a process, before anything imports numpy)
from service.settings import current, refusing

if TYPE_CHECKING:
    from service.jobs.context import Jobs

# Inherited from the API's gunicorn: the web workers' metrics folder is not this process's to write in.
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)

POLL_SECONDS = 0.05  # the longest an idle worker waits between looks at a SQLite queue: a second worker joins in soon


def main(argv: list[str] | None = None) -> int:
    """Run one consumer until it is signalled (``--help``: this module's text)."""
    argparse.ArgumentParser(prog="attention-worker", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    # Until Huey's consumer takes the signals over: a SIGINT during start-up (a quick stop) exits cleanly.
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    settings = current()  # a bad value ends the worker here, in one line
    logging.basicConfig(level=settings.jobs.worker_loglevel.upper(),
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    from service.jobs import queue, reaping
    from service.operations import catalogue

    with refusing():  # the served models, each loaded when a batch first names it (their paths checked now)
        catalogue.install(catalogue.entries(settings.models))
    jobs = queue.current()
    if refused := _unanswered(jobs):
        print(f"attention-worker: {refused[0]}", file=sys.stderr)
        return refused[1]
    reaping.reindex(jobs)  # once per store: the records of a version before the indexes
    reaping.watch(jobs)
    consumer = jobs.huey.create_consumer(workers=1, periodic=False, initial_delay=0.05, backoff=1.5,
                                         max_delay=POLL_SECONDS, scheduler_interval=1)
    consumer.run()
    return 0


def _unanswered(jobs: Jobs) -> tuple[str, int] | None:
    """Why the queue does not answer a first read, and the exit status (2: the credentials, which no restart
    mends; 1: out of reach, which may pass), or None when it answers."""
    from redis.exceptions import AuthenticationError, ResponseError

    from service.jobs import keys, queue

    where = queue.shown(jobs.settings.queue_url) if jobs.settings.queue_url else str(jobs.settings.data_dir)
    try:
        jobs.store.get(keys.REAPER)
    except (AuthenticationError, ResponseError) as error:  # NOAUTH / WRONGPASS, or AUTH with no password set there
        return (f"the Redis at {where} refused the credentials ({error}): give it its password in "
                "ATTENTION_QUEUE_PASSWORD or in ATTENTION_QUEUE_URL (redis://:password@host:6379/0)"), 2
    except queue.unreachable() as error:
        return f"the batch jobs' queue at {where} did not answer ({error})", 1
    return None


if __name__ == "__main__":
    sys.exit(main())
