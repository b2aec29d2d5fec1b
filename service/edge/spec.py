"""The OpenAPI document the server serves (GET /openapi.json, GET /openapi.yaml): the checked-in openapi.yaml,
read once when the app is created, never computed.

With the default models served, both routes answer the file itself. Under ATTENTION_MODELS the file is adapted,
with no engine call: every ``model`` path parameter names the models served (the trained ones under /v1; the
attention models, then those, under /v2), and the examples that name a default model this server does not serve
are left out. ``make openapi`` (service.edge.openapi) writes the file, its examples computed by the service.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from flask import Blueprint, Flask, Response, current_app

SPEC_FILE = Path(__file__).with_name("openapi.yaml")
YAML = "application/yaml"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: the file in ~0.1 s, not ~0.4 s

blp = Blueprint("openapi", __name__)


class Dumper(yaml.SafeDumper):
    """No &id001 anchors; multi-line text as | blocks; lists of scalars on one line."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


def _represent_list(dumper: yaml.SafeDumper, items: list) -> yaml.Node:
    flow = bool(items) and not any(isinstance(item, dict | list) for item in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flow)


Dumper.add_representer(str, _represent_str)
Dumper.add_representer(list, _represent_list)


def as_yaml(spec: dict[str, Any]) -> str:
    """The spec as YAML: keys in document order, no aliases (what openapi.yaml holds)."""
    return yaml.dump(spec, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=100)


@dataclass(frozen=True)
class Served:
    """The document as each route answers it."""

    json: bytes
    yaml: str


def name_models(spec: dict[str, Any], prefix: str, names: list[str]) -> None:
    """The ``model`` path parameter of every path under ``prefix`` names ``names`` (any string when none)."""
    for path, item in spec["paths"].items():
        for parameter in item.get("parameters", []) if path.startswith(prefix) else ():
            if parameter["in"] == "path" and parameter["name"] == "model":
                parameter["schema"] = {"type": "string", "enum": names} if names else {"type": "string"}


def _drop_examples_naming(node: Any, names: set[str]) -> None:
    """Every ``example`` under ``node`` whose text holds one of ``names`` removed, in place."""
    if isinstance(node, dict):
        example = node.get("example")
        if example is not None and any(name in orjson.dumps(example).decode() for name in names):
            del node["example"]
        for value in node.values():
            _drop_examples_naming(value, names)
    elif isinstance(node, list):
        for value in node:
            _drop_examples_naming(value, names)


def served(defaults: list[str], models: list[str], v2_models: list[str]) -> Served:
    """The document for a server of the trained ``models`` (``v2_models``: every /v2 model), the file's being
    written for the ``defaults``."""
    text = SPEC_FILE.read_text(encoding="utf-8")
    spec = yaml.load(text, Loader=_Loader)
    if models != defaults:
        name_models(spec, "/v1/", models)
        name_models(spec, "/v2/", v2_models)
        _drop_examples_naming(spec, set(defaults) - set(models))
        text = as_yaml(spec)
    return Served(orjson.dumps(spec), text)


def init_app(app: Flask, document: Served) -> None:
    """Serve ``document`` (not itself documented)."""
    app.extensions["spec"] = document
    app.register_blueprint(blp)


@blp.route("/openapi.json")
def openapi_json() -> Response:
    """The OpenAPI document as JSON."""
    return Response(current_app.extensions["spec"].json, mimetype="application/json")


@blp.route("/openapi.yaml")
def openapi_yaml() -> Response:
    """The OpenAPI document as YAML: openapi.yaml itself, with the default models."""
    return Response(current_app.extensions["spec"].yaml, mimetype=YAML)
