"""GET /v1/models, GET /v1/models/{model}, and the registry's "models" operations (a trained model's attention).

Every /v1/models/{model}... route resolves the name to the served model once, before its body is read: an unknown
name is a 404 naming the served ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import request

from schemas.pretrained import ModelList, ServedModelCard
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
CARDS = Computed(lambda: listing(catalogue.served().values()))
CARD = Computed(lambda: next((card(model) for model in catalogue.served().values()), None))


def listing(served: Iterable[catalogue.ServedModel]) -> dict[str, Any]:
    """The service's cards, and OpenAI's list beside them (``models.list()`` of its clients reads ``data``)."""
    served = list(served)
    return {"models": [model.card() for model in served], "object": "list",
            "data": [model.openai_card() for model in served]}


def card(model: catalogue.ServedModel) -> dict[str, Any]:
    """The service's card, and OpenAI's members after it (``models.retrieve(name)`` of its clients)."""
    return {**model.card(), **model.openai_card()}


@blp.route("/models", methods=["GET"])
@blp.response(200, ModelList, example=CARDS)
def models() -> dict[str, Any]:
    """The served models.

    Each with its shape, its licence (from its model card) and its source: the package it came in, or the
    name of its folder. ATTENTION_MODELS says which are served. `object` and `data` are OpenAI's list of
    the same models, as its clients read it.
    """
    return listing(catalogue.served().values())


@blp.route("/models/<model>", methods=["GET"])
@blp.response(200, ServedModelCard, example=CARD)
@blp.documents(404)
def model(model: catalogue.ServedModel) -> dict[str, Any]:
    """One served model.

    An unknown name is a 404 problem listing the served ones. OpenAI's members (`id`, `object`, `created`,
    `owned_by`) follow the service's.
    """
    return card(model)


operation_routes(blp, "models")  # POST /v1/models/{model}/attention

