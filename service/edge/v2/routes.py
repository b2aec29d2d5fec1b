"""The Open Inference Protocol (KServe v2 / Triton) REST endpoints under /v2.

Views are thin: HTTP (body size, the binary header split) here, the inference in
:mod:`service.edge.v2.infer`, the models in :mod:`service.edge.v2.models`.
"""

from __future__ import annotations

from typing import Any

from flask import Response, request

from schemas.v2 import (
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ModelReady,
    ProtocolError,
    ServerLive,
    ServerMetadata,
    ServerReady,
)
from service.edge.context import current_limits
from service.edge.examples import Computed
from service.edge.jsonio import declared_charset, read_body
from service.edge.smorest import PACKAGE, VERSION, Blueprint
from service.edge.v2 import errors
from service.edge.v2.infer import infer
from service.edge.v2.models import MODELS, Served, find, names
from service.edge.v2.tensors import HEADER_LENGTH, load_json, parse_header
from service.operations.jsontext import check_depth, dumps
from service.operations.reference import engine_ready
from service.settings import Limits

blp = Blueprint("v2", __name__, url_prefix="/v2",
                description="Open Inference Protocol (KServe v2 / Triton) with the binary tensor data extension.")
errors.register(blp)

EXTENSIONS = ["binary_tensor_data"]
EXAMPLE_REQUEST = {  # the seed's demo 1: the query "it" against the toy embeddings
    "id": "demo-1",
    "inputs": [
        {"name": "query", "shape": [1, 4], "datatype": "FP64", "data": [0, 0, 0, 1]},
        {"name": "key", "shape": [3, 4], "datatype": "FP64", "data": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]]},
        {"name": "value", "shape": [3, 2], "datatype": "FP64", "data": [1, 0, 0, 1, 1, 1]},
    ],
    "parameters": {"scale": 2.0},
}
EXAMPLE_RESPONSE = Computed(lambda: infer(MODELS["scaled_dot_product_attention"], EXAMPLE_REQUEST, memoryview(b""),
                                          Limits())[0])


def _unknown(name: str) -> str:
    return f"Unknown model {name!r}; the models are {', '.join(names())}."


NOT_FOUND = Computed(lambda: {"error": _unknown("gpt")})  # the served models when the spec is written
MODEL_NOT_FOUND = {"schema": ProtocolError, "description": "Unknown model.", "example": NOT_FOUND}


def get_model(name: str) -> Served:
    """The model called ``name``, or a protocol 404 naming every model."""
    model = find(name)
    if model is None:
        raise errors.UnknownModel(_unknown(name))
    return model


def _ready(body: dict[str, Any], ready: bool) -> tuple[dict[str, Any], int]:
    return body, 200 if ready else 503


@blp.route("", methods=["GET"])
@blp.response(200, ServerMetadata, example={"name": PACKAGE, "version": VERSION,
                                            "extensions": EXTENSIONS})
def server_metadata() -> dict[str, Any]:
    """Server metadata.

    The server's name, version and the protocol extensions it supports.
    """
    return {"name": PACKAGE, "version": VERSION, "extensions": EXTENSIONS}


@blp.route("/health/live", methods=["GET"])
@blp.response(200, ServerLive, example={"live": True})
def server_live() -> dict[str, bool]:
    """Server liveness.

    200 while the process answers.
    """
    return {"live": True}


@blp.route("/health/ready", methods=["GET"])
@blp.response(200, ServerReady, example={"ready": True})
@blp.alt_response(503, schema=ServerReady, description="The engine failed its self-test.",
                  example={"ready": False})
def server_ready() -> tuple[dict[str, bool], int]:
    """Server readiness.

    Runs the engine's self-test (as GET /readyz): 200 when it passes, 503 when not.
    """
    ready = engine_ready()
    return _ready({"ready": ready}, ready)


@blp.route("/models/<model>", methods=["GET"])
@blp.response(200, ModelMetadata, example=MODELS["scaled_dot_product_attention"].metadata())
@blp.alt_response(404, **MODEL_NOT_FOUND)
def model_metadata(model: str) -> dict[str, Any]:
    """Model metadata.

    Inputs and outputs, each with one datatype and its largest shape (-1: variable). For the attention
    models, FP64 is accepted wherever FP32 is shown (and answered in FP64), and every tensor may also come one
    rank lower, without its batch dim (a mask down to rank 1, broadcast); the model's description and the infer
    operation give each form. A trained model takes `text` (BYTES [B]) and answers FP32 and BYTES, as shown.
    """
    return get_model(model).metadata()


