"""The runtime: what runs around the app in every process: gunicorn's hooks, metrics, logging, deferred work.

Imports neither Flask nor numpy (``service/gunicorn.conf.py`` loads these in gunicorn's master): only the standard
library, gunicorn, prometheus-client, orjson, ``service.problems`` and ``service.settings``.
"""
