"""Batch jobs: OpenAI's Batch API contract (files, batches) on a Huey queue, SQLite by default, Redis across machines.

- ``settings``: the ATTENTION_* variables of the jobs. ``queue``: the per-process Huey, its store and its tasks.
- ``store``: records (files, batches, leases) in Huey's own storage; ``bodies``: file bodies and chunk results on
  disk under ATTENTION_DATA_DIR.
- ``files`` and ``batches``: what the API's views call; ``validation``, ``chunks``, ``finishing`` and ``reaping``:
  what the workers run; ``worker``: the ``attention-worker`` console script; ``census``: what /metrics tells of
  them, read from the store at each scrape.

May import: service.operations (the answers of items, the limits), service.problems, service.runtime, ``schemas``;
neither Flask nor werkzeug nor service.edge (a worker has no request).
"""
