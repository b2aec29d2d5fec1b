"""GET /healthz (the process answers) and GET /readyz (the engine computes)."""

from __future__ import annotations

from schemas.service import Health
from service.edge.smorest import Blueprint
from service.operations.reference import engine_ready
from service.problems import Problem

blp = Blueprint("health", __name__, description="Liveness and readiness.")


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
