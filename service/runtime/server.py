"""gunicorn's server hooks for this service, made once per config load from the settings (service/gunicorn.conf.py
assigns them): the workers' heap settings (service.runtime.malloc), the metrics directory kept by the master
(service.runtime.metrics_dir), and gunicorn's own answers as problem+json (service.runtime.gunicorn_patches). The
batch jobs' workers run beside gunicorn, not under it (service.runtime.supervisor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.runtime import gunicorn_patches
from service.runtime.malloc import MallocTuning
from service.runtime.metrics_dir import MetricsDirectory
from service.settings import Settings

if TYPE_CHECKING:
    from gunicorn.arbiter import Arbiter


class Hooks:
    """The hooks of one config load. Made when the config loads: the metrics directory is chosen and emptied
    then, before anything (a preloaded app) imports prometheus_client."""

    def __init__(self, settings: Settings) -> None:
        self.malloc = MallocTuning(settings.server.malloc_keep_mb)
        self.metrics = MetricsDirectory.at_config_load(settings.observability.metrics_dir)
        self.post_fork, self.post_request = self.malloc.post_fork, self.malloc.post_request
        self.pre_exec, self.child_exit, self.on_exit = self.metrics.pre_exec, self.metrics.child_exit, \
            self.metrics.on_exit

    def on_starting(self, server: Arbiter) -> None:
        """In the master before it forks: the workers inherit gunicorn's patched answers."""
        gunicorn_patches.install()
