"""GET /v1/models, GET /v1/models/{model}, and the registry's "models" operations (a trained model's attention).

Every /v1/models/{model}... route answers an unknown name with a 404 naming the served ones, before its body
is read.
"""

from __future__ import annotations

from typing import Any

from flask import request

from schemas.pretrained import ModelCard, ModelList
from service.edge.smorest import Blueprint
from service.edge.v1 import operation_routes
from service.operations import catalogue

blp = Blueprint("models", __name__, url_prefix="/v1",
                description="Trained models: any sentence through their real attention heads.")


@blp.before_request
def _known_model() -> None:
    name = (request.view_args or {}).get("model")
    if name is not None:
        catalogue.lookup(name)  # 404 for an unknown name, whatever the body


# The served models when the spec is built (the default model for openapi.yaml).
EXAMPLES = [model.card() for model in catalogue.served().values()]


@blp.route("/models", methods=["GET"])
@blp.response(200, ModelList, example={"models": EXAMPLES})
def models() -> dict[str, Any]:
    """The served models.

    Each with its shape, its licence (from its model card) and its source: the package it came in, or the
    name of its folder. ATTENTION_MODELS says which are served.
    """
    return {"models": [model.card() for model in catalogue.served().values()]}


@blp.route("/models/<model>", methods=["GET"])
@blp.response(200, ModelCard, example=EXAMPLES[0] if EXAMPLES else None)
@blp.documents(404)
def model(model: str) -> dict[str, Any]:
    """One served model.

    An unknown name is a 404 problem listing the served ones.
    """
    return catalogue.lookup(model).card()


operation_routes(blp, "models")  # POST /v1/models/{model}/attention

