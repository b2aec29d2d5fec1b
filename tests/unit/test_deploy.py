"""docker-compose.yml, Dockerfile and deploy/nginx.conf describe the topology tests/live/test_topology.py runs,
and agree with the service's settings (read as files: no Docker, no nginx)."""

from __future__ import annotations

import re
import tomllib
from urllib.parse import urlsplit

from service.settings import Limits
from tests.harness import (
    COMPOSE,
    DOCKERFILE,
    NGINX_CONF,
    ROOT,
    compose_api_command,
    compose_api_environment,
    image_command,
    image_environment,
    image_user,
    interpolate,
)

LOCATION = re.compile(r"^\s*location\s+(\S+)\s*\{([^{}]*)\}", re.M)  # no location here nests a block
RESTRICTIONS = ("read_only", "tmpfs", "cap_drop", "security_opt")


def nginx_directive(name: str, text: str | None = None) -> str:
    """The one value of directive ``name`` in ``text`` (a location's body), or outside every location block."""
    [value] = re.findall(rf"^\s*{name}\s+([^;]+);", LOCATION.sub("", NGINX_CONF) if text is None else text, re.M)
    return value


def locations() -> dict[str, str]:
    """deploy/nginx.conf's location blocks: path (or @name) -> body."""
    return dict(LOCATION.findall(NGINX_CONF))


def megabytes(size: str) -> int:
    assert size.endswith("m"), size
    return int(size[:-1]) * 2**20


def compose_environment(service: str) -> dict[str, str]:
    """A compose service's environment (values as strings, defaults of ${NAME:-default} in)."""
    return {name: interpolate(value) for name, value in COMPOSE["services"][service]["environment"].items()}


