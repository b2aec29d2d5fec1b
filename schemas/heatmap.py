"""POST /v1/heatmap and the ``format`` query parameter of the compute endpoints."""

from __future__ import annotations

from typing import Any

import numpy as np
from marshmallow import ValidationError, fields, validate, validates_schema

from schemas.base import Schema
from schemas.fields import StringList, strict_bool, strict_int
from schemas.tensor import Tensor, _nest

MAX_LABEL_CHARS = 200


def _labels(axis: str) -> StringList:
    return StringList(max_chars=MAX_LABEL_CHARS, metadata={
        "description": f"One label per {axis} (default: positions 0, 1, ...). Shown shortened past 14 "
                       "characters; the hover title keeps the full text."})


class HeatmapRequest(Schema):
    """Weights to draw, one panel per head, with optional labels and values written in the cells."""

    weights = Tensor(required=True, ranks=(2, 3), shape="(n_q, n_k) or (h, n_q, n_k)", metadata={
        "description": "Attention weights in [0, 1] (n_q, n_k), or one matrix per head (h, n_q, n_k). "
                       "Exact zeros (masked cells) are drawn hatched."})
    row_labels = _labels("query (row)")
    col_labels = _labels("key (column)")
    title = fields.String(validate=validate.Length(max=MAX_LABEL_CHARS), metadata={
        "description": "Title above the panels."})
    annotate = strict_bool(load_default=None, metadata={
        "description": "Write each value in its cell (default: when cells are large enough, up to 18 tokens)."})
    decimals = strict_int(0, 6, load_default=2, metadata={"description": "Decimals of the values written in cells."})

    @validates_schema
    def _consistent(self, data: dict[str, Any], **kwargs: Any) -> None:
        weights = data.get("weights")
        if weights is None:
            return
        outside = np.argwhere((weights < 0) | (weights > 1))
        if len(outside):
            index = outside[0].tolist()
            raise ValidationError({"weights": _nest(index, f"Weights must be in [0, 1], got {weights[tuple(index)]}.")})
        for key, axis, size in (("row_labels", "n_q", weights.shape[-2]), ("col_labels", "n_k", weights.shape[-1])):
            if key in data and len(data[key]) != size:
                raise ValidationError(f"Expected {size} labels ({axis}), got {len(data[key])}.", key)


class FormatQuery(Schema):
    """``?format=``, on the compute endpoints that draw: json or svg (the heatmap of the weights instead of JSON),
    as the Accept header would choose; absent (None): the Accept header alone chooses."""

    format = fields.String(load_default=None, validate=validate.OneOf(["json", "svg"]))
