"""Options shared by the compute endpoints."""

from __future__ import annotations

from marshmallow import fields, validate

from schemas.base import Schema
from schemas.fields import strict_bool, strict_int


class OutputOptions(Schema):
    """Precision of the compute and rounding of the answer."""

    dtype = fields.String(load_default="float64", validate=validate.OneOf(["float64", "float32"]),
                          metadata={"description": "Inputs are cast to this dtype before compute, so the "
                                                   "engine runs in that precision."})
    decimals = strict_int(0, 15, load_default=None,
                              metadata={"description": "Round every number of the answer to this many "
                                                       "decimals (at serialisation only)."})


class ComputeOptions(OutputOptions):
    """Output options plus what to return."""

    return_weights = strict_bool(load_default=True, metadata={
        "description": "Return the attention weights (false: `weights` is null)."})
    trace = strict_bool(load_default=False, metadata={
        "description": "Add the step-by-step intermediates (`trace`)."})


class MaskOptions(Schema):
    """Masking shared by the attention endpoints."""

    causal = strict_bool(load_default=False, metadata={
        "description": "Apply a causal (lower-triangular) mask: position i sees positions <= i."})
