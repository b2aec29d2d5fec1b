"""Beyond raw weights: POST /v1/models/{model}/explain, and the ``methods`` /v1/encoder shares with it.

Only the request's form is checked here (known methods, each once; members that select nothing of what was asked);
what a method costs is judged by the operation, against the limits, before it computes.
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate, validates, validates_schema

from schemas.base import Schema
from schemas.fields import BoundedList, strict_bool
from schemas.pretrained import ModelTextRequest
from schemas.tensor import Tensor

METHODS = ("rollout", "flow", "norms")  # the computations of attention/analyses.py, as the answer names them
METHODS_TEXT = (
    "rollout: how much of each input token is in each position after a layer (every head and earlier layer, "
    "half the weights mixed with the residual); flow: the maximum flow from each input token to each position of "
    "the last layer through that layered graph; norms: ||alpha f(x)||, what each head (and the whole layer) moves "
    "from a key into a query, not only where it looks.")


def methods_field(description: str, **kwargs: Any) -> BoundedList:
    """1 to 3 names of METHODS; an unknown one is a 422 at its index (a repeated one: :func:`repeated_method`)."""
    return BoundedList(fields.String(validate=validate.OneOf(METHODS)), validate=validate.Length(1, len(METHODS)),
                       metadata={"description": description}, **kwargs)


def repeated_method(value: list[str]) -> None:
    """A method named twice: a ValidationError at its second index."""
    for i, name in enumerate(value):
        if name in value[:i]:
            raise ValidationError({i: [f"{name} is repeated."]})


class ExplainRequest(ModelTextRequest):
    """A text (or a pair, or a chat) through a trained model, and which readings beyond its raw weights to compute."""

    methods = methods_field(f"What to compute, each at most once: {METHODS_TEXT}", required=True)
    return_weights = strict_bool(load_default=False, metadata={
        "description": "Add the raw weights beside the norms (`norms[i].weights`), to compare them."})

    @validates("methods")
    def _distinct_methods(self, value: list[str], data_key: str, **kwargs: Any) -> None:
        repeated_method(value)

    @validates_schema
    def _selects_something(self, data: dict[str, Any], **kwargs: Any) -> None:
        methods = data.get("methods", METHODS)  # without it, its own error alone
        if "heads" in data and "norms" not in methods:
            raise ValidationError("heads selects the heads of norms, which methods does not ask for.", "heads")
        if data.get("return_weights") and "norms" not in methods:
            raise ValidationError("return_weights adds the raw weights beside the norms, which methods does not "
                                  "ask for.", "return_weights")
        if "layers" in data and not {"rollout", "norms"} & set(methods):
            raise ValidationError("layers selects the layers of rollout and norms; flow is always of the last "
                                  "layer.", "layers")


class ExplainItem(ExplainRequest):
    """A /v1/batch item of op model-explain: the endpoint's body plus the model's name."""

    model = fields.String(required=True, metadata={"description": "A served model's name (GET /v1/models)."})


class RolloutLayer(Schema):
    """The rollout after one layer: row i, how much of each input token is in position i (it sums to 1)."""

    layer = fields.Integer(required=True)
    values = Tensor(required=True, ranks=(2, 3), metadata={
        "description": "(n, n), or (B, n, n) for /v1/encoder's batch: A_hat_layer ... A_hat_0, A_hat = 0.5 mean over "
                       "heads of the weights + 0.5 I, rows renormalised. Lower triangular for a decoder."})


class NormsLayer(Schema):
    """One layer's norm-based attention (Kobayashi et al. 2020): what each selected head, and the whole layer,
    moves from key j into query i."""

    layer = fields.Integer(required=True)
    heads = fields.List(fields.Integer(), required=True)
    head_norms = Tensor(required=True, ranks=(3, 4), metadata={
        "description": "(h_sel, n, n) (/v1/encoder: (B?, h, n, n)): ||alpha^h_ij f_h(x_j)||, f_h(x) = (x W_V + "
                       "b_V)[head h] W_O[head h's rows], x the attention's input (a decoder's after RMSNorm)."})
    layer_norms = Tensor(required=True, ranks=(2, 3), metadata={
        "description": "(n, n) (/v1/encoder: (B?, n, n)): ||sum over every head h of alpha^h_ij f_h(x_j)||; heads "
                       "that pull apart cancel."})
    weights = Tensor(ranks=(3,), metadata={
        "description": "With return_weights: the selected heads' raw weights (h_sel, n, n), beside their norms."})


def rollout_field() -> fields.List:
    """The ``rollout`` member of an answer."""
    return fields.List(fields.Nested(RolloutLayer), metadata={
        "description": "With methods rollout: one entry per selected layer (default all), in increasing order."})


def norms_field() -> fields.List:
    """The ``norms`` member of an answer."""
    return fields.List(fields.Nested(NormsLayer), metadata={
        "description": "With methods norms: one entry per selected layer (default all), its selected heads."})


class ExplainResponse(Schema):
    """The tokens, and one member per method asked for."""

    tokens = fields.List(fields.String(), required=True)
    token_ids = fields.List(fields.Integer(), required=True)
    rollout = rollout_field()
    flow = Tensor(ranks=(2,), metadata={
        "description": "With methods flow: (n, n), [i, j] the maximum flow from input token j to position i after "
                       "the last layer, in [0, 1] (capacities in millionths); rows need not sum to 1. 0 where no "
                       "path leads (a decoder's j > i)."})
    norms = norms_field()
