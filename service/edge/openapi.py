"""openapi.yaml written: ``make openapi`` runs ``python -m service.edge.openapi > service/edge/openapi.yaml``.

The document is what flask-smorest and apispec build from the routes and schemas when the app is created, made
readable (the optional key, the served models, key order) and given its examples: the documented requests and the
service's real answers to them, worked out here and nowhere else (service.edge.examples). The server serves the
file it writes (service.edge.spec); a test fails when the file differs from what this module writes.
"""

from __future__ import annotations

from typing import Any

from flask import Flask

from service.edge.examples import resolved
from service.edge.security import document_auth
from service.edge.spec import as_yaml, name_models
from service.edge.v2 import models as v2_models
from service.operations import catalogue

DESCRIPTION = """\
The forward pass of "Attention Is All You Need" in numpy, over HTTP. Tensors are nested JSON
arrays (row-major); masks are booleans, true = may attend. Every error is RFC 9457
application/problem+json, but on /v2 (the protocol's {"error": ...}). Limits: GET /v1/limits."""
MODELS = "A served model's name (GET /v1/models)."
V2_MODELS = "A v2 model: the attention models, then every served trained model (GET /v1/models)."
TOP_LEVEL_ORDER = ("openapi", "info", "tags", "paths", "components")
OPERATION_ORDER = ("summary", "description", "tags", "security", "parameters", "requestBody", "responses")


def _ordered(mapping: dict[str, Any], first: tuple[str, ...]) -> dict[str, Any]:
    """``mapping`` with the keys of ``first`` (those present) first, the others after, in order."""
    return {key: mapping[key] for key in dict.fromkeys((*first, *mapping)) if key in mapping}


def _status_order(code: str) -> tuple[int, str]:
    """Responses by status code, ``default`` last."""
    return (int(code) if code.isdigit() else 1000, code)


def _readable(spec: dict[str, Any]) -> dict[str, Any]:
    """Top-level keys, operation keys and response codes in the order a reader expects."""
    for path in spec["paths"].values():
        for method, operation in path.items():
            if isinstance(operation, dict) and "responses" in operation:
                responses = sorted(operation["responses"].items(), key=lambda item: _status_order(item[0]))
                operation["responses"] = dict(responses)
                path[method] = _ordered(operation, OPERATION_ORDER)
    return _ordered(spec, TOP_LEVEL_ORDER)


def _describe_models(spec: dict[str, Any]) -> None:
    """The ``model`` path parameters: what they name, and the models this process serves."""
    for prefix, names, description in (("/v1/", catalogue.names(), MODELS),
                                       ("/v2/", v2_models.names(), V2_MODELS)):
        name_models(spec, prefix, names)
        for path, item in spec["paths"].items():
            for parameter in item.get("parameters", []) if path.startswith(prefix) else ():
                if parameter["name"] == "model":
                    parameter["description"] = description


def _referenced(node: Any) -> set[str]:
    """Every ``$ref`` under ``node``."""
    if isinstance(node, dict):
        return {node["$ref"]} if "$ref" in node else set().union(*map(_referenced, node.values()))
    if isinstance(node, list):
        return set().union(*map(_referenced, node))
    return set()


def _schema_names(refs: set[str]) -> set[str]:
    return {ref.rsplit("/", 1)[1] for ref in refs if ref.startswith("#/components/schemas/")}


def _without_unreferenced_schemas(spec: dict[str, Any]) -> None:
    """Only the schema components the document reaches (flask-smorest registers its pagination's whether or not
    an operation pages)."""
    schemas = spec["components"]["schemas"]
    outside = {**spec, "components": {kind: items for kind, items in spec["components"].items() if kind != "schemas"}}
    reached, todo = set(), _schema_names(_referenced(outside))
    while todo:
        name = todo.pop()
        reached.add(name)
        todo |= _schema_names(_referenced(schemas[name])) - reached
    for name in set(schemas) - reached:
        del schemas[name]


def document(app: Flask) -> dict[str, Any]:
    """The document of ``app``, its examples worked out, as plain JSON values (string keys, status codes too)."""
    spec = resolved(app.extensions["flask-smorest"]["apis"][""]["ext_obj"].spec.to_dict())
    spec["info"]["description"] = DESCRIPTION
    document_auth(spec)
    _describe_models(spec)
    _without_unreferenced_schemas(spec)
    return _readable(spec)


def main() -> None:
    """Print openapi.yaml (with the default models, read as the server reads its settings)."""
    # Not flask-smorest's `flask openapi write`: it dumps spec.to_dict() raw (no examples worked out, no auth).
    from service.edge import create_app

    print(as_yaml(document(create_app())), end="")


if __name__ == "__main__":
    main()
