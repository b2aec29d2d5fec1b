"""Open Inference Protocol (KServe v2 / Triton) JSON objects, as in the REST specification.

The request schemas validate the structure only: a tensor's ``data`` is loaded as is (``Raw``) and
converted to numpy in one step by :mod:`service.edge.v2.tensors`, never element by element.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from marshmallow import EXCLUDE, ValidationError, fields, validate

from schemas.base import Schema
from schemas.fields import BoundedDict, BoundedList, StrictFloat, seed, strict_bool, strict_int

# Far more tensors per request, and dimensions per tensor, than any model here has (4 inputs, rank 4):
# a longer list is refused by its length before any item is loaded (see BoundedList).
MAX_TENSORS = 16
MAX_RANK = 8
MAX_PARAMETERS = 64  # a model takes at most 5, and binary_data_output
MAX_INDEX_TEXT = 4096  # characters of a comma-separated index list: far more than any model's heads need
INDICES = re.compile(r" *[0-9]{1,6} *(?:, *[0-9]{1,6} *)*")
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES")


class ProtocolError(Schema):
    """Every v2 error: HTTP 400 (404 unknown model, 413 body too large) with a message."""

    error = fields.String(required=True, metadata={
        "description": "What is wrong, naming the input and the expected shape or datatype."})


class ServerMetadata(Schema):
    """GET /v2."""

    name = fields.String(required=True)
    version = fields.String(required=True)
    extensions = fields.List(fields.String(), required=True, metadata={
        "description": "binary_tensor_data: Triton's binary tensor data extension."})


class ServerLive(Schema):
    """GET /v2/health/live."""

    live = fields.Boolean(required=True)


class ServerReady(Schema):
    """GET /v2/health/ready."""

    ready = fields.Boolean(required=True)


class ModelReady(Schema):
    """GET /v2/models/{model}/ready."""

    name = fields.String(required=True)
    ready = fields.Boolean(required=True)


class MetadataTensor(Schema):
    """One input or output: one datatype, one shape, -1 for a variable dimension."""

    name = fields.String(required=True)
    datatype = fields.String(required=True, validate=validate.OneOf(DATATYPES))
    shape = fields.List(fields.Integer(), required=True)


class ModelMetadata(Schema):
    """GET /v2/models/{model}."""

    name = fields.String(required=True)
    versions = fields.List(fields.String())
    platform = fields.String(required=True)
    inputs = fields.List(fields.Nested(MetadataTensor), required=True)
    outputs = fields.List(fields.Nested(MetadataTensor), required=True)


class RequestInputParameters(Schema):
    """Per-input parameters; others are ignored."""

    class Meta:
        unknown = EXCLUDE

    binary_data_size = strict_int(0, metadata={
        "description": "Binary extension: the input's data is this many raw bytes after the JSON header "
                       "(little-endian, row-major, BOOL one byte per value); `data` is then absent."})


class RequestInput(Schema):
    """An input tensor: its full (batched) shape, datatype and data."""

    name = fields.String(required=True)
    shape = BoundedList(strict_int(0), required=True, validate=validate.Length(max=MAX_RANK))
    datatype = fields.String(required=True, validate=validate.OneOf(DATATYPES))
    parameters = fields.Nested(RequestInputParameters, load_default=dict)
    data = fields.Raw(metadata={
        "description": "The values, row-major: flat, or nested in the tensor's shape.",
        "type": "array", "items": {}})


class RequestOutputParameters(Schema):
    """Per-output parameters; others are ignored."""

    class Meta:
        unknown = EXCLUDE

    binary_data = strict_bool(metadata={"description": "Binary extension: return this output as raw bytes."})


class RequestOutput(Schema):
    """An output to compute and return."""

    name = fields.String(required=True)
    parameters = fields.Nested(RequestOutputParameters, load_default=dict)


class InferenceRequest(Schema):
    """POST /v2/models/{model}/infer. ``parameters`` hold the model's options (see its description)."""

    id = fields.String(metadata={"description": "Echoed in the response."})
    model_name = fields.String(metadata={"description": "Optional (Triton's examples send it): the model of the "
                                                        "path, else 400."})
    parameters = BoundedDict(keys=fields.String(), load_default=dict, max_members=MAX_PARAMETERS, metadata={
        "description": "Model parameters, and binary_data_output (bool: every output as raw bytes)."})
    inputs = BoundedList(fields.Nested(RequestInput), required=True, validate=validate.Length(min=1, max=MAX_TENSORS))
    outputs = BoundedList(fields.Nested(RequestOutput), validate=validate.Length(max=MAX_TENSORS), metadata={
        "description": "The outputs to compute and return (default: all)."})


class ResponseOutputParameters(Schema):
    """Binary extension: where an output's bytes are."""

    binary_data_size = fields.Integer()


class ResponseOutput(Schema):
    """An output tensor: ``data`` flat row-major, or its size in bytes after the JSON header."""

    name = fields.String(required=True)
    datatype = fields.String(required=True, validate=validate.OneOf(DATATYPES))
    shape = fields.List(fields.Integer(), required=True)
    parameters = fields.Nested(ResponseOutputParameters)
    data = fields.List(fields.Raw(), metadata={"description": "Flat, row-major (absent for binary outputs)."})


class InferenceResponse(Schema):
    """The answer of POST /v2/models/{model}/infer."""

    model_name = fields.String(required=True)
    id = fields.String()
    outputs = fields.List(fields.Nested(ResponseOutput), required=True)


class _Parameters(Schema):
    """Request parameters: the model's and binary_data_output; others (priority, timeout...) are ignored."""

    class Meta:
        unknown = EXCLUDE

    binary_data_output = strict_bool(load_default=False, metadata={
        "description": "Binary extension: every output as raw bytes unless its own binary_data says otherwise."})


class _ModelParameters(_Parameters):
    """Parameters of the attention models."""

    causal = strict_bool(load_default=False, metadata={"description": "Causal (lower-triangular) mask."})


class AttentionParameters(_ModelParameters):
    """Parameters of scaled_dot_product_attention."""

    scale = StrictFloat(load_default=None, metadata={"description": "Factor on QK^T (default 1/sqrt(d_k))."})


class MultiHeadParameters(_ModelParameters):
    """Parameters of multi_head_attention."""

    num_heads = strict_int(1, required=True)
    seed = seed()
    positional_encoding = strict_bool(load_default=False, metadata={
        "description": "Add the sinusoidal positional encoding to the embeddings first."})


class IndexList(fields.String):
    """Layer or head numbers as the protocol's scalar parameters allow: a string such as ``"3,5"`` -> [3, 5],
    sorted; a repeated one is an error. Range is checked against the model when the request is computed."""

    default_error_messages: ClassVar[dict[str, str]] = {"invalid": (
        "Must be a string of indices counted from 0, comma-separated, such as '3,5' (the protocol's parameters "
        "are scalars).")}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> list[int]:
        text = super()._deserialize(value, attr, data, **kwargs)
        if len(text) > MAX_INDEX_TEXT or not INDICES.fullmatch(text):
            raise self.make_error("invalid")
        seen: set[int] = set()
        for index in (int(part) for part in text.split(",")):
            if index in seen:
                raise ValidationError(f"{index} is repeated.")
            seen.add(index)
        return sorted(seen)


class TrainedModelParameters(_Parameters):
    """Parameters of a served trained model (GET /v1/models): which layers and heads ``attentions`` holds."""

    layers = IndexList(load_default=None, metadata={"description": "Layers, e.g. '3,5' (default all)."})
    heads = IndexList(load_default=None, metadata={"description": "Heads of each layer, e.g. '0,7' (default all)."})
