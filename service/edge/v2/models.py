"""The models served over v2, each a thin mapping onto a v1 compute function.

A model takes its decoded inputs and validated parameters, builds the v1 params dict and calls the
same ``service.compute`` function as the v1 endpoint, so the limits are checked before any
compute and the numbers equal v1's exactly. The compute precision follows the inputs' datatype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from marshmallow import Schema

from schemas.attention import BATCHABLE
from schemas.v2 import AttentionParameters, MultiHeadParameters
from service.edge.v2.errors import ProtocolError
from service.edge.v2.tensors import TensorSpec
from service.operations import compute
from service.operations.limits import Limits

FLOATS = ("FP64", "FP32")
PRECISION = {"FP64": "float64", "FP32": "float32"}
Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Model:
    """A v2 model: its tensors, its parameters schema, and ``run(inputs, parameters, options)``."""

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: Schema  # one instance, reused by every request
    run: Callable[[Arrays, dict[str, Any], dict[str, Any], Limits], compute.Result]

    def metadata(self) -> dict[str, Any]:
        """``$metadata_model_response`` (no ``versions``: models are not versioned here)."""
        return {"name": self.name, "platform": "numpy",
                "inputs": [spec.metadata() for spec in self.inputs],
                "outputs": [spec.metadata() for spec in self.outputs]}


def options(datatypes: dict[str, str], return_weights: bool) -> dict[str, Any]:
    """v1 compute options: the float inputs' common datatype sets the precision."""
    floats = {name: datatype for name, datatype in datatypes.items() if datatype in FLOATS}
    if len(set(floats.values())) > 1:
        raise ProtocolError(f"The float inputs must share one datatype (FP32 or FP64), got {floats}.")
    return {"dtype": PRECISION[next(iter(floats.values()))], "return_weights": return_weights, "trace": False}


def _attention(inputs: Arrays, parameters: dict[str, Any], opts: dict[str, Any], limits: Limits) -> compute.Result:
    params = {**inputs, "mask": inputs.get("mask"), **parameters, **opts}
    return compute.compute_attention(params, limits)


def _multi_head(inputs: Arrays, parameters: dict[str, Any], opts: dict[str, Any], limits: Limits) -> compute.Result:
    params = {"embeddings": inputs["embeddings"], "mask": None, "n_heads": parameters["num_heads"],
              "seed": parameters["seed"],
              "causal": parameters["causal"], "positional_encoding": parameters["positional_encoding"], **opts}
    return compute.compute_multi_head(params, limits)


MODELS = {model.name: model for model in (
    Model(
        "scaled_dot_product_attention",
        "softmax(Q K^T * scale) V, as POST /v1/attention. Parameters: scale (number, default 1/sqrt(d_k)), "
        "causal (bool). FP32 or FP64 (all alike), rank 2 or 3 (leading batch dim); mask is BOOL, "
        "true = may attend, broadcastable to [B, n_q, n_k].",
        (TensorSpec("query", FLOATS, BATCHABLE, "[n_q, d_k] or [B, n_q, d_k]"),
         TensorSpec("key", FLOATS, BATCHABLE, "[n_k, d_k] or [B, n_k, d_k]"),
         TensorSpec("value", FLOATS, BATCHABLE, "[n_k, d_v] or [B, n_k, d_v]"),
         TensorSpec("mask", ("BOOL",), (1, 2, 3), "broadcastable to [B, n_q, n_k]", required=False)),
        (TensorSpec("output", FLOATS, BATCHABLE, "[n_q, d_v] or [B, n_q, d_v]"),
         TensorSpec("weights", FLOATS, BATCHABLE, "[n_q, n_k] or [B, n_q, n_k]")),
        AttentionParameters(), _attention),
    Model(
        "multi_head_attention",
        "Multi-head self-attention with the seeded weights, as POST /v1/multi-head-attention. Parameters: "
        "num_heads (int, required), seed (int, default 0: the seed script's weights), causal, "
        "positional_encoding (bools). embeddings FP32 or FP64.",
        (TensorSpec("embeddings", FLOATS, BATCHABLE, "[n, d_model] or [B, n, d_model]"),),
        (TensorSpec("output", FLOATS, BATCHABLE, "[n, d_model] or [B, n, d_model]"),
         TensorSpec("weights", FLOATS, (3, 4), "[h, n, n] or [B, h, n, n]")),
        MultiHeadParameters(), _multi_head),
)}
