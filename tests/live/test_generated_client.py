"""A Python client generated from openapi.yaml works for every operation, against the real gunicorn.

openapi-python-client (0.29.x, the test extra; it reads the spec from its file, no network) writes the client
with the repository's openapi-python-client.yaml into a temporary folder, refusing any part of the spec it would
leave out (``--fail-on-warning``). Every module must import, and every operation is called through it, JSON and
SVG answers both, with a bearer key (the server sets API_KEYS, so the generated auth is used for real): each
answer's status and values are checked against what the service documents or computes. Bounded: the generator
gets GENERATE_TIMEOUT seconds (it takes ~2 s here, its ruff formatting included), every call
CALL_TIMEOUT; the whole file runs in ~5 s (one gunicorn of 2 workers).
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pkgutil
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import yaml

from service.edge.v1 import examples
from service.edge.v1.heatmap import EXAMPLE as HEATMAP_EXAMPLE
from service.edge.v2.routes import EXAMPLE_REQUEST as V2_EXAMPLE
from service.operations.catalogue import DEFAULT_NAME, DEFAULTS
from service.operations.registry import OPERATIONS
from tests.close import EXAMPLE, assert_close
from tests.harness import ROOT
from tests.live.conftest import gunicorn_server
from tests.unit.operations.test_heatmap import cells, parse

SPEC = yaml.safe_load((ROOT / "openapi.yaml").read_text())
CONFIG = ROOT / "openapi-python-client.yaml"
PACKAGE = "attention_client"  # package_name_override in CONFIG
GENERATE_TIMEOUT = 120  # seconds
CALL_TIMEOUT = 30.0  # seconds, per call (none took more than 0.11 s here)
KEY = "generated-client-key"


def documented(path: str, method: str = "post") -> Any:
    """The documented 200 JSON example of an operation (the service's real answer to its example request)."""
    return SPEC["paths"][path][method]["responses"]["200"]["content"]["application/json"]["example"]


def module_name(path: str, method: str) -> str:
    """The generator's module name of an operation: ``post /v1/models/{model}/attention`` ->
    ``post_v1_models_model_attention``."""
    return re.sub(r"[^a-z0-9]+", "_", f"{method} {path}".lower()).strip("_")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The generated client package, importable for the module's tests."""
    out = tmp_path_factory.mktemp("generated")
    # its post-generation hooks run ruff (a dependency of the generator), found on PATH next to this Python
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(ROOT / "openapi.yaml"),
         "--config", str(CONFIG), "--meta", "none", "--output-path", str(out / PACKAGE), "--fail-on-warning"],
        capture_output=True, text=True, timeout=GENERATE_TIMEOUT, env=env, cwd=out)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The real gunicorn with an API key set, serving the models the documented examples name (the defaults)."""
    with gunicorn_server(WEB_CONCURRENCY="2", API_KEYS=KEY, ATTENTION_MODELS=",".join(DEFAULTS)) as url:
        yield url


@pytest.fixture(scope="module")
def client(package: ModuleType, server: str) -> Any:
    """The generated client with the key; a status the spec does not document raises."""
    return package.AuthenticatedClient(base_url=server, token=KEY, timeout=CALL_TIMEOUT,
                                       raise_on_unexpected_status=True)


def api_modules(package: ModuleType) -> dict[str, ModuleType]:
    """Every generated operation module by its name (``post_v1_attention``), imported."""
    found = {}
    for info in pkgutil.walk_packages(package.api.__path__, package.api.__name__ + "."):
        module = importlib.import_module(info.name)
        if not info.ispkg:
            found[info.name.rsplit(".", 1)[1]] = module
    return found


def test_every_module_imports_and_every_operation_has_one(package):
    files = [path for path in Path(package.__file__).parent.rglob("*.py")]
    imported = [importlib.import_module(info.name)
                for info in pkgutil.walk_packages(package.__path__, PACKAGE + ".")]
    assert len(imported) + 1 == len(files)  # + the package itself
    operations = {module_name(path, method) for path, item in SPEC["paths"].items()
                  for method in item if method in ("get", "post", "delete")}
    assert set(api_modules(package)) == operations == set(CALLS)  # each operation is called below


def cell_values(svg: str) -> list[float]:
    """The exact weights an SVG heatmap shows, cell by cell."""
    return [float(cell.get("data-value")) for cell in cells(parse(svg))]


def flat_weights(answer: dict[str, Any]) -> list[float]:
    """An answer's weights in the heatmap's cell order (a stack's: layer by layer; a generation's: each step's row
    over every token, zeros past its own)."""
    if "steps" in answer:
        width, steps = len(answer["tokens"]) + len(answer["steps"]), answer["steps"]
        rows = [np.asarray([layer["weights"] for layer in step["attention"]]) for step in steps]  # each (L, h, keys)
        padded = np.zeros((*rows[0].shape[:2], len(steps), width))                         # (L, h, m, n + m)
        for i, row in enumerate(rows):
            padded[:, :, i, :row.shape[-1]] = row
        return padded.ravel().tolist()
    if "layers" in answer:
        return np.ravel([layer["weights"] for layer in answer["layers"]]).tolist()
    return np.ravel(answer["weights"]).tolist()


def body_of(package: ModuleType, model: str, example: dict[str, Any]) -> Any:
    return getattr(package.models, model).from_dict(example)


Call = Callable[[ModuleType, ModuleType, Any], None]


def explained_cells(answer: dict[str, Any]) -> list[float]:
    """An explain answer (with return_weights) in its picture's cell order: rollout's layers, flow, then each
    selected head's raw weights and its norms."""
    parts = [[entry["values"] for entry in answer.get("rollout", [])], answer.get("flow", []),
             [entry["weights"] for entry in answer.get("norms", [])],
             [entry["head_norms"] for entry in answer.get("norms", [])]]
    return [value for part in parts for value in np.ravel(part).tolist()]


