"""The trained models: GET /v1/models, and POST /v1/models/{model}/attention on any sentence (an encoder's text or
pair, a decoder's text or chat messages)."""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, post_load, validate, validates, validates_schema

from schemas.base import Schema
from schemas.fields import BoundedList, StrictInteger, strict_bool
from schemas.models import EncoderAttentionTrace, EncoderLayerTrace
from schemas.options import OutputOptions
from schemas.tensor import Tensor

MAX_INDICES = 1024  # layers or heads listed in one request: far more than any served model has
MAX_MESSAGES = 256  # messages of one chat: their text is judged by max_text_chars too
ROLES = ("system", "user", "assistant")


def indices(what: str) -> BoundedList:
    """Distinct layer or head numbers, counted from 0 as in transformers' ``attentions``; range checked
    against the model when the request is computed."""
    return BoundedList(StrictInteger(validate=validate.Range(min=0)), validate=validate.Length(1, MAX_INDICES),
                       metadata={"description": f"Which {what} to return, counted from 0 (default: all); "
                                                "answered in increasing order. A repeated one is a 422."})


def _has_text(value: str) -> None:
    if not value.strip():
        raise ValidationError("Must hold something other than whitespace.")


class Message(Schema):
    """One message of a chat, as the decoder's chat template reads it."""

    role = fields.String(required=True, validate=validate.OneOf(ROLES))
    content = fields.String(required=True, validate=_has_text)


def messages_field(description: str) -> BoundedList:
    """A chat: 1 to MAX_MESSAGES messages."""
    return BoundedList(fields.Nested(Message), validate=validate.Length(1, MAX_MESSAGES),
                       metadata={"description": description})


class ModelSelection(OutputOptions):
    """Which of a trained model's layers and heads an answer shows, its precision and its rounding."""

    layers = indices("layers")
    heads = indices("heads")
    dtype = fields.String(load_default="float32", validate=validate.OneOf(["float32", "float64"]), metadata={
        "description": "float32: the model's own precision; float64 computes from the same weights in float64."})

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


