"""Schema-driven fuzzing: schemathesis against openapi.yaml and the live gunicorn server.

Positive and negative cases (``--mode all``) for every documented operation, bounded (``--max-examples``
per operation and phase, ``--max-time``) and reproducible (``--seed``): no 5xx, every response conforming
to its documented schema, status code and content type, and every request the schema forbids refused
with a 4xx. ``positive_data_acceptance`` is off: a schema-valid request can still break a limit or an
engine rule (422 by design).

POST /v1/batch runs without ``negative_data_rejection``: by design (issue 4) each item's body is
validated alone, and an item whose body its op's schema forbids is answered inside a 200 with that
item's own 422 problem while the other items succeed; every other check still runs on it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, Gunicorn

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
MAX_EXAMPLES = 15  # per operation and phase
SEED = 7
BATCH = "/v1/batch"
# CPython 3.11's ast.parse, called by hypothesis from schemathesis' two worker threads to describe a lambda, fails
# now and then with this (cpython gh-106905): schemathesis then reports an engine error, not a finding.
CPYTHON_AST_FAULT = "AST constructor recursion depth mismatch"


@pytest.fixture(scope="module")
def server():
    with Gunicorn({"LOG_REQUESTS": "0"}, compose=True) as instance:
        yield instance


@pytest.mark.parametrize(("where", "skip_checks"), [
    (["--exclude-path", BATCH], "positive_data_acceptance"),
    (["--include-path", BATCH], "positive_data_acceptance,negative_data_rejection"),
], ids=["every-operation-but-batch", "batch"])
def test_schemathesis_finds_nothing(server, tmp_path, where, skip_checks):
    command = [str(SCHEMATHESIS), "run", str(ROOT / "openapi.yaml"), "--url", server.url, *where, "--mode", "all",
               "--checks", "all", "--exclude-checks", skip_checks, "--max-examples", str(MAX_EXAMPLES),
               "--seed", str(SEED), "--workers", "2", "--request-timeout", "20", "--max-time", "100", "--no-shrink",
               "--phases", "examples,coverage,fuzzing", "--report-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    if result.returncode and CPYTHON_AST_FAULT in result.stdout:  # not ours: run it again, once
        result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert "Traceback" not in server.log(), server.log()[-4000:]
