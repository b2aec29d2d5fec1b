"""One inference: the parsed JSON header and the binary part of the body -> the response's JSON
header and the binary outputs' bytes. No Flask here (the view does HTTP), so docs and tests call it.
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError

from schemas.v2 import InferenceRequest
from service.edge.v2.errors import ProtocolError
from service.edge.v2.models import Served
from service.edge.v2.tensors import BinaryReader, decode, encode
from service.problems import flatten_messages
from service.settings import Limits

_REQUEST = InferenceRequest()


def _load(schema: Schema, data: Any, where: str) -> dict[str, Any]:
    """marshmallow load; every error message pointing at its place (``where`` + JSON Pointer)."""
    try:
        return schema.load(data)
    except ValidationError as exc:
        details = "; ".join(f"{where}{pointer}: {detail}" for pointer, detail in flatten_messages(exc.messages))
        raise ProtocolError(f"Invalid inference request: {details}"[:1000]) from None


def decode_inputs(model: Served, tensors: list[dict[str, Any]], binary: BinaryReader,
                  limits: Limits) -> tuple[dict, dict]:
    """Arrays and datatypes by input name; unknown, repeated and missing inputs are errors."""
    specs = {spec.name: spec for spec in model.inputs}
    arrays, datatypes = {}, {}
    for tensor in tensors:
        name = tensor["name"]
        if name not in specs:
            raise ProtocolError(f"Unknown input '{name}': {model.name} takes {', '.join(specs)}.")
        if name in arrays:
            raise ProtocolError(f"input '{name}' is given twice.")
        arrays[name], datatypes[name] = decode(specs[name], tensor, binary, limits), tensor["datatype"]
    binary.finish()
    for spec in model.inputs:
        if spec.required and spec.name not in arrays:
            raise ProtocolError(f"input '{spec.name}' is missing; expected {spec.expected()}.")
    return arrays, datatypes


def requested_outputs(model: Served, request: dict[str, Any], binary_default: bool) -> dict[str, bool]:
    """Output name -> returned as binary?  All outputs when ``outputs`` is absent or empty."""
    names = [spec.name for spec in model.outputs]
    if not request.get("outputs"):
        return dict.fromkeys(names, binary_default)
    wanted = {}
    for output in request["outputs"]:
        if output["name"] not in names or output["name"] in wanted:
            raise ProtocolError(f"outputs: '{output['name']}' is unknown or repeated; {model.name} has "
                                f"{' and '.join(names)}.")
        wanted[output["name"]] = output["parameters"].get("binary_data", binary_default)
    return wanted


def infer(model: Served, header: Any, binary: memoryview, limits: Limits) -> tuple[dict[str, Any], list[bytes]]:
    """Validate, decode, compute (only the outputs asked for), encode.

    Every input check happens before the compute; the weights are not built unless requested.
    """
    request = _load(_REQUEST, header, "")
    if request.get("model_name", model.name) != model.name:
        raise ProtocolError(f"model_name {request['model_name']!r} is not the model of the path, {model.name!r}.")
    parameters = _load(model.parameters, request["parameters"], "/parameters")
    binary_default = parameters.pop("binary_data_output")
    inputs, datatypes = decode_inputs(model, request["inputs"], BinaryReader(binary), limits)
    wanted = requested_outputs(model, request, binary_default)
    result = model.run(inputs, datatypes, parameters, wanted, limits)
    outputs, chunks = [], []
    for name, as_binary in wanted.items():
        output, raw = encode(name, result[name], as_binary)
        outputs.append(output)
        if raw is not None:
            chunks.append(raw)
    answer = {"model_name": model.name, **({"id": request["id"]} if "id" in request else {}), "outputs": outputs}
    return answer, chunks
