"""POST /v1/attention, /v1/self-attention, /v1/multi-head-attention, /v1/encoder."""

from __future__ import annotations

from schemas.attention import AttentionResponse
from schemas.models import EncoderResponse, ModelResponse
from service.edge.smorest import Blueprint
from service.edge.v1 import compute_route

blp = Blueprint("attention", __name__, url_prefix="/v1",
                description="The forward pass: attention, self-attention, multi-head attention, encoder.")

compute_route(blp, "/attention", "attention", AttentionResponse, """Scaled dot-product attention.

softmax(Q K^T * scale) V on explicit Q, K, V (scale defaults to 1/sqrt(d_k)). The example is the
seed's demo 1: the query "it" against the raw toy embeddings. A query row whose keys are all
masked gets zero weights and a zero output.""", svg=True)

compute_route(blp, "/self-attention", "self-attention", ModelResponse, """Single-head self-attention.

Q, K and V are projections of the same input (embeddings, or toy-vocabulary tokens) by W_q, W_k,
W_v drawn as the seed script does from `seed` (or given in `weights`).""", svg=True)

compute_route(blp, "/multi-head-attention", "multi-head-attention", ModelResponse, """Multi-head attention.

n_heads heads of width d_model / n_heads (head i seeded with seed + i, W_o with seed + 99),
concatenated and mixed by W_o. The example is the seed's demo 5: the same per-head weights.""", svg=True)

compute_route(blp, "/encoder", "encoder", EncoderResponse, """A stack of transformer encoder blocks.

Each block: multi-head attention, add & norm, position-wise feed-forward (ReLU), add & norm.
Returns the final output and each layer's attention weights.""", svg=True)
