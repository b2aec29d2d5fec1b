"""Reference data: vocabulary, embeddings, positional encoding, causal mask."""

from __future__ import annotations

from marshmallow import fields, validate

from schemas.base import Schema
from schemas.fields import QueryInteger, strict_bool, strict_int, tokens
from schemas.options import OutputOptions
from schemas.tensor import BoolTensor, Tensor


class PositionalEncodingQuery(Schema):
    """Query string of GET /v1/positional-encoding."""

    n_positions = QueryInteger(required=True, validate=validate.Range(min=1))
    d_model = QueryInteger(required=True, validate=validate.Range(min=1))
    decimals = QueryInteger(load_default=None, validate=validate.Range(0, 15))


class PositionalEncodingResponse(Schema):
    """The sinusoidal encoding ``(n_positions, d_model)``: sin on even dims, cos on odd dims."""

    encoding = Tensor(required=True)


class CausalMaskQuery(Schema):
    """Query string of GET /v1/causal-mask."""

    size = QueryInteger(required=True, validate=validate.Range(min=1))


class CausalMaskResponse(Schema):
    """Lower-triangular ``(size, size)`` booleans: row i may attend to columns <= i."""

    mask = BoolTensor(required=True)


class VocabularyResponse(Schema):
    """The toy vocabulary: 4 hand-assigned meaning dimensions and one vector per word."""

    dimensions = fields.List(fields.String(), required=True)
    tokens = fields.Dict(keys=fields.String(), values=fields.List(fields.Float()), required=True)


class EmbedRequest(OutputOptions):
    """Tokens to embed, optionally zero-padded to ``d_model`` and position-encoded."""

    tokens = tokens(required=True)
    d_model = strict_int(4, metadata={"description": "Zero-pad the 4-dim embeddings to this width."})
    positional_encoding = strict_bool(load_default=False)


class EmbedResponse(Schema):
    """One row per token ``(n, d_model)``."""

    embeddings = Tensor(required=True)
