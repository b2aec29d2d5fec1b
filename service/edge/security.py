"""Optional bearer-key authentication and a CORS allow-list, hooked into the app by :func:`init_app`.

API_KEYS (service.settings) [unset: auth off] comma-separated keys; with any set, every call under /v1 and /v2
needs ``Authorization: Bearer <key>`` and gets 401 otherwise (problem+json on /v1, the Open
Inference Protocol's ``{"error": ...}`` on /v2), both with ``WWW-Authenticate: Bearer``. Open even
then: everything outside /v1 and /v2 (/healthz, /readyz, /metrics, /openapi.*, pages and their
assets) and /v2/health/* (orchestrator probes); CORS preflights (browsers send them without
credentials). CORS_ORIGINS [unset: no CORS headers] comma-separated origins allowed to call from a
browser, or ``*`` for any.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from flask import Flask, Response, current_app, request

from service.operations.jsontext import dumps
from service.problems import TYPE_BASE, Problem
from service.settings import Access

CHALLENGE = 'Bearer realm="attention-service"'
OPEN_PREFIXES = ("/v2/health/",)
ALLOW_HEADERS = "Authorization, Content-Type, X-Request-Id, Inference-Header-Content-Length"
SPEC_OPTIONS = {"components": {"securitySchemes": {"bearerAuth": {
    "type": "http", "scheme": "bearer",
    "description": "Only when the server sets API_KEYS: `Authorization: Bearer <key>` on /v1 and /v2."}}}}


class Unauthorized(Problem):
    """401: a /v1 call without a valid bearer key while API_KEYS is set."""

    code = 401
    problem_type = TYPE_BASE + "unauthorized"

    def get_headers(self, *args: Any, **kwargs: Any) -> list[tuple[str, str]]:
        return [*super().get_headers(*args, **kwargs), ("WWW-Authenticate", CHALLENGE)]


def is_protected(path: str) -> bool:
    """Under /v1 or /v2, except the open health probes."""
    under = path.startswith(("/v1/", "/v2/")) or path in ("/v1", "/v2")
    return under and not path.startswith(OPEN_PREFIXES)


def document_auth(spec: dict[str, Any]) -> None:
    """In an OpenAPI document (plain JSON values): every protected operation takes the optional bearer key
    and may answer 401; the open ones (health probes) require nothing."""
    def refused(media_type: str, schema: str) -> dict[str, Any]:
        return {"description": "Only when the server sets API_KEYS: no valid `Authorization: Bearer <key>`.",
                "headers": {"WWW-Authenticate": {"description": "The scheme to use: " + CHALLENGE,
                                                 "schema": {"type": "string"}}},
                "content": {media_type: {"schema": {"$ref": "#/components/schemas/" + schema}}}}

    # by the error shape of each API: problem+json on /v1, the protocol's on /v2
    spec["components"].setdefault("responses", {}).update({
        "Unauthorized": refused("application/problem+json", "Problem"),
        "ProtocolUnauthorized": refused("application/json", "ProtocolError")})
    for path, item in spec["paths"].items():
        if not is_protected(path):
            continue
        name = "Unauthorized" if path.startswith("/v1") else "ProtocolUnauthorized"
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                # optional (auth is off by default): "no credentials" is one alternative
                operation["security"] = [{}, {"bearerAuth": []}]
                operation["responses"]["401"] = {"$ref": "#/components/responses/" + name}


def key_matches(authorization: str | None, keys: tuple[bytes, ...]) -> bool:
    """``Bearer <token>`` with a token equal to one of ``keys``, compared in constant time against all."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    # WSGI hands header values over as latin-1 text: encoding back gives the bytes the client sent
    # (a UTF-8 key arrives as its UTF-8 bytes); a character past latin-1 cannot have come over HTTP.
    candidate = token.strip().encode("latin-1", "replace")
    found = False
    for key in keys:  # no early exit: the time does not tell which key (or how many) matched
        found |= hmac.compare_digest(candidate, key)
    return found


def owner() -> str:
    """Who owns what this request creates: a digest of its bearer key while API_KEYS is set (the request got past
    :class:`RequireKey`), "" otherwise (everyone's). Never the key itself: records outlive a rotated key."""
    if not current_app._get_current_object().extensions["api_keys"]:
        return ""
    token = request.headers.get("Authorization", "").partition(" ")[2].strip()
    return hashlib.sha256(token.encode("latin-1", "replace")).hexdigest()[:32]


class RequireKey:
    """before_request hook refusing protected calls without a valid key."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = tuple(key.encode() for key in keys)

    def __call__(self) -> Response | None:
        path = request.path
        if request.method == "OPTIONS" or not is_protected(path):
            return None
        if key_matches(request.headers.get("Authorization"), self.keys):
            return None
        detail = "Send a valid API key as `Authorization: Bearer <key>`."
        if path.startswith("/v1"):
            raise Unauthorized(detail)
        return Response(dumps({"error": detail}), status=401, mimetype="application/json",
                        headers={"WWW-Authenticate": CHALLENGE})


class Cors:
    """after_request hook adding CORS headers for allowed origins (``*``: any origin, no credentials)."""

    # Not flask-cors (6.0): it adds no Vary: Origin to a refused origin's answer, which a shared cache could then
    # hand to an allowed origin (docs/architecture.md, "Libraries, and where the service reaches past them").

    def __init__(self, origins: tuple[str, ...]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(origins)

    def __call__(self, response: Response) -> Response:
        headers = response.headers
        if not self.any:
            response.vary.add("Origin")  # the answer differs by origin: caches must key on it (one Vary line)
        origin = request.headers.get("Origin")
        if origin is None or not (self.any or origin in self.origins):
            return response
        headers["Access-Control-Allow-Origin"] = "*" if self.any else origin
        headers["Access-Control-Expose-Headers"] = "X-Request-Id"
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"  # DELETE: /v1/files/{id}
            headers["Access-Control-Allow-Headers"] = ALLOW_HEADERS
            headers["Access-Control-Max-Age"] = "600"
        return response


def init_app(app: Flask, access: Access) -> None:
    """Auth and CORS from ``access`` (API_KEYS, CORS_ORIGINS).

    Call before the Api is created (it documents the optional bearer scheme). A 401 gets its request id,
    metrics and log line like any answer: the observer (service.observability) wraps the whole app.
    """
    app.config.setdefault("API_SPEC_OPTIONS", SPEC_OPTIONS)
    app.extensions["api_keys"] = bool(access.api_keys)  # the docs page shows its locks only then
    if access.api_keys:
        app.before_request(RequireKey(access.api_keys))
    if access.cors_origins:
        app.after_request(Cors(access.cors_origins))
