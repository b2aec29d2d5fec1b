"""The baseline of benchmarks/http_load.py: a bare Flask endpoint doing only what any JSON endpoint must.

It parses the same JSON body with orjson and returns a fixed JSON body of the answer's shape
(output (5, 8), weights (4, 5, 5) of 17-digit floats), so the ratio isolates what the real service
adds: validation, the engine, serialisation, metrics, the log line.
"""

from __future__ import annotations

import numpy as np
import orjson
from flask import Flask, Response, request

_rng = np.random.default_rng(0)
ANSWER = orjson.dumps({"output": _rng.standard_normal((5, 8)), "weights": _rng.dirichlet(np.ones(5), (4, 5))},
                      option=orjson.OPT_SERIALIZE_NUMPY)

app = Flask(__name__)


@app.post("/v1/multi-head-attention")
def multi_head_attention() -> Response:
    body = orjson.loads(request.get_data())
    assert isinstance(body, dict)
    return Response(ANSWER, mimetype="application/json")


@app.get("/healthz")
def healthz() -> Response:
    """What tests/harness.py waits for."""
    return Response(b'{"status":"ok"}', mimetype="application/json")
