"""POST /v1/models/{model}/explain: a trained model's text read beyond its raw weights (schemas.analyses), and
what its heads and tokens matter (head knockout, token occlusion).

Only the request's form is checked here (members that select nothing of what was asked); what a method costs, and
heads outside the model, are judged by the operation, against the limits, before it computes.
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate, validates, validates_schema

from schemas.analyses import (
    INTERVENTIONS,
    METHODS,
    METHODS_TEXT,
    methods_field,
    norms_field,
    repeated_method,
    rollout_field,
)
from schemas.base import Schema
from schemas.fields import BoundedList, StrictInteger, strict_bool
from schemas.pretrained import MAX_INDICES, ModelTextRequest
from schemas.tensor import BoolTensor, Tensor

EXPLAIN_METHODS = METHODS + INTERVENTIONS
INTERVENTIONS_TEXT = (
    " knockout: the model run again once per head of `knock` (default every head) with that head's output (its "
    "context vectors, before W_O) set to zero, and how far the answer moved; occlusion: the model run again once "
    "per token without it (an encoder reads [MASK] in its place, special tokens left alone; a decoder reads the "
    "prompt with the token removed, every one but the last, of a chat only the user's text).")
MAX_KNOCK = MAX_INDICES * 16  # pairs listed in one request, judged before they are loaded; max_knockouts decides


class ExplainRequest(ModelTextRequest):
    """A text (or a pair, or a chat) through a trained model, and which readings beyond its raw weights to
    compute."""

    methods = methods_field(f"What to compute, each at most once: {METHODS_TEXT}{INTERVENTIONS_TEXT}",
                            EXPLAIN_METHODS, required=True)
    return_weights = strict_bool(load_default=False, metadata={
        "description": "Add the raw weights beside the norms (`norms[i].weights`), to compare them."})
    knock = BoundedList(
        BoundedList(StrictInteger(validate=validate.Range(min=0)), validate=validate.Length(2, 2)),
        validate=validate.Length(1, MAX_KNOCK), metadata={
            "description": "With methods knockout: the heads to knock out, one at a time, as [layer, head] pairs "
                           "counted from 0 (default every head, layer by layer); at most max_knockouts "
                           "(GET /v1/limits). A repeated pair is a 422."})

    @validates("methods")
    def _distinct_methods(self, value: list[str], data_key: str, **kwargs: Any) -> None:
        repeated_method(value)

    @validates("knock")
    def _distinct_pairs(self, value: list[list[int]], data_key: str, **kwargs: Any) -> None:
        seen = set()
        for i, pair in enumerate(value):
            if tuple(pair) in seen:
                raise ValidationError({i: [f"{pair} is repeated."]})
            seen.add(tuple(pair))

    @validates_schema
    def _selects_something(self, data: dict[str, Any], **kwargs: Any) -> None:
        methods = data.get("methods", EXPLAIN_METHODS)  # without it, its own error alone
        if "heads" in data and "norms" not in methods:
            raise ValidationError("heads selects the heads of norms, which methods does not ask for (knockout's "
                                  "are knock).", "heads")
        if data.get("return_weights") and "norms" not in methods:
            raise ValidationError("return_weights adds the raw weights beside the norms, which methods does not "
                                  "ask for.", "return_weights")
        if "layers" in data and not {"rollout", "norms"} & set(methods):
            raise ValidationError("layers selects the layers of rollout and norms; flow is always of the last "
                                  "layer, knockout's heads are knock.", "layers")
        if "knock" in data and "knockout" not in methods:
            raise ValidationError("knock selects the heads of knockout, which methods does not ask for.", "knock")


class ExplainItem(ExplainRequest):
    """A /v1/batch item of op model-explain: the endpoint's body plus the model's name."""

    model = fields.String(required=True, metadata={"description": "A served model's name (GET /v1/models)."})


class NextToken(Schema):
    """A decoder's most likely next token after the whole prompt (the full run's)."""

    id = fields.Integer(required=True)
    token = fields.String(required=True)


def _shift_fields(table: bool, what: str) -> dict[str, fields.Field]:
    """The measures of how far each run moved the answer: a knockout's (L, H) ``table`` (null where a head was not
    knocked out), or an occlusion's (P,) values; ``what`` a run was without."""
    shape, rank = ("(L, H)", 2) if table else ("(P,)", 1)
    empty = ", null where that head was not knocked out" if table else ""
    return {
        "cosine_distance": Tensor(ranks=(rank,), null_leaves=table, metadata={
            "description": f"An encoder's: {shape}{empty}: 1 - cos between the mean-pooled sentence embeddings (the "
                           f"last hidden state's mean over every position, [CLS] and [SEP] included) of the full "
                           f"run and of the run without {what}."}),
        "largest_change": Tensor(ranks=(rank,), null_leaves=table, metadata={
            "description": f"An encoder's: {shape}{empty}: the largest L2 norm, over positions, of the change of a "
                           f"position's last hidden state without {what}."}),
        "kl": Tensor(ranks=(rank,), null_leaves=table, metadata={
            "description": f"A decoder's: {shape}{empty}: KL(p_full || p_run) in nats between the next-token "
                           f"distributions at the last position, with and without {what}."}),
        "top_changed": BoolTensor(ranks=(rank,), null_leaves=table, metadata={
            "description": f"A decoder's: {shape}{empty}: whether the most likely next token changed without "
                           f"{what}."}),
        "next_token": fields.Nested(NextToken, metadata={
            "description": "A decoder's: the full run's most likely next token."}),
    }


Knockout = Schema.from_dict({
    "heads": fields.List(fields.List(fields.Integer()), required=True, metadata={
        "description": "The heads knocked out, [layer, head], in the order asked."}),
    **_shift_fields(True, "that head")}, name="Knockout")
Occlusion = Schema.from_dict({
    "positions": fields.List(fields.Integer(), required=True, metadata={
        "description": "The positions occluded, one run each, in increasing order (indices into tokens)."}),
    **_shift_fields(False, "that token")}, name="Occlusion")


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
    knockout = fields.Nested(Knockout, metadata={
        "description": "With methods knockout: what each knocked-out head moved, as layers x heads tables."})
    occlusion = fields.Nested(Occlusion, metadata={
        "description": "With methods occlusion: what each occluded token moved, one number per position."})