def worker_script() -> str:
    """The console script pyproject.toml ships for service.jobs.worker:main."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    [name] = [name for name, target in scripts.items() if target == "service.jobs.worker:main"]
    return name


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
    assert megabytes(nginx_directive("client_max_body_size")) == int(env["ATTENTION_MAX_BODY_BYTES"]) \
        == Limits().max_body_bytes
    assert seconds(nginx_directive("proxy_read_timeout")) > int(env["GUNICORN_TIMEOUT"])
    grace = seconds(interpolate(COMPOSE["services"]["api"]["stop_grace_period"]))
    assert grace > int(env["GUNICORN_GRACEFUL_TIMEOUT"])
    # a request that ran until gunicorn killed its worker is not replayed on another replica
    assert seconds(nginx_directive("proxy_next_upstream_timeout")) < int(env["GUNICORN_TIMEOUT"])
    # buffered everywhere, uploads too: slow uploads never hold a sync worker
    assert nginx_directive("proxy_request_buffering") == "on"
    assert not [path for path, body in locations().items() if "proxy_request_buffering" in body]


def test_nginx_lets_uploads_only_through_up_to_max_file_bytes():
    files = locations()["/v1/files"]
    assert megabytes(nginx_directive("client_max_body_size", files)) \
        == int(compose_api_environment()["ATTENTION_MAX_FILE_BYTES"]) == Limits().max_file_bytes
    assert [path for path, body in locations().items() if "client_max_body_size" in body] == ["/v1/files"]


def test_nginx_repeats_a_post_on_another_replica_only_for_the_compute_endpoints():
    retry = {"error", "timeout", "http_502", "http_503", "http_504"}
    assert set(nginx_directive("proxy_next_upstream").split()) == retry  # what every location inherits
    proxied = {path: body for path, body in locations().items() if not path.startswith("@")}
    assert set(proxied) == {"/", "/v1/files", "/v1/batches"}
    assert all(nginx_directive("proxy_pass", body) == "http://api" for body in proxied.values())
    # the other proxy settings are the server's, shared by every location
    assert all(re.findall(r"^\s*(proxy_\w+)", body, re.M) in (["proxy_pass"], ["proxy_pass", "proxy_next_upstream"])
               for body in proxied.values())
    # computations: repeating a POST is safe. An upload or a new batch would be stored or run twice.
    assert set(nginx_directive("proxy_next_upstream", proxied["/"]).split()) == retry | {"non_idempotent"}
    assert "proxy_next_upstream" not in proxied["/v1/files"] + proxied["/v1/batches"]


def test_the_image_runs_the_worker_and_keeps_the_jobs_data_in_a_volume_of_its_user():
    uid, gid, _ = image_user()
    data = image_environment()["ATTENTION_DATA_DIR"]
    assert data == "/data"
    [made] = re.findall(rf"install -d -o (\d+) -g (\d+) -m 0\d+ {data}$", DOCKERFILE, re.M)
    assert made == (str(uid), str(gid))
    # declared after the directory is made and chowned: changes to a volume's path after VOLUME are discarded
    assert re.findall(r"^VOLUME (.*)$", DOCKERFILE, re.M) == [f'["{data}"]']
    assert DOCKERFILE.index(f"-g {gid} -m") < DOCKERFILE.index("VOLUME")
    assert re.search(r"^RUN pip install \. ", DOCKERFILE, re.M)  # installs the project, and so its console scripts
    assert worker_script() == "attention-worker"


def test_compose_runs_workers_from_the_api_image_under_the_api_restrictions():
    api, worker = COMPOSE["services"]["api"], COMPOSE["services"]["worker"]
    assert worker["command"] == [worker_script()] and worker["build"] == api["build"]
    assert int(interpolate(worker["deploy"]["replicas"])) == 2
    assert float(worker["deploy"]["resources"]["limits"]["cpus"]) == 1  # one consumer, one BLAS thread
    assert {key: worker[key] for key in RESTRICTIONS} == {key: api[key] for key in RESTRICTIONS}
    env = compose_api_environment()
    # Huey's graceful stop (SIGINT) lets the running chunk, at most a request's work, finish and be kept
    assert worker["stop_signal"] == "SIGINT"
    grace = seconds(interpolate(worker["stop_grace_period"]))
    assert grace > int(env["GUNICORN_TIMEOUT"]) > int(env["GUNICORN_GRACEFUL_TIMEOUT"])
    assert worker["healthcheck"] == {"disable": True}  # the image's HEALTHCHECK is HTTP; a worker serves none
    assert "ports" not in worker and "expose" not in worker


def test_compose_api_and_workers_share_the_settings_the_queue_and_the_data_volume():
    api, worker = COMPOSE["services"]["api"], COMPOSE["services"]["worker"]
    env, worker_env = compose_api_environment(), compose_environment("worker")
    assert worker_env.items() <= env.items()  # the same limits, threads and jobs settings as the api
    assert env["ATTENTION_EMBEDDED_WORKERS"] == "0"  # the worker service computes; the api stores and enqueues
    assert env["ATTENTION_DATA_DIR"] == image_environment()["ATTENTION_DATA_DIR"]
    mount = f"jobs-data:{env['ATTENTION_DATA_DIR']}"
    assert api["volumes"] == worker["volumes"] == [mount] and "jobs-data" in COMPOSE["volumes"]
    queue = urlsplit(env["ATTENTION_QUEUE_URL"])
    assert (queue.scheme, queue.hostname, queue.port) == ("redis", "redis", 6379)  # the redis service, its port
    for service in (api, worker):
        assert service["depends_on"]["redis"] == {"condition": "service_healthy"}
    redis = COMPOSE["services"]["redis"]
    assert redis["image"] == "redis:7-alpine" and "--port" not in redis["command"]  # 6379, Redis' default
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    [storage] = redis["volumes"]
    assert storage.split(":") == ["redis-data", "/data"] and "redis-data" in COMPOSE["volumes"]
    assert "ports" not in redis  # only the compose network reaches it


def test_compose_redis_requires_the_password_the_api_and_workers_are_given():
    redis = COMPOSE["services"]["redis"]
    password = redis["command"][redis["command"].index("--requirepass") + 1]
    # one variable, which compose refuses to start without (${NAME:?message}): no password shipped in the file
    assert re.fullmatch(r"\$\{REDIS_PASSWORD:\?[^}]+\}", password)
    assert redis["environment"]["REDISCLI_AUTH"] == password  # the healthcheck's redis-cli ping authenticates
    assert compose_api_environment()["ATTENTION_QUEUE_PASSWORD"] == password
    assert compose_environment("worker")["ATTENTION_QUEUE_PASSWORD"] == password
    assert "@" not in compose_api_environment()["ATTENTION_QUEUE_URL"]  # not in the URL too
