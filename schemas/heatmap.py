"""POST /v1/heatmap and the ``format`` query parameter of the compute endpoints."""

from __future__ import annotations

from typing import Any

import numpy as np
from marshmallow import ValidationError, fields, validate, validates_schema

from schemas.base import Schema
from schemas.fields import StringList, strict_bool, strict_int
from schemas.tensor import BoolTensor, Tensor, _nest

MAX_LABEL_CHARS = 200
COLOR_SCALES = ("fixed", "row", "max")  # what service.operations.palette can scale the colours to
COLOR_SCALE = ("What the brightest colour stands for, named in the legend: fixed (default), a weight of 1; row, "
               "each row's largest weight (a long sentence's rows are then not uniformly dark); max, the "
               "picture's largest weight.")


def _labels(axis: str) -> StringList:
    return StringList(max_chars=MAX_LABEL_CHARS, metadata={
        "description": f"One label per {axis} (default: positions 0, 1, ...). Shown shortened past 14 "
                       "characters; the hover title keeps the full text."})


class HeatmapRequest(Schema):
    """Weights to draw, one panel per head, with optional labels and values written in the cells."""

    weights = Tensor(required=True, ranks=(2, 3), shape="(n_q, n_k) or (h, n_q, n_k)", metadata={
        "description": "Attention weights in [0, 1] (n_q, n_k), or one matrix per head (h, n_q, n_k)."})
    mask = BoolTensor(load_default=None, ranks=(1, 2, 3), shape="broadcastable to the weights", metadata={
        "description": "Which cells could attend (true) or were masked (false): masked cells are drawn hatched, "
                       "apart from weights that are merely 0, and must weigh 0. Broadcastable to the weights' "
                       "shape. Without it nothing is drawn as masked."})
    row_labels = _labels("query (row)")
    col_labels = _labels("key (column)")
    title = fields.String(validate=validate.Length(max=MAX_LABEL_CHARS), metadata={
        "description": "Title above the panels."})
    annotate = strict_bool(load_default=None, metadata={
        "description": "Write each value in its cell (default: when cells are large enough, up to 18 tokens)."})
    decimals = strict_int(0, 6, load_default=2, metadata={"description": "Decimals of the values written in cells."})
    color_scale = fields.String(load_default="fixed", validate=validate.OneOf(COLOR_SCALES),
                                metadata={"description": COLOR_SCALE})

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
        if data.get("mask") is not None:
            _masked_weigh_zero(weights, data["mask"])


def _masked_weigh_zero(weights: np.ndarray, mask: np.ndarray) -> None:
    """A mask that broadcasts to the weights, whose masked cells weigh 0; else the error names the first culprit."""
    try:
        allowed = np.broadcast_to(mask, weights.shape)
    except ValueError:
        raise ValidationError(f"Expected a mask broadcastable to the weights {weights.shape}, got {mask.shape}.",
                              "mask") from None
    weighing = np.argwhere(~allowed & (weights != 0))
    if len(weighing):
        index = weighing[0].tolist()
        detail = f"The mask hides this cell: it must weigh 0, got {weights[tuple(index)]}."
        raise ValidationError({"weights": _nest(index, detail)})


class PictureQuery(Schema):
    """How a heatmap answer is drawn: query parameters of the ``/heatmap`` operations (and of an SVG answer)."""

    color_scale = fields.String(load_default="fixed", validate=validate.OneOf(COLOR_SCALES), metadata={
        "description": COLOR_SCALE})


class FormatQuery(PictureQuery):
    """``?format=``, on the compute endpoints that draw: json or svg (the heatmap of the weights instead of JSON),
    as the Accept header would choose; absent (None): the Accept header alone chooses."""

    format = fields.String(load_default=None, validate=validate.OneOf(["json", "svg"]))