def served_model(package: ModuleType, name: str, enum: str, suffix: str = "") -> dict[str, Any]:
    """The path's model argument of operation ``name`` (its documented example's), when its path has one."""
    served = OPERATIONS[name].path_example.get("model", DEFAULT_NAME)
    return {"model": getattr(package.models, f"{enum}{suffix}Model")(served)} if enum else {}


def json_call(model: str, path: str, name: str, enum: str = "") -> Call:
    """The check of a compute operation's JSON answer: its documented answer to its example."""
    def call_json(module: ModuleType, package: ModuleType, client: Any) -> None:
        response = module.sync_detailed(client=client, body=body_of(package, model, examples.request(name)),
                                        **served_model(package, name, enum))
        assert response.status_code == 200
        assert_close(response.parsed.to_dict(), documented(path), **EXAMPLE)  # the example: another process's digits

    return call_json


def json_and_svg(model: str, path: str, name: str, enum: str = "", drawn: Callable[[dict], list[float]] = flat_weights,
                 **raw_options: Any) -> tuple[Call, Call]:
    """The checks of a compute operation and its /heatmap: its documented answer, and the picture of its weights
    (``drawn(answer)``: the values it shows, in cell order, of the answer to the example with ``raw_options``).
    A path's model is the documented example's."""
    served = OPERATIONS[name].path_example.get("model", DEFAULT_NAME)

    def call_svg(module: ModuleType, package: ModuleType, client: Any) -> None:
        response = module.sync_detailed(client=client, body=body_of(package, model, examples.request(name)),
                                        **served_model(package, name, enum, "Heatmap"))
        assert response.status_code == 200 and response.headers["content-type"].startswith("image/svg+xml")
        # unrounded weights: the picture ignores decimals
        raw = {key: value for key, value in examples.request(name).items() if key != "decimals"}
        answer = client.get_httpx_client().post(path.replace("{model}", served), json={**raw, **raw_options})
        assert cell_values(response.parsed) == drawn(answer.json())

    return json_call(model, path, name, enum), call_svg


