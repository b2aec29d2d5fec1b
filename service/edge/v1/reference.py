"""The toy vocabulary, embeddings, positional encoding and the causal mask."""

from __future__ import annotations

from typing import Any

import attention as engine
from schemas.reference import (
    CausalMaskResponse,
    EmbedResponse,
    PositionalEncodingResponse,
    VocabularyResponse,
)
from service.edge.smorest import Blueprint
from service.edge.v1 import compute_route

blp = Blueprint("reference", __name__, url_prefix="/v1",
                description="The building blocks: vocabulary, embeddings, positional encoding, causal mask.")

VOCABULARY_EXAMPLE = {"dimensions": engine.DIMENSIONS,
                      "tokens": {word: vector.tolist() for word, vector in engine.EMBEDDINGS.items()}}


@blp.route("/vocabulary", methods=["GET"])
@blp.response(200, VocabularyResponse, example=VOCABULARY_EXAMPLE)
def vocabulary() -> dict[str, Any]:
    """The toy vocabulary.

    Five words in 4 hand-assigned meaning dimensions (animal, action, food, pronoun), so attention
    weights come out readable.
    """
    return VOCABULARY_EXAMPLE


compute_route(blp, "/embed", "embed", EmbedResponse, """Embed tokens.

One row per token from the toy vocabulary, zero-padded to d_model, plus the positional encoding
when asked. Unknown tokens are a 422 listing the known ones.""")

compute_route(blp, "/positional-encoding", "positional-encoding", PositionalEncodingResponse,
              """Sinusoidal positional encoding.

PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same angle), section 3.5.""",
              method="GET")

compute_route(blp, "/causal-mask", "causal-mask", CausalMaskResponse, """Causal mask.

Lower-triangular booleans: row i may attend to columns 0..i (true = may attend).""", method="GET")
