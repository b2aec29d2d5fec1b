"""docker-compose.yml, Dockerfile and deploy/nginx.conf describe the topology tests/live/test_topology.py runs,
and agree with the service's settings (read as files: no Docker, no nginx)."""

from __future__ import annotations

import re

from service.operations.limits import Limits
from tests.harness import (
    COMPOSE,
    DOCKERFILE,
    NGINX_CONF,
    compose_api_command,
    compose_api_environment,
    image_command,
    image_user,
    interpolate,
)


def nginx_directive(name: str) -> str:
    [value] = re.findall(rf"^\s*{name}\s+([^;]+);", NGINX_CONF, re.M)
    return value


def seconds(value: str) -> int:
    return int(value.removesuffix("s"))


def test_compose_runs_the_api_as_the_local_topology_and_the_image_do():
    api = COMPOSE["services"]["api"]
    command = compose_api_command()
    assert command == ["gunicorn", "-c", "service/gunicorn.conf.py", "service.wsgi:app"]
    assert image_command() == command
    assert int(interpolate(api["deploy"]["replicas"])) == 2
    env = compose_api_environment()
    assert all(env[name] == "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"))
    assert env["API_KEYS"] == "" and env["CORS_ORIGINS"] == ""  # off unless the operator sets them
    assert f"127.0.0.1:{env['PORT']}/readyz" in " ".join(api["healthcheck"]["test"])
    assert "/readyz" in re.search(r"^HEALTHCHECK[^\n]*\n[^\n]*", DOCKERFILE, re.M).group(0)


def test_the_image_is_slim_and_runs_as_a_non_root_user():
    assert re.search(r"^FROM python:3\.\d+-slim$", DOCKERFILE, re.M)
    *_, user = image_user()
    assert user not in ("root", "0")


def test_compose_restricts_the_api_as_the_pod_does():
    api = COMPOSE["services"]["api"]
    assert api["read_only"] is True and api["tmpfs"] == ["/tmp:size=64m"]  # the pod's memory-backed /tmp, 64Mi
    assert api["cap_drop"] == ["ALL"] and api["security_opt"] == ["no-new-privileges:true"]


def test_compose_nginx_uses_the_repo_config_and_reaches_the_api_port():
    nginx = COMPOSE["services"]["nginx"]
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in nginx["volumes"]
    assert nginx["depends_on"]["api"]["condition"] == "service_healthy"
    assert "/healthz" in " ".join(nginx["healthcheck"]["test"])
    assert re.search(rf"^\s*server api:{compose_api_environment()['PORT']}\b", NGINX_CONF, re.M)


def test_nginx_limits_agree_with_the_service():
    env = compose_api_environment()
    body = nginx_directive("client_max_body_size")
    assert body.endswith("m")
    assert int(body[:-1]) * 2**20 == int(env["ATTENTION_MAX_BODY_BYTES"]) == Limits().max_body_bytes
    assert seconds(nginx_directive("proxy_read_timeout")) > int(env["GUNICORN_TIMEOUT"])
    grace = seconds(interpolate(COMPOSE["services"]["api"]["stop_grace_period"]))
    assert grace > int(env["GUNICORN_GRACEFUL_TIMEOUT"])
    assert set(nginx_directive("proxy_next_upstream").split()) == {
        "error", "timeout", "http_502", "http_503", "http_504", "non_idempotent"}
    # a request that ran until gunicorn killed its worker is not replayed on another replica
    assert seconds(nginx_directive("proxy_next_upstream_timeout")) < int(env["GUNICORN_TIMEOUT"])
    assert nginx_directive("proxy_request_buffering") == "on"  # slow uploads never hold a sync worker
