"""The reaper: every ATTENTION_BATCH_REAP_SECONDS it queues again what a dead worker lost (service.jobs.leases),
finishes batches that are cancelled or past their window once no chunk is in a worker's hands, and deletes what is
past its retention: an upload at its ``expires_at`` unless an unfinished batch reads it, a finished batch with its
output and error files ``file_retention_seconds`` after its end.

Its work grows with the unfinished batches, never with history: it reads the unfinished batches' index, one task per
priority of the queue (never the whole queue), and what is due from the deletions' index, at most
:data:`DELETED_PER_REAP` a run.

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

from service.jobs import files, finalize, keys, leases, records
from service.jobs.context import Jobs

DELETED_PER_REAP = 100  # files and batches deleted at most by one run: a long backlog is deleted over several


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
    """Settle every unfinished batch, and delete what is past its retention."""
    first = leases.heads(jobs)
    needed = set()
    for record in records.unfinished(jobs):
        if not settle(jobs, record["id"], first):
            needed.add(record["input_file_id"])
    delete_due(jobs, needed)


def delete_due(jobs: Jobs, needed: set[str]) -> None:
    """Delete what is due now, at most :data:`DELETED_PER_REAP` (the next run goes on), except the uploads in
    ``needed`` (read by an unfinished batch: kept, and looked at again next run)."""
    below = keys.timed(time.time() + 1, "")  # every member due at this second or before
    for member in jobs.store.members(keys.DUE, below=below, limit=DELETED_PER_REAP + len(needed)):
        kind, name = keys.untimed(member).split(":", 1)
        if kind == "batch":
            forget(jobs, name, member)
        elif name not in needed:
            file = jobs.store.get(keys.file(name))
            if file is None:  # deleted by its owner meanwhile
                jobs.store.commit(remove={keys.DUE: [member]})
            else:
                files.remove(jobs, file)


def forget(jobs: Jobs, batch_id: str, member: str) -> None:
    """A finished batch gone, with its output and error files (their records, then their bodies): afterwards it
    answers 404 as any batch that never was. ``member``: its place in the deletions' index."""
    batch = records.read(jobs, batch_id)
    outputs = [file for file in jobs.store.get_many([keys.file(file_id) for file_id in keys.output_files(batch_id)])
               if file is not None]
    gone: dict[str, list[str]] = {keys.DUE: [member], keys.OPEN: [batch_id]}
    if batch.record is not None:
        gone[keys.owned("batches", batch.record["owner"])] = [keys.timed(batch.record["created_at"], batch_id)]
        for file in outputs:
            for index, members in files.listed(file).items():
                gone.setdefault(index, []).extend(members)
    found = records.keys_of(batch) if batch.record is not None else []
    jobs.store.commit(delete=[*found, *(keys.file(file["id"]) for file in outputs)], remove=gone)
    jobs.bodies.remove_batch(batch_id)


def settle(jobs: Jobs, batch_id: str, first: dict[str, float | None] | None = None) -> bool:
    """Move ``batch_id`` on: finish it when it is stopping and nobody holds a chunk; with ``first`` (the queue's
    first task per priority: service.jobs.leases.heads; {} where none may be), queue again each lost unit. True
    when the batch is finished (done or failed), which takes it out of the unfinished ones."""
    batch = records.read(jobs, batch_id, counts=True)
    if batch.record is None:
        return True
    if batch.finished:
        records.retire(jobs, batch)  # its finisher's own retire did not happen (it died in between)
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
    if first is not None:
        for unit, lease in zip(units, held, strict=True):
            if leases.lost(lease, now, first, leases.task_of(batch_id, unit)[0]):
                leases.enqueue(jobs, batch_id, unit)
    return False


def reindex(jobs: Jobs) -> None:
    """Put the records kept before the indexes (a store written by the version before them) into the indexes,
    once per store: every file and batch read, this once (``attention-worker`` calls it at its start)."""
    if jobs.store.get(keys.INDEXED) is not None:
        return
    add: dict[str, list[str]] = {keys.OPEN: [], keys.DUE: []}
    for _, file in jobs.store.scan("file:"):
        for index, members in files.listed(file).items():
            add.setdefault(index, []).extend(members)
        if "batch" not in file:
            add[keys.DUE].append(files.due(file))
    for batch in records.read_many(jobs, [record for _, record in jobs.store.scan("batch:")]):
        record = batch.record
        add.setdefault(keys.owned("batches", record["owner"]), []).append(keys.timed(record["created_at"],
                                                                                       record["id"]))
        if batch.finished:
            add[keys.DUE].append(records.due(jobs, batch))
        else:
            add[keys.OPEN].append(record["id"])
    jobs.store.commit(add=add)
    jobs.store.claim(keys.INDEXED, {"at": time.time()})
