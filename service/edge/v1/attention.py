"""POST /v1/attention, /v1/self-attention, /v1/multi-head-attention, /v1/encoder: the registry's "attention"
operations."""

from __future__ import annotations

from service.edge.smorest import Blueprint
from service.edge.v1 import operation_routes

blp = Blueprint("attention", __name__, url_prefix="/v1",
                description="The forward pass: attention, self-attention, multi-head attention, encoder.")
operation_routes(blp, "attention")
