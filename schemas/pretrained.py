"""The trained models: GET /v1/models, and POST /v1/models/{model}/attention on any sentence."""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, post_load, validate, validates

from schemas.base import Schema
from schemas.fields import BoundedList, StrictInteger, strict_bool
from schemas.models import EncoderLayerTrace
from schemas.options import OutputOptions
from schemas.tensor import Tensor

MAX_INDICES = 1024  # layers or heads listed in one request: far more than any served model has


def _indices(what: str) -> BoundedList:
    """Distinct layer or head numbers, counted from 0 as in transformers' ``attentions``; range checked
    against the model when the request is computed."""
    return BoundedList(StrictInteger(validate=validate.Range(min=0)), validate=validate.Length(1, MAX_INDICES),
                       metadata={"description": f"Which {what} to return, counted from 0 (default: all); "
                                                "answered in increasing order. A repeated one is a 422."})


class ModelAttentionRequest(OutputOptions):
    """A sentence (or a pair) through a trained model; which layers and heads to return, and how much."""

    text = fields.String(required=True, metadata={
        "description": "Any text; the model's own tokenizer splits it into word pieces, between [CLS] and [SEP]. "
                       "At most max_text_chars code points (GET /v1/limits)."})
    text_pair = fields.String(metadata={
        "description": "A second sentence: [CLS] text [SEP] text_pair [SEP], its tokens of type 1."})
    layers = _indices("layers")
    heads = _indices("heads")
    dtype = fields.String(load_default="float32", validate=validate.OneOf(["float32", "float64"]), metadata={
        "description": "float32: the model's own precision; float64 computes from the same weights in float64."})
    return_hidden_states = strict_bool(load_default=False, metadata={
        "description": "Add `hidden_states`: the embeddings and every layer's output, n_layers + 1 arrays."})
    trace = strict_bool(load_default=False, metadata={
        "description": "Add every selected layer's intermediates (`layers[i].trace`), per selected head."})

    @validates("text", "text_pair")
    def _has_text(self, value: str, data_key: str, **kwargs: Any) -> None:
        if not value.strip():
            raise ValidationError("Must hold something other than whitespace.")

    @validates("layers", "heads")
    def _distinct(self, value: list[int], data_key: str, **kwargs: Any) -> None:
        seen = set()
        for i, index in enumerate(value):
            if index in seen:
                raise ValidationError({i: [f"{index} is repeated."]})
            seen.add(index)

    @post_load
    def _sorted(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        for name in ("layers", "heads"):
            if name in data:
                data[name] = sorted(data[name])
        return data


class ModelAttentionItem(ModelAttentionRequest):
    """A /v1/batch item of op model-attention: the endpoint's body plus the model's name."""

    model = fields.String(required=True, metadata={"description": "A served model's name (GET /v1/models)."})


class ModelLayer(Schema):
    """One layer's attention weights ``(h, n, n)`` of the selected heads, and its trace with trace=true."""

    layer = fields.Integer(required=True)
    heads = fields.List(fields.Integer(), required=True)
    weights = Tensor(required=True, ranks=(3,))
    trace = fields.Nested(EncoderLayerTrace, metadata={"description": "Only with trace=true."})


class ModelAttentionResponse(Schema):
    """Word pieces, their ids, the last hidden state ``(n, d_model)`` and the selected layers."""

    tokens = fields.List(fields.String(), required=True)
    token_ids = fields.List(fields.Integer(), required=True)
    output = Tensor(required=True, ranks=(2,), metadata={"description": "The last hidden state (n, d_model)."})
    layers = fields.List(fields.Nested(ModelLayer), required=True)
    hidden_states = fields.List(Tensor(ranks=(2,)), metadata={
        "description": "Only with return_hidden_states: n_layers + 1 arrays (n, d_model)."})


class ModelCard(Schema):
    """A served model: its shape, its licence (from its model card) and where it comes from."""

    name = fields.String(required=True)
    architecture = fields.String(required=True)
    n_layers = fields.Integer(required=True)
    n_heads = fields.Integer(required=True)
    d_model = fields.Integer(required=True)
    d_ff = fields.Integer(required=True)
    vocab_size = fields.Integer(required=True)
    max_positions = fields.Integer(required=True)
    license = fields.String(required=True, allow_none=True)
    source = fields.String(required=True, metadata={"description": "package==version, or the folder's name."})


class ModelList(Schema):
    """Every served model."""

    models = fields.List(fields.Nested(ModelCard), required=True)
