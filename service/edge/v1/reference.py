"""GET /v1/vocabulary, and the registry's "reference" operations: embed, positional encoding, causal mask."""

from __future__ import annotations

from typing import Any

from schemas.reference import VocabularyResponse
from service.edge.smorest import Blueprint
from service.edge.v1 import operation_routes
from service.operations.reference import VOCABULARY

blp = Blueprint("reference", __name__, url_prefix="/v1",
                description="The building blocks: vocabulary, embeddings, positional encoding, causal mask.")


@blp.route("/vocabulary", methods=["GET"])
@blp.response(200, VocabularyResponse, example=VOCABULARY)
def vocabulary() -> dict[str, Any]:
    """The toy vocabulary.

    Five words in 4 hand-assigned meaning dimensions (animal, action, food, pronoun), so attention
    weights come out readable.
    """
    return VOCABULARY


operation_routes(blp, "reference")  # embed, positional-encoding, causal-mask