@blp.route("/models/<model>/ready", methods=["GET"])
@blp.response(200, ModelReady, example={"name": "multi_head_attention", "ready": True})
@blp.alt_response(503, schema=ModelReady, description="The engine failed its self-test.")
@blp.alt_response(404, **MODEL_NOT_FOUND)
def model_ready(model: str) -> tuple[dict[str, Any], int]:
    """Model readiness.

    200 when the model exists and the engine passes its self-test.
    """
    ready = engine_ready()
    return _ready({"name": get_model(model).name, "ready": ready}, ready)


BINARY_DESCRIPTION = f"""\
JSON, or (binary tensor data extension) the JSON header followed by raw tensor bytes: the
`{HEADER_LENGTH}` HTTP header gives the JSON header's length in bytes; each input with
`parameters.binary_data_size` has that many bytes, in the order of `inputs`, little-endian,
row-major, BOOL one byte (0 or 1). Without that header the whole body is JSON (any or no
Content-Type)."""


# The header is a parameter of the operation, not only prose: a generated client can then send binary inputs (and
# openapi-python-client 0.29 imports the `Unset` its two-body signature names, upstream issue #1451).
HEADER_PARAMETER = {"in": "header", "name": HEADER_LENGTH, "required": False, "schema": {"type": "integer",
                                                                                         "minimum": 0},
                    "description": "Binary tensor data extension: the JSON header's length in bytes, the raw "
                                   "tensor bytes following it (see the request body). Absent: the body is JSON."}


@blp.route("/models/<model>/infer", methods=["POST"])
@blp.doc(parameters=[HEADER_PARAMETER], requestBody={
    "required": True, "description": BINARY_DESCRIPTION, "content": {
        "application/json": {"schema": InferenceRequest, "example": EXAMPLE_REQUEST},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})
@blp.response(200, InferenceResponse, example=EXAMPLE_RESPONSE, description=(
    "JSON; or, when an output is asked for as binary, application/octet-stream: the JSON header "
    f"({HEADER_LENGTH} bytes) then each binary output's binary_data_size bytes, in order."),
    headers={HEADER_LENGTH: {"description": "Length of the JSON header when binary outputs follow it.",
                             "schema": {"type": "integer"}}})
@blp.alt_response(200, schema={"type": "string", "format": "binary"}, content_type="application/octet-stream",
                  success=True)
@blp.alt_response(400, schema=ProtocolError, description="Invalid request, caught before any compute.",
                  example={"error": "input 'key': datatype INT32 is not supported; expected FP32 or FP64 "
                                    "with shape [n_k, d_k] or [B, n_k, d_k]."})
@blp.alt_response(404, **MODEL_NOT_FOUND)
@blp.alt_response(413, schema=ProtocolError, description="The body is larger than max_body_bytes.")
def model_infer(model: str) -> Response:
    """Inference.

    Models: `scaled_dot_product_attention` (inputs query, key, value, optional BOOL mask;
    parameters scale, causal) and `multi_head_attention` (input embeddings; parameters num_heads,
    seed, causal, positional_encoding); outputs `output` and `weights`, in the inputs' datatype.
    And every trained model GET /v1/models lists, under its name (`all-minilm-l6-v2` by default):
    input `text` (BYTES [B], UTF-8); parameters `layers`, `heads` (comma-separated strings such as
    "3,5", default all); outputs `attentions` (FP32 [B, L, H, n, n]), `last_hidden_state` (FP32
    [B, n, d_model]) and `tokens` (BYTES [B, n]), in float32, the texts padded to the longest, n
    tokens: padded keys weigh exactly 0, padded query rows and positions are zeros, padded tokens "".
    `outputs` selects what is computed (asking only for `output` skips the weights, for
    `last_hidden_state` the attentions); `binary_data` per output or `binary_data_output` for all
    returns raw bytes (BYTES: each element's 4-byte little-endian length, then its bytes). Same
    limits as v1 (B at most max_batch_items; max_weight_elements counts B * L * H * n * n).
    """
    selected, limits = get_model(model), current_limits()
    current = request._get_current_object()  # the Request itself: each use of the proxy looks it up again
    text, binary = parse_header(read_body(current, limits.max_body_bytes), current.headers.get(HEADER_LENGTH))
    check_depth(text, limits)
    request_json = load_json(text, lambda: declared_charset(current), split=HEADER_LENGTH in current.headers)
    answer, chunks = infer(selected, request_json, binary, limits)
    header = dumps(answer)
    if not chunks:
        return Response(header, mimetype="application/json")
    # Stream the header and each output's bytes as they are: no joining copy.
    response = Response([header, *chunks], mimetype="application/octet-stream")
    response.headers[HEADER_LENGTH] = str(len(header))
    response.headers["Content-Length"] = str(len(header) + sum(len(chunk) for chunk in chunks))
    return response
