"""The Flask edge: the app factory (:func:`create_app`), request parsing, errors, auth and CORS, the spec and
the pages, health, and the ``v1`` and ``v2`` blueprints (one per area; adding an area is one line in
``BLUEPRINTS``). /metrics, request ids and the log line are the observability middleware's.

May import: service.operations (the registry, the size model, the reference data), service.runtime,
service.problems, ``schemas``; the engine only by its error types (``attention.errors``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask

from service.edge import health, observability, pages, security, spec
from service.edge.jsonio import OrjsonProvider
from service.edge.smorest import init_api
from service.edge.v1 import attention, batch, batches, chat, demos, files, heatmap, limits, models, reference
from service.edge.v2 import models as v2_models
from service.edge.v2 import routes as v2
from service.jobs.queue import PerProcess
from service.operations import catalogue
from service.settings import Settings, current

# flask-smorest blueprints: routed and documented in the OpenAPI spec.
BLUEPRINTS = (attention.blp, models.blp, reference.blp, demos.blp, heatmap.blp, limits.blp, health.blp, v2.blp,
              batch.blp, files.blp, batches.blp, chat.blp)


@functools.lru_cache(maxsize=1024)
def _is_coroutine_function(func: Callable) -> bool:
    return inspect.iscoroutinefunction(func)


class App(Flask):
    """Flask, asking once per function whether a hook or view is a coroutine function (Flask asks on every
    request, for each of them). No view here is async; one would still work."""

    def ensure_sync(self, func: Callable) -> Callable:
        try:
            coroutine = _is_coroutine_function(func)
        except TypeError:  # an unhashable callable: asked every time, as Flask does
            coroutine = inspect.iscoroutinefunction(func)
        return self.async_to_sync(func) if coroutine else func


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app. ``config`` overrides Flask settings; ``SETTINGS`` (a :class:`service.settings.Settings`)
    those read from the environment. The models ATTENTION_MODELS names are loaded here: in gunicorn's master
    (preload), before the fork, so every worker shares their pages."""
    config = dict(config or {})
    settings: Settings = config.pop("SETTINGS", None) or current()
    loaders = catalogue.entries(settings.models)
    v2_models.refuse_clashes(loaders)  # before seconds of reading weights
    served = {name: load() for name, load in loaders.items()}
    catalogue.install(served)
    app = App(__name__)
    app.json = OrjsonProvider(app)
    app.config.update(config)
    app.extensions["limits"] = settings.limits
    # Opened on first use in each process: never in gunicorn's preloaded master (service.jobs.queue).
    app.extensions["jobs"] = PerProcess(settings.jobs, settings.limits)
    # a middleware: every answer gets a request id, metrics and a log line
    observability.init_app(app, settings.observability)
    security.init_app(app, settings.access)
    api = init_api(app)
    for blueprint in BLUEPRINTS:
        api.register_blueprint(blueprint)
    spec.init_app(app, spec.served(catalogue.DEFAULTS, list(served), v2_models.names()))  # the file, as it is
    app.register_blueprint(pages.blp)  # the playground and the docs page; not part of the API
    return app