class ModelTextRequest(ModelSelection):
    """A sentence (or a pair, or a chat) for a trained model, with the layers, heads and precision asked for: what
    every operation on a trained model's text reads."""

    text = fields.String(metadata={
        "description": "Any text; the model's own tokenizer splits it into tokens (an encoder's word pieces between "
                       "[CLS] and [SEP]). At most max_text_chars code points (GET /v1/limits). Give it or, to a "
                       "decoder, `messages`."})
    text_pair = fields.String(metadata={
        "description": "An encoder's second sentence: [CLS] text [SEP] text_pair [SEP], its tokens of type 1."})
    messages = messages_field("A decoder's chat, rendered by the model's own chat template with the assistant's turn "
                              "opened; the messages' text is at most max_text_chars code points in all.")

    @validates("text", "text_pair")
    def _text(self, value: str, data_key: str, **kwargs: Any) -> None:
        _has_text(value)

    @validates_schema
    def _one_input(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "messages" in data and "text" in data:
            raise ValidationError("Give text or messages, not both.", "messages")
        if "messages" in data and "text_pair" in data:
            raise ValidationError("A chat (messages) has no pair: text_pair goes with text.", "text_pair")
        if "messages" not in data and "text" not in data:
            raise ValidationError("Give the text to read (or, to a decoder, the chat's messages).", "text")


class ModelAttentionRequest(ModelTextRequest):
    """A sentence (or a pair, or a chat) through a trained model; which layers and heads to return, and how much."""

    return_hidden_states = strict_bool(load_default=False, metadata={
        "description": "Add `hidden_states`: the embeddings and every layer's output, n_layers + 1 arrays."})
    trace = strict_bool(load_default=False, metadata={
        "description": "Add every selected layer's intermediates (`layers[i].trace`), per selected head."})


class ModelAttentionItem(ModelAttentionRequest):
    """A /v1/batch item of op model-attention: the endpoint's body plus the model's name."""

    model = fields.String(required=True, metadata={"description": "A served model's name (GET /v1/models)."})


class ModelAttentionTrace(EncoderAttentionTrace):
    """The attention stage of one layer of a trained model, per selected head."""

    q = Tensor(ranks=(2, 3, 4), metadata={"description": "Q = X W_q (+ b_q): a decoder's after the rotary turn."})
    k = Tensor(ranks=(2, 3, 4), metadata={"description": "K, as Q; a decoder's of the key/value head the query head "
                                                        "reads (grouped-query attention)."})
    v = Tensor(ranks=(2, 3, 4), metadata={"description": "V, as K (not turned)."})


class ModelLayerTrace(EncoderLayerTrace):
    """Every stage of one layer: an encoder's (post-norm) add & norm, or a decoder's (pre-norm) residual."""

    attention = fields.Nested(ModelAttentionTrace, required=True)
    add_norm_1 = Tensor(ranks=(2, 3, 4), metadata={
        "description": "An encoder's layer_norm(X + attention), with its learned scale and shift."})
    residual = Tensor(ranks=(2, 3, 4), metadata={"description": "A decoder's X + attention (of RMSNorm(X))."})
    feed_forward = Tensor(required=True, ranks=(2, 3, 4), metadata={
        "description": "An encoder's GELU(x W_1 + b_1) W_2 + b_2; a decoder's SwiGLU of RMSNorm(residual)."})
    output = Tensor(required=True, ranks=(2, 3, 4), metadata={
        "description": "The next layer's input: an encoder's layer_norm(add_norm_1 + feed_forward), a decoder's "
                       "residual + feed_forward."})


class ModelLayer(Schema):
    """One layer's attention weights ``(h, n, n)`` of the selected heads (a decoder's: zero above the diagonal),
    and its trace with trace=true."""

    layer = fields.Integer(required=True)
    heads = fields.List(fields.Integer(), required=True)
    weights = Tensor(required=True, ranks=(3,))
    trace = fields.Nested(ModelLayerTrace, metadata={"description": "Only with trace=true."})


class ModelAttentionResponse(Schema):
    """Tokens, their ids, the last hidden state ``(n, d_model)`` and the selected layers."""

    tokens = fields.List(fields.String(), required=True, metadata={
        "description": "An encoder's word pieces; a decoder's tokens as text (U+FFFD where a token ends inside a "
                       "UTF-8 character)."})
    token_ids = fields.List(fields.Integer(), required=True)
    output = Tensor(required=True, ranks=(2,), metadata={"description": "The last hidden state (n, d_model)."})
    layers = fields.List(fields.Nested(ModelLayer), required=True)
    hidden_states = fields.List(Tensor(ranks=(2,)), metadata={
        "description": "Only with return_hidden_states: n_layers + 1 arrays (n, d_model)."})


class ModelCard(Schema):
    """A served model: its shape, its licence (from its model card) and where it comes from."""

    name = fields.String(required=True)
    architecture = fields.String(required=True, metadata={
        "description": "The transformers class it computes as (BertModel, LlamaForCausalLM)."})
    causal = fields.Boolean(required=True, metadata={
        "description": "A decoder: each token attends only to itself and the tokens before it."})
    n_layers = fields.Integer(required=True)
    n_heads = fields.Integer(required=True)
    n_kv_heads = fields.Integer(metadata={
        "description": "A decoder's key/value heads, each read by n_heads / n_kv_heads query heads."})
    d_model = fields.Integer(required=True)
    d_ff = fields.Integer(required=True)
    vocab_size = fields.Integer(required=True)
    max_positions = fields.Integer(required=True)
    quantization = fields.String(metadata={
        "description": "A decoder's weights as its file stores them (computed in float32 or float64)."})
    license = fields.String(required=True, allow_none=True)
    source = fields.String(required=True, metadata={"description": "package==version, or the folder's or file's name."})


class OpenAIModel(Schema):
    """A model as OpenAI's clients read it."""

    id = fields.String(required=True)
    object = fields.String(required=True, validate=validate.OneOf(["model"]))
    created = fields.Integer(required=True, metadata={"description": "0: not known."})
    owned_by = fields.String(required=True)


class ServedModelCard(OpenAIModel, ModelCard):
    """A served model: the service's card, then OpenAI's members (GET /v1/models/{model})."""


class ModelList(Schema):
    """Every served model: the service's cards, and OpenAI's list of the same models."""

    models = fields.List(fields.Nested(ModelCard), required=True)
    object = fields.String(required=True, validate=validate.OneOf(["list"]))
    data = fields.List(fields.Nested(OpenAIModel), required=True)
