"""POST /v1/self-attention, /v1/multi-head-attention and /v1/encoder: attention on a sentence.

The input is either ``embeddings`` (n, d_model) / (B, n, d_model) or ``tokens`` from the toy
vocabulary (4 dims, zero-padded to ``d_model`` when given, so then ``d_model >= 4``).
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validates, validates_schema

from schemas.analyses import methods_field, norms_field, repeated_method, rollout_field
from schemas.attention import BATCHABLE, ProjectedTraceSchema
from schemas.base import Schema
from schemas.fields import seed, strict_bool, strict_int, tokens
from schemas.options import ComputeOptions, MaskOptions, OutputOptions
from schemas.tensor import BoolTensor, Tensor

# How the layers read a mask (attention.layers._layer_mask): one axis more than the embeddings is one mask per head.
# The short form goes into error messages, the rule into the spec.
HEAD_MASK = {"shape": "broadcastable to (B, n, n), or per head (B, h, n, n)", "metadata": {"description": (
    "Shape broadcastable to (n, n) or (B, n, n), shared by every head; or one mask per head, with one axis more "
    "than the embeddings: (h, n, n) for (n, d_model) embeddings, (B, h, n, n) for (B, n, d_model).")}}


class SentenceInput(Schema):
    """``embeddings`` or ``tokens`` (exactly one), optional ``d_model`` and positional encoding."""

    embeddings = Tensor(ranks=BATCHABLE, shape="(n, d_model) or (B, n, d_model)")
    tokens = tokens(metadata={"description": "Words of GET /v1/vocabulary; used instead of embeddings."})
    d_model = strict_int(1, metadata={
        "description": "Model width. With tokens: at least 4, the 4-dim toy embeddings are zero-padded "
                       "to it (default 4). With embeddings: must equal their last dimension."})
    positional_encoding = strict_bool(load_default=False, metadata={
        "description": "Add the sinusoidal positional encoding to the input first."})

    @validates_schema
    def _one_input(self, data: dict[str, Any], **kwargs: Any) -> None:
        if ("embeddings" in data) == ("tokens" in data):
            raise ValidationError("Give exactly one of `embeddings` and `tokens`.", "embeddings")
        if "tokens" in data and data.get("d_model", 4) < 4:
            raise ValidationError("With tokens, d_model must be at least 4 (the toy embeddings' width).",
                                  "d_model")


class SentenceRequest(SentenceInput, ComputeOptions, MaskOptions):
    """Sentence input with masking and the common compute options."""

    seed = seed()


class ProjectionWeights(Schema):
    """Explicit projections for self-attention, each ``(d_model, d_k)``."""

    w_q = Tensor(required=True, shape="(d_model, d_k)")
    w_k = Tensor(required=True, shape="(d_model, d_k)")
    w_v = Tensor(required=True, shape="(d_model, d_k)")


class HeadWeights(Schema):
    """Explicit per-head projections ``(h, d_model, d_k)`` and the output mix ``(d_model, d_model)``."""

    w_q = Tensor(required=True, ranks=(3,), shape="(h, d_model, d_k)")
    w_k = Tensor(required=True, ranks=(3,), shape="(h, d_model, d_k)")
    w_v = Tensor(required=True, ranks=(3,), shape="(h, d_model, d_k)")
    w_o = Tensor(required=True, shape="(d_model, d_model)")


class SelfAttentionRequest(SentenceRequest):
    """Single-head self-attention: Q, K, V are projections of the same input."""

    d_k = strict_int(1, metadata={"description": "Width of Q, K, V (default d_model)."})
    weights = fields.Nested(ProjectionWeights, metadata={
        "description": "Explicit W_q, W_k, W_v instead of the seeded random ones."})
    mask = BoolTensor(load_default=None, ranks=(1, 2, 3), shape="broadcastable to (B, n, n)")


class MultiHeadRequest(SentenceRequest):
    """Multi-head attention: h heads of width d_model / h, concatenated and mixed by W_o."""

    n_heads = strict_int(1, required=True)
    weights = fields.Nested(HeadWeights, metadata={
        "description": "Explicit W_q, W_k, W_v per head and W_o instead of the seeded ones."})
    mask = BoolTensor(load_default=None, ranks=(1, 2, 3, 4), **HEAD_MASK)


class EncoderRequest(SentenceInput, OutputOptions, MaskOptions):
    """A stack of encoder blocks (multi-head attention, add & norm, feed-forward, add & norm)."""

    seed = seed()
    n_heads = strict_int(1, required=True)
    n_layers = strict_int(1, load_default=6)
    d_ff = strict_int(1, metadata={"description": "Feed-forward width (default 4 * d_model)."})
    return_weights = strict_bool(load_default=True)
    trace = strict_bool(load_default=False, metadata={
        "description": "Add every layer's intermediates (`layers[i].trace`)."})
    mask = BoolTensor(load_default=None, ranks=(1, 2, 3, 4), **HEAD_MASK)  # per head, as MHA
    methods = methods_field("Add readings beyond the raw weights, as POST /v1/models/{model}/explain names them "
                            "(`rollout`, `norms`: every layer, every head): rollout, how much of each input token is "
                            "in each position after a layer; norms, what each head and layer moves from a key into a "
                            "query. flow is the trained models' only.")

    @validates("methods")
    def _offered(self, value: list[str], data_key: str, **kwargs: Any) -> None:
        repeated_method(value)
        if "flow" in value:
            raise ValidationError({value.index("flow"): [
                "flow does not apply to the toy encoder: its random weights route nothing worth a maximum flow per "
                "pair; POST /v1/models/{model}/explain computes it for a trained model."]})

    @validates_schema
    def _methods_without_trace(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("methods") and data.get("trace"):
            raise ValidationError("methods do not apply with trace=true: ask for the trace or the methods.", "methods")


class LayerTraceSchema(ProjectedTraceSchema):
    """A layer's trace: its stages per head, and the weights that made them, in the request's precision."""

    w_q = Tensor(ranks=(2, 3), metadata={"description": "W_q: (d_model, d_k), per head (h, d_model, d_k)."})
    w_k = Tensor(ranks=(2, 3), metadata={"description": "W_k, as W_q."})
    w_v = Tensor(ranks=(2, 3), metadata={"description": "W_v, as W_q."})
    w_o = Tensor(ranks=(2,), metadata={
        "description": "Multi-head only: W_o (d_model, d_model); output = concat(weights @ V per head) W_o."})


class ModelResponse(Schema):
    """Output ``(..., n, d_model)``; weights ``(..., n, n)``, per head ``(..., h, n, n)``."""

    output = Tensor(required=True, ranks=BATCHABLE)
    weights = Tensor(required=True, allow_none=True, ranks=(2, 3, 4), metadata={
        "description": "Attention weights; null with return_weights=false."})
    trace = fields.Nested(LayerTraceSchema, metadata={"description": "Only with trace=true."})


class EncoderAttentionTrace(ProjectedTraceSchema):
    """The attention stage of one encoder layer, per head, and its output after W_o."""

    output = Tensor(ranks=BATCHABLE, metadata={"description": "Heads concatenated and mixed by W_o."})


class EncoderLayerTrace(Schema):
    """Every stage of one encoder block, each ``(..., n, d_model)`` except the per-head attention."""

    attention = fields.Nested(EncoderAttentionTrace, required=True)
    add_norm_1 = Tensor(required=True, ranks=BATCHABLE, metadata={
        "description": "layer_norm(X + attention) (a trained model's with its learned scale and shift)."})
    feed_forward = Tensor(required=True, ranks=BATCHABLE, metadata={
        "description": "ReLU(x W_1) W_2 in /v1/encoder; GELU(x W_1 + b_1) W_2 + b_2 in a trained model."})
    output = Tensor(required=True, ranks=BATCHABLE, metadata={
        "description": "layer_norm(add_norm_1 + feed_forward): the next layer's input."})


class LayerWeights(Schema):
    """One encoder layer's attention weights ``(..., h, n, n)``, and its trace with trace=true."""

    weights = Tensor(required=True, allow_none=True, ranks=(3, 4))
    trace = fields.Nested(EncoderLayerTrace, metadata={"description": "Only with trace=true."})


class EncoderResponse(Schema):
    """Output ``(..., n, d_model)`` and one entry per layer; with methods, their members."""

    output = Tensor(required=True, ranks=BATCHABLE)
    layers = fields.List(fields.Nested(LayerWeights), required=True)
    rollout = rollout_field()
    norms = norms_field()
