"""Optional bearer-key auth (API_KEYS) and the CORS allow-list (CORS_ORIGINS)."""

from __future__ import annotations

import pytest

from service import settings
from service.edge import create_app
from service.edge.security import is_protected, key_matches
from service.settings import Access
from tests.conftest import app_with, assert_problem

KEYS = "k-one, k-two ,"


@pytest.fixture
def locked():
    return app_with(access=Access(api_keys=settings.KEYS.parse(KEYS))).test_client()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_auth_is_off_by_default(client):
    assert client.get("/v1/limits").status_code == 200


@pytest.mark.parametrize("path", ["/v1/limits", "/v1/vocabulary", "/v1/demos", "/v1/nope", "/v1", "/v2",
                                  "/v2/models/multi_head_attention"])
@pytest.mark.parametrize("headers", [{}, bearer("wrong"), bearer(""), {"Authorization": "Basic k-one"},
                                     {"Authorization": "k-one"}, bearer("k-one2"), bearer("K-ONE")])
def test_without_a_valid_key_every_v1_and_v2_call_is_401(locked, path, headers):
    response = locked.get(path, headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert response.headers["X-Request-Id"]
    if path.startswith("/v1"):
        body = assert_problem(response, 401)
        assert body["type"].endswith(":unauthorized") and body["request_id"] == response.headers["X-Request-Id"]
    else:  # the Open Inference Protocol's error shape
        assert response.mimetype == "application/json" and list(response.get_json()) == ["error"]


def test_a_post_without_a_key_is_refused_before_its_body_is_read(locked):
    assert locked.post("/v1/attention", data=b"{", content_type="application/json").status_code == 401


@pytest.mark.parametrize("key", ["k-one", "k-two"])
def test_any_configured_key_opens_v1(locked, key):
    assert locked.get("/v1/limits", headers=bearer(key)).status_code == 200
    assert locked.get("/v1/limits", headers={"Authorization": f"bearer  {key} "}).status_code == 200
    assert locked.get("/v1/nope", headers=bearer(key)).status_code == 404  # past auth, then routing


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/openapi.json", "/openapi.yaml"])
def test_probes_metrics_and_the_spec_stay_open(locked, path):
    assert locked.get(path).status_code == 200


def test_v2_health_probes_stay_open():
    assert not is_protected("/v2/health/live") and not is_protected("/v2/health/ready")
    assert is_protected("/v2/health") and is_protected("/v2/models/x/infer") and is_protected("/v1")
    assert not is_protected("/v10/x") and not is_protected("/docs") and not is_protected("/")


def test_cors_preflight_needs_no_key(locked):
    response = locked.options("/v1/attention", headers={"Origin": "https://a.example",
                                                        "Access-Control-Request-Method": "POST"})
    assert response.status_code == 200


def test_key_comparison():
    keys = (b"alpha", b"beta")
    assert key_matches("Bearer beta", keys) and key_matches("BEARER alpha", keys)
    assert not key_matches("Bearer alph", keys) and not key_matches(None, keys) and not key_matches("", keys)
    assert not key_matches("Bearer ünïcode", keys) and not key_matches("Bearer \udcff", keys)
    assert settings.KEYS.parse(KEYS) == ("k-one", "k-two") and settings.ITEMS.parse(" , ") == ()


def test_a_non_ascii_key_matches_the_bytes_that_come_over_http():
    keys = ("ключ".encode(),)
    assert key_matches("Bearer " + "ключ".encode().decode("latin-1"), keys)  # what a WSGI server hands over
    assert not key_matches("Bearer ключ", keys)  # cannot come over HTTP as such


def test_api_keys_with_no_key_in_them_refuse_to_start(environ):
    environ.setenv("API_KEYS", " , ")
    with pytest.raises(ValueError, match="API_KEYS must be comma-separated keys, at least one"):
        settings.from_env()
    environ.setenv("API_KEYS", "")
    assert create_app({"TESTING": True}).test_client().get("/v1/limits").status_code == 200


def test_auth_is_read_from_the_environment(environ):
    environ.setenv("API_KEYS", "env-key")
    client = create_app({"TESTING": True}).test_client()
    assert client.get("/v1/limits").status_code == 401
    assert client.get("/v1/limits", headers=bearer("env-key")).status_code == 200


ORIGIN = "https://teach.example"


@pytest.fixture
def cors():
    return app_with(access=Access(cors_origins=(ORIGIN, "https://other.example"))).test_client()


def test_no_cors_headers_by_default(client):
    assert "Access-Control-Allow-Origin" not in client.get("/v1/limits", headers={"Origin": ORIGIN}).headers


def test_an_allowed_origin_gets_cors_headers(cors):
    response = cors.post("/v1/attention", json={"query": [[1.0]], "key": [[1.0]], "value": [[2.0]]},
                         headers={"Origin": ORIGIN})
    assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert response.headers["Access-Control-Expose-Headers"] == "X-Request-Id"
    assert response.headers.getlist("Vary") == ["Accept, Origin"]  # one line: the answer also varies by Accept
    assert "Access-Control-Allow-Methods" not in response.headers  # only on preflights


def test_a_preflight_from_an_allowed_origin(cors):
    response = cors.options("/v1/attention", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "content-type"})
    assert response.status_code == 200
    # DELETE: a browser may delete a batch input file (DELETE /v1/files/{id})
    assert {m.strip() for m in response.headers["Access-Control-Allow-Methods"].split(",")} == {
        "GET", "POST", "DELETE", "OPTIONS"}
    assert {"Authorization", "Content-Type", "X-Request-Id"} <= {
        h.strip() for h in response.headers["Access-Control-Allow-Headers"].split(",")}
    assert int(response.headers["Access-Control-Max-Age"]) > 0


def test_other_origins_get_no_cors_headers(cors):
    response = cors.get("/v1/limits", headers={"Origin": "https://evil.example"})
    assert response.status_code == 200 and "Access-Control-Allow-Origin" not in response.headers
    assert response.headers["Vary"] == "Origin"


def test_cors_wildcard():
    client = app_with(access=Access(cors_origins=("*",))).test_client()
    response = client.get("/v1/limits", headers={"Origin": "https://any.example"})
    assert response.headers["Access-Control-Allow-Origin"] == "*" and "Vary" not in response.headers


def test_errors_get_cors_headers_too(cors):
    response = cors.post("/v1/attention", json={}, headers={"Origin": ORIGIN})
    assert response.status_code == 422 and response.headers["Access-Control-Allow-Origin"] == ORIGIN
