"""WSGI entry point: ``gunicorn service.wsgi:app``.

BLAS threads are pinned to one per process before numpy is imported (workers are the
parallelism; several BLAS threads per worker made the same work 2-3x slower here).
"""

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

from service.edge import create_app  # noqa: E402  (after the thread settings, on purpose)

app = create_app()
