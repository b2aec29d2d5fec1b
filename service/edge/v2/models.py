"""The models served over v2: the registry's operations that declare a v2 mapping (service.operations.registry).

A model takes its decoded inputs and validated parameters, builds the v1 params with its mapping and calls
the operation's compute function, as the v1 endpoint does: the limits are checked before any compute and the
numbers equal v1's exactly. The compute precision follows the inputs' datatype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marshmallow import Schema

from service.edge.v2.errors import ProtocolError
from service.operations.limits import Limits
from service.operations.registry import FLOATS, V2_MODELS, Arrays, Operation, Result, TensorSpec

PRECISION = {"FP64": "float64", "FP32": "float32"}


@dataclass(frozen=True)
class Model:
    """A v2 model: its tensors and one instance of its parameters schema, reused by every request."""

    operation: Operation
    parameters: Schema

    @property
    def name(self) -> str:
        return self.operation.v2.name

    @property
    def description(self) -> str:
        return self.operation.v2.description

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.operation.v2.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.operation.v2.outputs

    def run(self, inputs: Arrays, parameters: dict[str, Any], opts: dict[str, Any], limits: Limits) -> Result:
        """The operation's answer to the decoded ``inputs`` and ``parameters``, with the v1 ``opts``."""
        return self.operation.compute({**self.operation.v2.params(inputs, parameters), **opts}, limits)

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


MODELS = {name: Model(operation, operation.v2.parameters()) for name, operation in V2_MODELS.items()}
