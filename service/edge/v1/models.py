"""GET /v1/models, GET /v1/models/{model}, and the registry's "models" operations (a trained model's attention).

Every /v1/models/{model}... route resolves the name to the served model once, before its body is read: an unknown
name is a 404 naming the served ones.
"""

from __future__ import annotations

from typing import Any

from flask import request

from schemas.pretrained import ModelCard, ModelList
from service.edge.examples import Computed
from service.edge.smorest import Blueprint
from service.edge.v1 import operation_routes
from service.operations import catalogue

blp = Blueprint("models", __name__, url_prefix="/v1",
                description="Trained models: any sentence through their real attention heads.")


@blp.before_request
def _resolve_model() -> None:
    arguments = request.view_args or {}
    if "model" in arguments:
        arguments["model"] = catalogue.lookup(arguments["model"])  # 404 for an unknown name, whatever the body


# The served models when the spec is written (the default models, for openapi.yaml).
CARDS = Computed(lambda: {"models": [model.card() for model in catalogue.served().values()]})
CARD = Computed(lambda: next((model.card() for model in catalogue.served().values()), None))


@blp.route("/models", methods=["GET"])
@blp.response(200, ModelList, example=CARDS)
def models() -> dict[str, Any]:
    """The served models.

    Each with its shape, its licence (from its model card) and its source: the package it came in, or the
    name of its folder. ATTENTION_MODELS says which are served.
    """
    return {"models": [model.card() for model in catalogue.served().values()]}


@blp.route("/models/<model>", methods=["GET"])
@blp.response(200, ModelCard, example=CARD)
@blp.documents(404)
def model(model: catalogue.ServedModel) -> dict[str, Any]:
    """One served model.

    An unknown name is a 404 problem listing the served ones.
    """
    return model.card()


operation_routes(blp, "models")  # POST /v1/models/{model}/attention