def plain(path: str, **params: Any) -> Call:
    """The check of a GET operation whose documented example is its exact answer."""
    def call(module: ModuleType, package: ModuleType, client: Any) -> None:
        response = module.sync_detailed(client=client, **params)
        assert response.status_code == 200
        assert response.parsed.to_dict() == documented(path, "get")

    return call


def with_model(path: str, enum: str, name: str) -> Call:
    """The check of a GET operation on a path's model."""
    def call(module: ModuleType, package: ModuleType, client: Any) -> None:
        response = module.sync_detailed(getattr(package.models, enum)(name), client=client)
        assert response.status_code == 200
        assert response.parsed.to_dict() == documented(path, "get")

    return call


def demos(module: ModuleType, package: ModuleType, client: Any) -> None:
    parsed = module.sync_detailed(client=client).parsed
    assert [demo.name for demo in parsed.demos] == ["lookup", "scaling", "positional-encoding", "causal-mask",
                                                     "multi-head"]


def demo(module: ModuleType, package: ModuleType, client: Any) -> None:
    response = module.sync_detailed("causal-mask", client=client)
    assert response.status_code == 200
    result = response.parsed.result.to_dict()
    assert result["mask"][1] == [True, True, False, False, False]
    assert result["weights"][1][:2] == pytest.approx([0.28966783268411356, 0.7103321673158864], abs=1e-15)


def demo_heatmap(module: ModuleType, package: ModuleType, client: Any) -> None:
    response = module.sync_detailed("causal-mask", client=client)
    assert response.status_code == 200
    weights = client.get_httpx_client().get("/v1/demos/causal-mask").json()["result"]["weights"]
    assert cell_values(response.parsed) == np.ravel(weights).tolist()


def heatmap(module: ModuleType, package: ModuleType, client: Any) -> None:
    response = module.sync_detailed(client=client, body=body_of(package, "HeatmapRequest", HEATMAP_EXAMPLE))
    assert response.status_code == 200
    assert cell_values(response.parsed) == np.ravel(HEATMAP_EXAMPLE["weights"]).tolist()


BATCH_ITEMS = [*examples.request("batch")["requests"],
               {"id": "model", "op": "model-attention", "body": {**examples.request("model-attention"),
                                                                 "model": DEFAULT_NAME}}]
BATCH_BODIES = {"attention": "AttentionRequest", "embed": "EmbedRequest", "self-attention": "SelfAttentionRequest",
                "positional-encoding": "PositionalEncodingBody", "model-attention": "ModelAttentionItem"}


def batch(module: ModuleType, package: ModuleType, client: Any) -> None:
    """Each item's body built as its op's model (the body's anyOf cannot tell a plain dict's op), each answer read
    back as its op's."""
    items = [package.models.BatchItem(id=item["id"], op=package.models.BatchItemOp(item["op"]),
                                      body=body_of(package, BATCH_BODIES[item["op"]], item["body"]))
             for item in BATCH_ITEMS]
    response = module.sync_detailed(client=client, body=package.models.BatchRequest(requests=items))
    assert response.status_code == 200
    answers = {item.id: item for item in response.parsed.responses}
    assert [answers[item["id"]].status for item in BATCH_ITEMS] == [200, 422, 200, 200, 200]
    assert answers["lookup"].body.to_dict() == documented("/v1/attention")
    assert answers["typo"].error.errors[0].to_dict() == {"pointer": "/requests/1/body/tokens/1",
                                                         "detail": "unknown token 'dgo'"}
    assert type(answers["model"].body).__name__ == "ModelAttentionResponse"
    assert answers["model"].body.tokens == ["[CLS]", "the", "dog", "ate", "[SEP]"]
    assert response.parsed.to_dict() == json.loads(response.content)  # nothing lost in the reading


