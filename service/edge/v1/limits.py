"""GET /v1/limits: the limits every request is checked against."""

from __future__ import annotations

from service.edge.context import current_limits
from service.edge.smorest import Blueprint
from service.operations.limits import Limits, LimitsSchema

blp = Blueprint("limits", __name__, url_prefix="/v1", description="Service limits.")


@blp.route("/limits", methods=["GET"])
@blp.response(200, LimitsSchema, example=Limits().as_dict())
def limits() -> dict[str, int]:
    """The limits in force.

    Requests past a limit are refused before any compute: 413 for the body size, 422 naming the
    limit for shapes. Each is set by an environment variable (see the schema); the example shows
    the defaults.
    """
    return current_limits().as_dict()
