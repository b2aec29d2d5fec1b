"""POST /v1/models/{model}/explain: a trained model's text read beyond its raw weights (schemas.analyses).

Only the request's form is checked here (members that select nothing of what was asked); what a method costs is
judged by the operation, against the limits, before it computes.
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validates, validates_schema

from schemas.analyses import METHODS, METHODS_TEXT, methods_field, norms_field, repeated_method, rollout_field
from schemas.base import Schema
from schemas.fields import strict_bool
from schemas.pretrained import ModelTextRequest
from schemas.tensor import Tensor


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
