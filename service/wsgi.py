"""WSGI entry point: ``gunicorn service.wsgi:app``. A setting that stops the start-up (a model folder refused,
say) says so in one line (service.settings.refusing)."""

from service.runtime import process  # noqa: F401, I001  (first: one BLAS thread a process, before numpy is imported)
from service.edge import create_app
from service.settings import refusing

with refusing():
    app = create_app()
