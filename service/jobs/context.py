"""The batch jobs of one process, in one object: settings, limits, the queue, its records, the bodies, the tasks.
Every view and lifecycle module takes it (service.jobs.queue builds it, once in each process)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from service.jobs.bodies import Bodies
from service.jobs.store import Store
from service.settings import JobSettings, Limits

if TYPE_CHECKING:
    from huey.api import Huey


@dataclass
class Jobs:
    """Everything a view or a worker needs: settings, limits, the queue and its records, the bodies and the
    tasks (``tasks.validate(batch_id)`` enqueues; see service.jobs.tasks)."""

    settings: JobSettings
    limits: Limits
    huey: Huey
    store: Store
    bodies: Bodies
    tasks: Any = None
    leases: Any = None  # service.jobs.leases.Renewer: the leases this process holds, made on first use
