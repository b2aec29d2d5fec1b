"""What a process of the service sets before it imports numpy: one BLAS thread (OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS, MKL_NUM_THREADS [1]). The processes are the parallelism: two gunicorn workers of two BLAS
threads each ran the same work 2-3x slower. Import this module first (gunicorn's config, the WSGI entry point,
attention-worker); a value set in the environment is kept.
"""

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
