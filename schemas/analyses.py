"""Beyond raw weights: the ``methods`` and the members that answer them, shared by POST /v1/models/{model}/explain
(schemas.explain) and /v1/encoder (schemas.models).

Only the request's form is checked here (known methods, each once); what a method costs is judged by the
operation, against the limits, before it computes.
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate

from schemas.base import Schema
from schemas.fields import BoundedList
from schemas.tensor import Tensor

METHODS = ("rollout", "flow", "norms")  # the computations of attention/analyses.py, as the answer names them
INTERVENTIONS = ("knockout", "occlusion")  # attention/interventions.py's: explain's alone (a trained model's)
METHODS_TEXT = (
    "rollout: how much of each input token is in each position after a layer (every head and earlier layer, "
    "half the weights mixed with the residual); flow: the maximum flow from each input token to each position of "
    "the last layer through that layered graph; norms: ||alpha f(x)||, what each head (and the whole layer) moves "
    "from a key into a query, not only where it looks.")


def methods_field(description: str, choices: tuple[str, ...] = METHODS, **kwargs: Any) -> BoundedList:
    """1 to len(choices) names of ``choices``; an unknown one is a 422 at its index (a repeated one:
    :func:`repeated_method`)."""
    return BoundedList(fields.String(validate=validate.OneOf(choices)), validate=validate.Length(1, len(choices)),
                       metadata={"description": description}, **kwargs)


def repeated_method(value: list[str]) -> None:
    """A method named twice: a ValidationError at its second index."""
    for i, name in enumerate(value):
        if name in value[:i]:
            raise ValidationError({i: [f"{name} is repeated."]})


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