def health(field: str, value: Any) -> Call:
    """The check of a health probe (open: the client without a key)."""
    def call(module: ModuleType, package: ModuleType, client: Any) -> None:
        keyless = package.Client(base_url=str(client.get_httpx_client().base_url), timeout=CALL_TIMEOUT)
        response = module.sync_detailed(client=keyless)
        assert response.status_code == 200 and response.parsed.to_dict() == {field: value}

    return call


EMBEDDINGS = np.arange(8, dtype=np.float32).reshape(2, 4) / 8  # (n, d_model)


def infer(module: ModuleType, package: ModuleType, client: Any) -> None:
    """JSON in, and binary in (the extension's header as the operation's parameter), both answered in JSON."""
    model = package.models.PostV2ModelsModelInferModel
    response = module.sync_detailed(model("scaled_dot_product_attention"), client=client,
                                    body=body_of(package, "InferenceRequest", V2_EXAMPLE))
    assert response.status_code == 200
    assert_close(response.parsed.to_dict(), documented("/v2/models/{model}/infer"), **EXAMPLE)  # to 6 digits

    def multi_head(inputs: dict[str, Any], payload: bytes = b"") -> list[float]:
        request = {"inputs": [inputs], "parameters": {"num_heads": 2}, "outputs": [{"name": "output"}]}
        if not payload:
            body = body_of(package, "InferenceRequest", request)
            answer = module.sync_detailed(model("multi_head_attention"), client=client, body=body)
        else:
            header = json.dumps(request).encode()
            body = package.types.File(payload=io.BytesIO(header + payload))
            answer = module.sync_detailed(model("multi_head_attention"), client=client, body=body,
                                          inference_header_content_length=len(header))
        assert answer.status_code == 200
        [output] = answer.parsed.outputs
        assert (output.name, output.datatype, output.shape) == ("output", "FP32", [2, 4])
        return output.data

    tensor = {"name": "embeddings", "shape": [2, 4], "datatype": "FP32"}
    as_json = multi_head({**tensor, "data": EMBEDDINGS.ravel().tolist()})
    as_binary = multi_head({**tensor, "parameters": {"binary_data_size": EMBEDDINGS.nbytes}},
                           EMBEDDINGS.astype("<f4").tobytes())
    assert as_binary == as_json and len(as_json) == 8 and np.ptp(as_json) > 0


ATTENTION, ATTENTION_SVG = json_and_svg("AttentionRequest", "/v1/attention", "attention")
SELF, SELF_SVG = json_and_svg("SelfAttentionRequest", "/v1/self-attention", "self-attention")
MULTI, MULTI_SVG = json_and_svg("MultiHeadRequest", "/v1/multi-head-attention", "multi-head-attention")
ENCODER, ENCODER_SVG = json_and_svg("EncoderRequest", "/v1/encoder", "encoder")
MODEL, MODEL_SVG = json_and_svg("ModelAttentionRequest", "/v1/models/{model}/attention", "model-attention",
                                enum="PostV1ModelsModelAttention")
GENERATE, GENERATE_SVG = json_and_svg("GenerateRequest", "/v1/models/{model}/generate", "generate",
                                      enum="PostV1ModelsModelGenerate")
EXPLAIN, EXPLAIN_SVG = json_and_svg("ExplainRequest", "/v1/models/{model}/explain", "model-explain",
                                    enum="PostV1ModelsModelExplain", drawn=explained_cells, return_weights=True)


def embed(module: ModuleType, package: ModuleType, client: Any) -> None:
    response = module.sync_detailed(client=client, body=body_of(package, "EmbedRequest", examples.request("embed")))
    assert response.status_code == 200 and response.parsed.to_dict() == documented("/v1/embed")


# Batch jobs: the server runs no job worker here, so a batch stays validating (tests/live/test_jobs_* run them).
LINES = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/multi-head-attention",
                             "body": examples.request("multi-head-attention")}).encode() + b"\n" for i in range(2))


