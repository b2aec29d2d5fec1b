"""Batch jobs: OpenAI's Batch API contract (files, batches) on a Huey queue, SQLite by default, Redis across machines.

- ``context``: what a process's views and workers hold (``Jobs``), which ``queue`` builds once per process: its
  Huey (its settings are service.settings'), its ``store`` of records (files, batches, leases) in Huey's own
  storage, its ``bodies`` (file bodies and chunk results on disk under ATTENTION_DATA_DIR), its ``tasks``.
- ``records``: a batch's records read together, its status and OpenAI's batch object (``keys`` names them).
- ``files`` and ``batches``: what the API's views call; ``validation``, ``chunks``, ``finalize`` and ``reaping``:
  what the workers run (``leases`` says who holds what); ``worker``: the ``attention-worker`` console script;
  ``census``: what /metrics tells of them, read from the store at each scrape.

May import: service.operations (the answers of items, the limits), service.problems, service.runtime, ``schemas``;
neither Flask nor werkzeug nor service.edge (a worker has no request).
"""
