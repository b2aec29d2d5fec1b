"""The pages: GET / (the playground), GET /docs (Swagger UI), GET /favicon.ico; not part of the API spec.

Every asset is served by the service itself, so the pages work offline: the playground's own HTML,
JS, CSS and favicon from service/edge/static, and Swagger UI's files from the flask-swagger-ui
package (it ships Swagger UI 5, which renders OpenAPI 3.1; swagger-ui-bundle ships 4.15, which cannot).
"""

from __future__ import annotations

from pathlib import Path

import flask_swagger_ui
from flask import Blueprint, Response, current_app, send_from_directory

SWAGGER_UI = Path(flask_swagger_ui.__file__).parent / "dist"
# The docs page says whether the server asks for API keys (static/docs.js hides the spec's locks when not).
KEYS_OFF, KEYS_ON = '<meta name="api-keys" content="off">', '<meta name="api-keys" content="on">'
DOCS_PAGE = (Path(__file__).parent / "static" / "docs.html").read_text()
if KEYS_OFF not in DOCS_PAGE:
    raise RuntimeError(f"static/docs.html lacks {KEYS_OFF}")
DOCS_PAGES = {False: DOCS_PAGE, True: DOCS_PAGE.replace(KEYS_OFF, KEYS_ON)}  # by app.extensions["api_keys"]

blp = Blueprint("pages", __name__)  # service/edge/static is the app's own static folder, at /static/


@blp.route("/")
def playground() -> Response:
    """The playground page (static; it calls the public API)."""
    return current_app.send_static_file("index.html")


@blp.route("/docs")
def docs() -> Response:
    """Swagger UI for /openapi.json, told whether this server asks for API keys."""
    return Response(DOCS_PAGES[current_app.extensions["api_keys"]], mimetype="text/html")


@blp.route("/docs/assets/<path:name>")
def docs_asset(name: str) -> Response:
    """Swagger UI's scripts and styles, from the installed package (404 for anything else)."""
    return send_from_directory(SWAGGER_UI, name)


@blp.route("/favicon.ico")
def favicon() -> Response:
    """Browsers ask for /favicon.ico on any page (a 404 would be a console error): the SVG icon."""
    return current_app.send_static_file("favicon.svg")