def chat_completions(module: ModuleType, package: ModuleType, client: Any) -> None:
    """OpenAI's contract through the generated client: the documented answer, but for its own id and time."""
    body = package.models.ChatCompletionRequest.from_dict(examples.request("completions"))
    response = module.sync_detailed(client=client, body=body)
    assert response.status_code == 200
    expected = documented("/v1/chat/completions")
    assert {**response.parsed.to_dict(), "id": expected["id"], "created": expected["created"]} == expected


def uploaded(client: Any) -> str:
    """A file of LINES, uploaded raw (the generated client sends the form): its id."""
    response = client.get_httpx_client().post("/v1/files?purpose=batch", content=LINES,
                                              headers={"Content-Type": "application/x-ndjson"})
    assert response.status_code == 200, response.text
    return response.json()["id"]


def created(client: Any) -> str:
    """A batch of a new file of LINES: its id."""
    body = {"input_file_id": uploaded(client), "endpoint": "/v1/multi-head-attention", "completion_window": "24h"}
    response = client.get_httpx_client().post("/v1/batches", json=body)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def upload_file(module: ModuleType, package: ModuleType, client: Any) -> None:
    body = package.models.PostV1FilesBody(file=package.types.File(payload=io.BytesIO(LINES), file_name="r.jsonl"),
                                          purpose=package.models.PostV1FilesBodyPurpose("batch"))
    response = module.sync_detailed(client=client, body=body)
    assert response.status_code == 200
    answer = response.parsed.to_dict()  # "bytes" is a Python name: the model's attribute is bytes_
    assert (answer["bytes"], answer["filename"], answer["purpose"]) == (len(LINES), "r.jsonl", "batch")


def list_files(module: ModuleType, package: ModuleType, client: Any) -> None:
    file_id = uploaded(client)
    response = module.sync_detailed(client=client, purpose=package.models.GetV1FilesPurpose("batch"))
    assert response.status_code == 200 and file_id in [file.id for file in response.parsed.data]
    assert response.parsed.to_dict() == json.loads(response.content)


def get_file(module: ModuleType, package: ModuleType, client: Any) -> None:
    file_id = uploaded(client)
    response = module.sync_detailed(file_id, client=client)
    assert response.status_code == 200
    assert (response.parsed.id, response.parsed.to_dict()["bytes"]) == (file_id, len(LINES))


def delete_file(module: ModuleType, package: ModuleType, client: Any) -> None:
    file_id = uploaded(client)
    response = module.sync_detailed(file_id, client=client)
    assert response.status_code == 200 and response.parsed.to_dict() == {"id": file_id, "object": "file",
                                                                          "deleted": True}
    assert module.sync_detailed(file_id, client=client).status_code == 404


def file_content(module: ModuleType, package: ModuleType, client: Any) -> None:
    response = module.sync_detailed(uploaded(client), client=client)
    assert response.status_code == 200 and response.parsed == LINES.decode()


def create_batch(module: ModuleType, package: ModuleType, client: Any) -> None:
    window = package.models.CreateBatchRequestCompletionWindow("24h")
    body = package.models.CreateBatchRequest(input_file_id=uploaded(client), endpoint="/v1/multi-head-attention",
                                             completion_window=window)
    response = module.sync_detailed(client=client, body=body)
    assert response.status_code == 200
    assert response.parsed.to_dict()["status"] == "validating"
    assert response.parsed.request_counts.to_dict() == {"total": 0, "completed": 0, "failed": 0}


def batch_call(check: Callable[[dict[str, Any], str], None], **params: Any) -> Call:
    """A call on a new batch (by id, or listing), its answer read back and checked."""
    def call(module: ModuleType, package: ModuleType, client: Any) -> None:
        batch_id = created(client)
        response = module.sync_detailed(client=client, **params) if params else module.sync_detailed(
            batch_id, client=client)
        assert response.status_code == 200
        assert response.parsed.to_dict() == json.loads(response.content)  # nothing lost in the reading
        check(response.parsed.to_dict(), batch_id)

    return call


