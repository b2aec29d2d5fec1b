"""Leases held by a unit of work (service.jobs.leases.held): written as running, renewed while held by the process's
one renewer thread, deleted at the end and never written again; a real SQLite store, a short lease."""

from __future__ import annotations

import time

from service.jobs import keys, leases, queue
from service.settings import JobSettings, Limits
from tests.harness import wait_for

LEASE = 0.3  # seconds: renewed every 0.1 s


def test_held_leases_are_renewed_by_one_thread_and_gone_for_good_once_released(tmp_path):
    jobs = queue.build(JobSettings(data_dir=tmp_path, lease_seconds=LEASE), Limits())
    first, second = keys.lease("batch_x", "0"), keys.lease("batch_x", "validate")
    with leases.held(jobs, "batch_x", "0"):
        taken = jobs.store.get(first)
        assert taken["state"] == "running" and taken["until"] > time.time()
        renewer = jobs.leases.thread
        with leases.held(jobs, "batch_x", "validate"):
            renewed = {key: jobs.store.get(key)["until"] for key in (first, second)}
            wait_for(lambda: all(jobs.store.get(key)["until"] > until for key, until in renewed.items()), 10,
                     "both leases renewed")
            assert jobs.leases.thread is renewer and renewer.is_alive()  # one thread for every lease held
        assert jobs.store.get(second) is None
        until = jobs.store.get(first)["until"]
        wait_for(lambda: jobs.store.get(first)["until"] > until, 10, "the lease still held renewed")
    assert jobs.store.get(first) is None
    time.sleep(LEASE)  # three renewal periods: a released lease is never written again
    assert jobs.store.get(first) is None
    wait_for(lambda: jobs.leases.thread is None, 10, "the renewer's end once no lease is held")
    renewer.join(10)
    assert not renewer.is_alive()


def test_a_lease_held_after_the_renewer_ended_is_renewed_by_a_new_one(tmp_path):
    jobs = queue.build(JobSettings(data_dir=tmp_path, lease_seconds=LEASE), Limits())
    with leases.held(jobs, "batch_x", "0"):
        ended = jobs.leases.thread
    wait_for(lambda: jobs.leases.thread is None, 10, "the renewer's end")
    with leases.held(jobs, "batch_x", "1"):
        assert jobs.leases.thread is not ended and jobs.leases.thread.is_alive()
        until = jobs.store.get(keys.lease("batch_x", "1"))["until"]
        wait_for(lambda: jobs.store.get(keys.lease("batch_x", "1"))["until"] > until, 10, "a renewal")
    assert jobs.store.get(keys.lease("batch_x", "1")) is None
