"""Attention as a service: the numpy engine (``attention/``) behind a REST API, in layers, with batch jobs beside.

- ``service.edge``: Flask: the app factory, request parsing, errors, auth and CORS, the spec and pages, health,
  and the ``v1`` and ``v2`` blueprints. Imports the operations; knows the engine only by its error types.
- ``service.operations``: no Flask, no werkzeug: the operation registry, one module per operation family, the
  size model, batching, pictures. Imports the engine, ``schemas/`` and the runtime's metrics.
- ``service.jobs``: no Flask: OpenAI's Batch API on a Huey queue (records, file bodies, the workers' tasks, the
  ``attention-worker`` script). Imports the operations and the runtime; the edge's files and batches views call it.
- ``service.runtime``: gunicorn hooks, metrics, logging, deferred work. Imports neither Flask nor numpy.

``service.wsgi:app`` is the WSGI app; ``service/gunicorn.conf.py`` its gunicorn settings. Nothing heavy is
imported here.
"""
