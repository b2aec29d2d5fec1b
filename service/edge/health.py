"""GET /healthz (the process answers) and GET /readyz (the engine computes)."""

from __future__ import annotations

import logging

import numpy as np

import attention as engine
from schemas.service import Health
from service.edge.smorest import Blueprint
from service.problems import Problem

blp = Blueprint("health", __name__, description="Liveness and readiness.")
log = logging.getLogger(__name__)


class NotReady(Problem):
    """503: the engine failed its self-test."""

    code = 503


@blp.route("/healthz", methods=["GET"])
@blp.response(200, Health, example={"status": "ok"})
def healthz() -> dict[str, str]:
    """Liveness.

    The process is up and answering.
    """
    return {"status": "ok"}


@blp.route("/readyz", methods=["GET"])
@blp.response(200, Health, example={"status": "ready"})
@blp.documents(503)
def readyz() -> dict[str, str]:
    """Readiness.

    Runs a tiny attention through the engine (two orthogonal keys, the query matching the first)
    and checks the answer; 503 if it fails.
    """
    if not engine_ready():
        raise NotReady("The engine failed its self-test.")
    return {"status": "ready"}


def engine_ready() -> bool:
    """The self-test: a tiny attention whose answer is known (also GET /v2/health/ready)."""
    try:
        keys = np.eye(2)
        _, weights = engine.scaled_dot_product_attention(keys[:1] * 10, keys, keys)
        return bool(np.isclose(weights.sum(), 1.0) and weights[0, 0] > weights[0, 1])
    except Exception:  # readiness reports any engine failure instead of raising it
        log.exception("readiness self-test failed")
        return False
