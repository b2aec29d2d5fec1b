"""The reaper: every ATTENTION_BATCH_REAP_SECONDS it queues again what a dead worker lost (service.jobs.leases),
finishes batches that are cancelled or past their window once no chunk is in a worker's hands, and deletes files
past their retention that no unfinished batch needs.

It is a task that schedules itself again (Huey's crontab is minute-grained). One chain runs: it carries a token,
and a run whose token is no longer the stored one stops. Every new batch, and every worker at its start and then
each interval (:func:`watch`), starts a new chain when the stored one has not beaten for three intervals (its
worker died mid-run, or the queue was idle and nobody asked).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

from service.jobs import files, finalize, keys, leases, records
from service.jobs.context import Jobs


def ensure(jobs: Jobs) -> None:
    """Start a reaper chain unless one is beating."""
    beat = jobs.store.get(keys.REAPER)
    if beat is None or time.time() - beat["at"] > 3 * jobs.settings.reap_seconds:
        token = secrets.token_hex(8)
        jobs.store.put(keys.REAPER, {"token": token, "at": time.time()})
        jobs.tasks.reap(token)


def watch(jobs: Jobs) -> None:
    """:func:`ensure` now, then every interval from a thread of this worker's, for as long as it runs. The chain is
    a Huey task, so it dies with a worker killed while running it; without it no lost chunk is queued again and no
    cancel or expiry is finished, however many workers live on."""
    ensure(jobs)

    def look() -> None:
        while True:
            time.sleep(jobs.settings.reap_seconds)
            try:
                ensure(jobs)
            except Exception:  # the queue out of reach for a moment: the next look tries again
                logging.getLogger(__name__).exception("could not look at the reaper's beat")

    threading.Thread(target=look, name="reaper-watch", daemon=True).start()


def chain(jobs: Jobs, token: str) -> None:
    """One run of the chain ``token``: reap, then schedule the next run."""
    beat = jobs.store.get(keys.REAPER)
    if beat is None or beat["token"] != token:
        return  # a newer chain took over
    jobs.store.put(keys.REAPER, {"token": token, "at": time.time()})
    reap(jobs)
    jobs.tasks.reap.schedule((token,), delay=jobs.settings.reap_seconds)


def reap(jobs: Jobs) -> None:
    """Settle every unfinished batch, and delete the files past their retention."""
    pending = {(task.name, *task.args) for task in jobs.huey.pending()}
    needed = set()
    for _, record in list(jobs.store.scan("batch:")):
        if not settle(jobs, record["id"], pending):
            needed.add(record["input_file_id"])
    now = time.time()
    for _, file in list(jobs.store.scan("file:")):
        if file["expires_at"] <= now and file["id"] not in needed:
            files.remove(jobs, file)


def settle(jobs: Jobs, batch_id: str, pending: set[tuple[Any, ...]] | None = None) -> bool:
    """Move ``batch_id`` on: finish it when it is stopping and nobody holds a chunk; with ``pending`` (the queued
    tasks' arguments), queue again each lost unit. True when the batch is finished (done or failed)."""
    batch = records.read(jobs, batch_id, counts=True)
    if batch.record is None or batch.finished:
        return True
    now = time.time()
    if batch.finalizing is not None:
        units = ["finalize"]
    elif batch.validated is not None:
        units = [str(i) for i, count in batch.counts.items() if count is None]
    else:
        units = ["validate"]
    held = jobs.store.get_many([keys.lease(batch_id, unit) for unit in units])
    running = batch.finalizing is None and batch.validated is not None
    # Stopping waits for the validation (its lines are what get the batch_cancelled / batch_expired lines: every
    # custom_id once), then for the chunks in workers' hands.
    if running and (batch.cancel is not None or batch.expiring):
        if not any(leases.live(lease, now) for lease in held):
            finalize.claim(jobs, batch_id, "cancelled" if batch.cancel is not None else "expired")
        return False
    if running and not units:
        finalize.if_complete(jobs, batch_id)  # its last chunk's worker died between its counts and the claim
    if pending is not None:
        for unit, lease in zip(units, held, strict=True):
            if leases.lost(lease, now, pending, leases.task_of(batch_id, unit)):
                leases.enqueue(jobs, batch_id, unit)
    return False
