"""The OpenAPI document: generated from the schemas and routes, served, and printed.

``python -m service.edge.openapi > openapi.yaml`` regenerates the checked-in file; GET /openapi.yaml
serves the same text and GET /openapi.json the same document.
"""

from __future__ import annotations

from typing import Any

import orjson
import yaml
from flask import Blueprint, Flask, Response, current_app

from service.edge.jsonio import dumps
from service.edge.security import document_auth
from service.edge.v2 import models as v2_models
from service.operations import catalogue

DESCRIPTION = """\
The forward pass of "Attention Is All You Need" in numpy, over HTTP. Tensors are nested JSON
arrays (row-major); masks are booleans, true = may attend. Every error is RFC 9457
application/problem+json, but on /v2 (the protocol's {"error": ...}). Limits: GET /v1/limits."""
TOP_LEVEL_ORDER = ("openapi", "info", "tags", "paths", "components")
OPERATION_ORDER = ("summary", "description", "tags", "security", "parameters", "requestBody", "responses")

blp = Blueprint("openapi", __name__)


class _Dumper(yaml.SafeDumper):
    """No &id001 anchors; multi-line text as | blocks; lists of scalars on one line."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


def _represent_list(dumper: yaml.SafeDumper, items: list) -> yaml.Node:
    flow = bool(items) and not any(isinstance(item, dict | list) for item in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flow)


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(list, _represent_list)


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


def _document_models(spec: dict[str, Any], prefix: str, names: list[str], description: str) -> None:
    """Name the models of the paths under ``prefix`` in the spec: the ``model`` path parameter's enum (a server
    given other models documents its own)."""
    for path, item in spec["paths"].items():
        for parameter in item.get("parameters", []) if path.startswith(prefix) else ():
            if parameter["in"] == "path" and parameter["name"] == "model":
                parameter["description"] = description
                parameter["schema"] = {"type": "string", "enum": names} if names else {"type": "string"}


def spec_dict(app: Flask) -> dict[str, Any]:
    """The spec as plain JSON values: string keys only (status codes too), readable key order."""
    spec = orjson.loads(dumps(app.extensions["flask-smorest"]["apis"][""]["ext_obj"].spec.to_dict()))
    spec["info"]["description"] = DESCRIPTION
    document_auth(spec)
    _document_models(spec, "/v1/", list(catalogue.served()), "A served model's name (GET /v1/models).")
    _document_models(spec, "/v2/", v2_models.names(), "A v2 model: the attention models, then every served "
                                                      "trained model (GET /v1/models).")
    return _readable(spec)


def spec_yaml(app: Flask) -> str:
    """The spec as YAML, keys in document order, no aliases."""
    return yaml.dump(spec_dict(app), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


@blp.route("/openapi.json")
def openapi_json() -> Response:
    """The OpenAPI document as JSON."""
    return Response(dumps(spec_dict(current_app)), mimetype="application/json")


@blp.route("/openapi.yaml")
def openapi_yaml() -> Response:
    """The OpenAPI document as YAML, identical to the checked-in openapi.yaml."""
    return Response(spec_yaml(current_app), mimetype="application/yaml")


def main() -> None:
    """Print the YAML spec (``make openapi`` writes it to openapi.yaml)."""
    # Not flask-smorest's `flask openapi write`: it dumps spec.to_dict() raw (no document_auth, no description).
    from service.edge import create_app

    print(spec_yaml(create_app()), end="")


if __name__ == "__main__":
    main()
