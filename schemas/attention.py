"""POST /v1/attention: scaled dot-product attention on explicit Q, K, V."""

from __future__ import annotations

from marshmallow import fields

from schemas.base import Schema
from schemas.fields import StrictFloat
from schemas.options import ComputeOptions, MaskOptions
from schemas.tensor import BoolTensor, Tensor

BATCHABLE = (2, 3)


class AttentionRequest(ComputeOptions, MaskOptions):
    """Q ``(n_q, d_k)``, K ``(n_k, d_k)``, V ``(n_k, d_v)``, or all three with a leading batch dim B."""

    query = Tensor(required=True, ranks=BATCHABLE, shape="(n_q, d_k) or (B, n_q, d_k)")
    key = Tensor(required=True, ranks=BATCHABLE, shape="(n_k, d_k) or (B, n_k, d_k)")
    value = Tensor(required=True, ranks=BATCHABLE, shape="(n_k, d_v) or (B, n_k, d_v)")
    mask = BoolTensor(load_default=None, ranks=(1, 2, 3), shape="broadcastable to (B, n_q, n_k)", metadata={
        "description": "Booleans broadcastable to (n_q, n_k) or (B, n_q, n_k); true = may attend."})
    scale = StrictFloat(load_default=None, metadata={
        "description": "Factor applied to QK^T before the softmax (default 1/sqrt(d_k))."})


class TraceSchema(Schema):
    """The step-by-step intermediates; shapes as ``weights`` (per head for multi-head)."""

    scores = Tensor(ranks=(2, 3, 4), metadata={"description": "Raw scores QK^T."})
    scaled_scores = Tensor(ranks=(2, 3, 4), metadata={"description": "Scores times the scale."})
    masked_scores = Tensor(ranks=(2, 3, 4), null_leaves=True, metadata={
        "description": "Scaled scores with masked cells null (they become -inf before the softmax)."})
    weights = Tensor(ranks=(2, 3, 4), metadata={
        "description": "softmax(masked_scores): each row sums to 1, or is all 0 when its every key is masked."})


class ProjectedTraceSchema(TraceSchema):
    """Trace of self-attention and multi-head attention: adds the projections Q, K, V."""

    q = Tensor(ranks=(2, 3, 4), metadata={"description": "Q = X W_q."})
    k = Tensor(ranks=(2, 3, 4), metadata={"description": "K = X W_k."})
    v = Tensor(ranks=(2, 3, 4), metadata={"description": "V = X W_v."})


class AttentionResponse(Schema):
    """Output ``(..., n_q, d_v)`` and weights ``(..., n_q, n_k)`` (null if not asked for)."""

    output = Tensor(required=True, ranks=BATCHABLE, metadata={"description": "weights @ V."})
    weights = Tensor(required=True, allow_none=True, ranks=BATCHABLE, metadata={
        "description": "Attention weights: each row sums to 1, or is all 0 when its every key is masked; null with "
                       "return_weights=false."})
    trace = fields.Nested(TraceSchema, metadata={"description": "Only with trace=true."})
