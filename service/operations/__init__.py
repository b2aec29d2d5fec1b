"""The operations: what the service computes, declared once, with no Flask and no werkzeug.

Lives here: the operation registry (``registry``: one entry per operation, from which the /v1 routes, /v1/batch,
the /v2 models, the heatmaps and the documented examples are derived), one module per operation family, the size
model (``sizes``: the 422 limit checks, the batch budget and GET /v1/limits' descriptions), the limits, batching
and the pictures. May import: the engine (``attention``), ``schemas``, ``service.problems`` and
``service.runtime.metrics``; never ``service.edge``.
"""