CALLS: dict[str, Call] = {
    "post_v1_attention": ATTENTION, "post_v1_attention_heatmap": ATTENTION_SVG,
    "post_v1_self_attention": SELF, "post_v1_self_attention_heatmap": SELF_SVG,
    "post_v1_multi_head_attention": MULTI, "post_v1_multi_head_attention_heatmap": MULTI_SVG,
    "post_v1_encoder": ENCODER, "post_v1_encoder_heatmap": ENCODER_SVG,
    "post_v1_models_model_attention": MODEL, "post_v1_models_model_attention_heatmap": MODEL_SVG,
    "post_v1_models_model_generate": GENERATE, "post_v1_models_model_generate_heatmap": GENERATE_SVG,
    "post_v1_models_model_explain": EXPLAIN, "post_v1_models_model_explain_heatmap": EXPLAIN_SVG,
    "post_v1_models_model_census": json_call("CensusRequest", "/v1/models/{model}/census", "census",
                                             enum="PostV1ModelsModelCensus"),
    "post_v1_embed": embed,
    "get_v1_positional_encoding": plain("/v1/positional-encoding", **examples.request("positional-encoding")),
    "get_v1_causal_mask": plain("/v1/causal-mask", **examples.request("causal-mask")),
    "get_v1_vocabulary": plain("/v1/vocabulary"),
    "get_v1_limits": plain("/v1/limits"),
    "get_v1_models": plain("/v1/models"),
    "get_v1_models_model": with_model("/v1/models/{model}", "GetV1ModelsModelModel", DEFAULT_NAME),
    "get_v1_demos": demos, "get_v1_demos_name": demo, "get_v1_demos_name_heatmap": demo_heatmap,
    "post_v1_heatmap": heatmap,
    "post_v1_batch": batch,
    "post_v1_chat_completions": chat_completions,
    "get_healthz": health("status", "ok"), "get_readyz": health("status", "ready"),
    "get_v2": plain("/v2"),
    "get_v2_health_live": health("live", True), "get_v2_health_ready": health("ready", True),
    "get_v2_models_model": with_model("/v2/models/{model}", "GetV2ModelsModelModel",
                                      "scaled_dot_product_attention"),
    "get_v2_models_model_ready": with_model("/v2/models/{model}/ready", "GetV2ModelsModelReadyModel",
                                            "multi_head_attention"),
    "post_v2_models_model_infer": infer,
    "post_v1_files": upload_file, "get_v1_files": list_files, "get_v1_files_file_id": get_file,
    "delete_v1_files_file_id": delete_file, "get_v1_files_file_id_content": file_content,
    "post_v1_batches": create_batch,
    "get_v1_batches": batch_call(lambda answer, batch_id: batch_id in [b["id"] for b in answer["data"]], limit=100),
    "get_v1_batches_batch_id": batch_call(lambda answer, batch_id: answer["id"] == batch_id),
    "post_v1_batches_batch_id_cancel": batch_call(lambda answer, batch_id: answer["status"] in ("cancelling",
                                                                                                 "cancelled")),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_operation_answers_through_the_generated_client(package, client, name):
    CALLS[name](api_modules(package)[name], package, client)


def test_without_the_key_the_documented_401s_are_parsed(package, server):
    keyless = package.AuthenticatedClient(base_url=server, token="wrong", timeout=CALL_TIMEOUT)
    modules = api_modules(package)
    refused = modules["get_v1_limits"].sync_detailed(client=keyless)
    assert refused.status_code == 401 and isinstance(refused.parsed, package.models.Problem)
    assert refused.parsed.status == 401 and refused.parsed.request_id == refused.headers["x-request-id"]
    refused = modules["get_v2"].sync_detailed(client=keyless)
    assert refused.status_code == 401 and isinstance(refused.parsed, package.models.ProtocolError)
    assert "Bearer" in refused.parsed.error
