# Two entry points, both safe on a fresh machine:
#   make serve  -> create .venv, install the project, serve it with gunicorn on 127.0.0.1:$PORT (8000)
#   make test   -> create/update .venv with the test extras, lint, run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup serve test lint openapi bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

serve: setup
	$(VENV)/bin/gunicorn -c service/gunicorn.conf.py service.wsgi:app

lint: setup
	$(PY) -m ruff check .

test: setup lint
	$(PY) -m pytest -q

openapi: setup
	$(PY) -m service.edge.openapi > openapi.yaml

bench: setup
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/engine.py
	$(PY) benchmarks/v2.py
	$(PY) benchmarks/batch.py
	$(PY) benchmarks/http_load.py
