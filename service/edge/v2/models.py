"""The models served over v2: the registry's operations that declare a v2 mapping (service.operations.registry),
and every trained model the process serves (service.operations.catalogue), under its served name.

An operation's model takes its decoded inputs and validated parameters, builds the v1 params with its mapping
and calls the operation's compute function, as the v1 endpoint does: the limits are checked before any compute
and the numbers equal v1's exactly. The compute precision follows the inputs' datatype. A trained model takes
a batch of texts and answers them padded to the longest (service.operations.padded), in float32.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from marshmallow import Schema

from schemas.v2 import TrainedModelParameters
from service.edge.v2.errors import ProtocolError
from service.operations import catalogue, padded
from service.operations.catalogue import ServedModel
from service.operations.registry import FLOATS, V2_MODELS, Arrays, Operation, Result, TensorSpec
from service.settings import Limits, SettingsError

PRECISION = {"FP64": "float64", "FP32": "float32"}


class _Tensors:
    """What every v2 model shows: its name, inputs and outputs."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def metadata(self) -> dict[str, Any]:
        """``$metadata_model_response`` (no ``versions``: models are not versioned here)."""
        return {"name": self.name, "platform": "numpy",
                "inputs": [spec.metadata() for spec in self.inputs],
                "outputs": [spec.metadata() for spec in self.outputs]}


@dataclass(frozen=True)
class Model(_Tensors):
    """A registry operation's v2 model: its tensors and one instance of its parameters schema, reused by every
    request."""

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

    def run(self, inputs: Arrays, datatypes: dict[str, str], parameters: dict[str, Any], wanted: dict[str, bool],
            limits: Limits) -> Result:
        """The operation's answer to the decoded ``inputs`` (of ``datatypes``) and ``parameters``; the weights
        are computed only when ``wanted``."""
        opts = options(datatypes, "weights" in wanted)
        return self.operation.compute(self.operation.prepare({**self.operation.v2.params(inputs, parameters), **opts},
                                                             limits))


def options(datatypes: dict[str, str], return_weights: bool) -> dict[str, Any]:
    """v1 compute options: the float inputs' common datatype sets the precision."""
    floats = {name: datatype for name, datatype in datatypes.items() if datatype in FLOATS}
    if len(set(floats.values())) > 1:
        raise ProtocolError(f"The float inputs must share one datatype (FP32 or FP64), got {floats}.")
    return {"dtype": PRECISION[next(iter(floats.values()))], "return_weights": return_weights, "trace": False}


MODELS = {name: Model(operation, operation.v2.parameters()) for name, operation in V2_MODELS.items()}

TRAINED_INPUTS = (TensorSpec("text", ("BYTES",), (1,), "[B] (UTF-8 texts)", count_limit="max_batch_items"),)
TRAINED_OUTPUTS = (TensorSpec("attentions", ("FP32",), (5,), "[B, L, H, n, n]"),
                   TensorSpec("last_hidden_state", ("FP32",), (3,), "[B, n, d_model]"),
                   TensorSpec("tokens", ("BYTES",), (2,), "[B, n]"))
_TRAINED_PARAMETERS = TrainedModelParameters()


@dataclass(frozen=True)
class TrainedModel(_Tensors):
    """A served trained model (GET /v1/models) as a v2 model: B texts in, padded to the longest out. Parameters
    ``layers`` and ``heads`` (comma-separated strings: the protocol's parameters are scalars) select what
    ``attentions`` holds; it is computed only when asked for."""

    model: ServedModel
    inputs = TRAINED_INPUTS
    outputs = TRAINED_OUTPUTS
    parameters = _TRAINED_PARAMETERS

    def run(self, inputs: Arrays, datatypes: dict[str, str], parameters: dict[str, Any], wanted: dict[str, bool],
            limits: Limits) -> Result:
        """{attentions (B, L, H, n, n), last_hidden_state (B, n, d_model), tokens (B, n)}: see padded.compute."""
        return padded.compute({"model": self.model, "text": list(inputs["text"]), "layers": parameters["layers"],
                               "heads": parameters["heads"], "return_weights": "attentions" in wanted}, limits)

    @property
    def name(self) -> str:
        return self.model.name


Served = Model | TrainedModel  # what /v2/models/{model} answers for


def find(name: str) -> Served | None:
    """The v2 model ``name``: a registry operation's, else a served trained model's; None when neither."""
    if name in MODELS:
        return MODELS[name]
    return TrainedModel(catalogue.lookup(name)) if name in catalogue.names() else None


def names() -> list[str]:
    """Every v2 model's name: the registry's, then the served trained models'."""
    return [*MODELS, *catalogue.names()]


def refuse_clashes(served: Iterable[str]) -> None:
    """A served model named as a registry v2 model would be hidden by it on /v2: refused at start-up."""
    clashes = sorted(set(served) & set(MODELS))
    if clashes:
        raise SettingsError(f"ATTENTION_MODELS: {clashes} are names of built-in /v2 models; serve the model under "
                         "another name")
