"""The docker-compose topology without Docker: two real gunicorn instances behind Debian's nginx on loopback.

The instances run docker-compose.yml's api command and environment; nginx runs deploy/nginx.conf
with only ports and paths changed (tests/servers.py). Load is bounded in count and time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from servers import (
    COMPOSE,
    NGINX_CONF,
    ROOT,
    Gunicorn,
    Nginx,
    compose_api_command,
    compose_api_environment,
    interpolate,
    needs_nginx,
    render_nginx_conf,
    requests_total,
    wait_for,
)

from service.operations.limits import Limits

MHA = "/v1/multi-head-attention"


def demo5_body(rng: np.random.Generator) -> dict:
    """Demo-5 sized multi-head attention with fresh random embeddings."""
    return {"embeddings": rng.standard_normal((5, 8)).tolist(), "n_heads": 4, "causal": True}


def nginx_directive(name: str) -> str:
    [value] = re.findall(rf"^\s*{name}\s+([^;]+);", NGINX_CONF, re.M)
    return value


def seconds(value: str) -> int:
    return int(value.removesuffix("s"))


# --- docker-compose.yml, Dockerfile and deploy/nginx.conf describe the topology the tests run ---------

def test_compose_runs_the_api_as_the_local_topology_and_the_image_do():
    api = COMPOSE["services"]["api"]
    command = compose_api_command()
    assert command == ["gunicorn", "-c", "service/gunicorn.conf.py", "service.wsgi:app"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    [cmd] = re.findall(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert json.loads(cmd) == command
    assert int(interpolate(api["deploy"]["replicas"])) == 2
    env = compose_api_environment()
    assert all(env[name] == "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"))
    assert env["API_KEYS"] == "" and env["CORS_ORIGINS"] == ""  # off unless the operator sets them
    assert f"127.0.0.1:{env['PORT']}/readyz" in " ".join(api["healthcheck"]["test"])
    assert "/readyz" in re.search(r"^HEALTHCHECK[^\n]*\n[^\n]*", dockerfile, re.M).group(0)


def test_the_image_is_slim_and_runs_as_a_non_root_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim$", dockerfile, re.M)
    [user] = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    assert user not in ("root", "0")


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


@needs_nginx
def test_nginx_accepts_the_rendered_config(tmp_path):
    conf = tmp_path / "nginx.conf"
    conf.write_text(render_nginx_conf(8081, ["127.0.0.1:8001", "127.0.0.1:8002"], tmp_path))
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    result = subprocess.run([binary, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr


# --- the running topology ------------------------------------------------------------------------------

def in_flight(instance: Gunicorn) -> float:
    text = requests.get(f"{instance.url}/metrics", timeout=5).text
    [value] = [s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "http_requests_in_flight"]
    return value


class Load:
    """``clients`` threads posting demo-5 bodies to ``url`` until stopped (bounded: at most ``limit`` each)."""

    def __init__(self, url: str, clients: int = 4, limit: int = 1500) -> None:
        self.url, self.limit, self.stopping = url, limit, threading.Event()
        self.statuses: Counter = Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(seed,)) for seed in range(clients)]
        for thread in self.threads:
            thread.start()

    def client(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with requests.Session() as session:
            for _ in range(self.limit):
                if self.stopping.is_set():
                    return
                try:
                    response = session.post(self.url, json=demo5_body(rng), timeout=10)
                    ok = response.status_code == 200 and np.shape(response.json()["weights"]) == (4, 5, 5)
                    outcome = response.status_code if ok else f"{response.status_code} {response.text[:200]}"
                except requests.RequestException as exc:
                    outcome = repr(exc)
                with self.lock:
                    self.statuses[outcome if isinstance(outcome, int) else "failed"] += 1
                    if not isinstance(outcome, int) or outcome != 200:
                        self.failures.append(str(outcome))

    def total(self) -> int:
        with self.lock:
            return sum(self.statuses.values())

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=30)


@needs_nginx
def test_killing_an_instance_mid_load_fails_no_request():
    exact = {"METRICS_FLUSH_SECONDS": "0"}  # counts read as the load runs: every update applied at once
    with Gunicorn(exact) as first, Gunicorn(exact) as second, Nginx([f"127.0.0.1:{first.port}",
                                                                     f"127.0.0.1:{second.port}"]) as nginx:
        load = Load(f"{nginx.url}{MHA}")
        try:
            wait_for(lambda: load.total() >= 200, 30, "200 requests through nginx")
            before = requests_total(first, MHA), requests_total(second, MHA)
            first.kill()  # SIGKILL to master and workers: in-flight connections die, nginx retries them
            done_at_kill = load.total()
            wait_for(lambda: load.total() >= done_at_kill + 200, 30, "200 more requests after the kill")
        finally:
            load.stop()
        errors = {line.split(", client")[0].split("*")[-1] for line in nginx.error_log().splitlines()}
        assert load.failures == [], (load.failures[:5], errors)
        assert all(count > 20 for count in before), f"both instances served before the kill: {before}"
        assert requests_total(second, MHA) >= before[1] + 200
        upstream_errors = [line for line in nginx.access_log() if "," in line["upstream_status"]]
        assert all(line["status"] == 200 for line in upstream_errors)  # retried on the survivor


@needs_nginx
def test_sigterm_drains_in_flight_requests_and_new_ones_go_to_the_other_replica():
    rng = np.random.default_rng(7)
    slow = {"embeddings": rng.standard_normal((128, 512)).round(4).tolist(), "n_heads": 8, "n_layers": 6,
            "return_weights": False}  # ~0.6 s of compute
    with Gunicorn() as first, Gunicorn() as second, Nginx([f"127.0.0.1:{first.port}",
                                                           f"127.0.0.1:{second.port}"]) as nginx:
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(
            response=requests.post(f"{first.url}/v1/encoder", json=slow, timeout=30)))
        thread.start()
        wait_for(lambda: in_flight(first) >= 2, 10, "the slow request in flight (plus the scrape)")
        first.terminate()
        after = [requests.post(f"{nginx.url}{MHA}", json=demo5_body(rng), timeout=10) for _ in range(20)]
        thread.join(timeout=30)
        assert result["response"].status_code == 200
        assert np.shape(result["response"].json()["output"]) == (128, 512)
        assert [r.status_code for r in after] == [200] * 20
        assert first.process.wait(timeout=25) == 0  # a clean, graceful exit
        # The last requests all went to the other replica (a first one may race the signal and still
        # be answered by the draining instance: it completes too).
        wait_for(lambda: len(nginx.access_log()) >= 20, 5, "nginx's access log lines")
        upstreams = [line["upstream"].split(", ")[-1] for line in nginx.access_log()[-10:]]
        assert upstreams == [f"127.0.0.1:{second.port}"] * 10
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{first.url}/healthz", timeout=2)


@needs_nginx
def test_nginx_answers_its_own_errors_as_problems(tmp_path):
    with Gunicorn() as instance, Nginx([f"127.0.0.1:{instance.port}"]) as nginx:
        big = requests.post(f"{nginx.url}/v1/attention", data=b" " * (Limits().max_body_bytes + 1),
                            headers={"Content-Type": "application/json", "X-Request-Id": "big-1"}, timeout=30)
        assert big.status_code == 413 and big.headers["Content-Type"] == "application/problem+json"
        assert big.json()["request_id"] == big.headers["X-Request-Id"] == "big-1"
        through = requests.get(f"{nginx.url}/v1/nope", headers={"X-Request-Id": "bad id"}, timeout=5)
        assert through.json()["request_id"] == through.headers["X-Request-Id"] != "bad id"
        wait_for(lambda: through.headers["X-Request-Id"] in [line["request_id"] for line in nginx.access_log()], 5,
                 "nginx's access log line (written after the response) with the same id")
        instance.kill()
        down = requests.get(f"{nginx.url}/v1/limits", timeout=10)
        assert down.status_code == 503 and down.headers["Content-Type"] == "application/problem+json"
        assert down.json()["status"] == 503 and down.headers["Retry-After"] == "1"


def test_metrics_of_an_instance_sum_every_worker():
    with Gunicorn(workers=2) as instance:
        for _ in range(30):
            requests.get(f"{instance.url}/v1/limits", timeout=5)
        assert len(instance.workers()) == 2
        # Workers apply their updates within METRICS_FLUSH_SECONDS [1] (see test_metrics); then every scrape agrees.
        wait_for(lambda: requests_total(instance, "/v1/limits") == 30, 10, "every worker's updates")
        scrapes = {requests_total(instance, "/v1/limits") for _ in range(6)}
        assert scrapes == {30.0}  # whichever worker answers the scrape, it reports the instance


def test_each_instance_gets_a_fresh_metrics_directory(monkeypatch, tmp_path):
    import runpy

    for variable in ("PROMETHEUS_MULTIPROC_DIR", "ATTENTION_METRICS_MASTER"):
        monkeypatch.setenv(variable, "")  # recorded: restored after the test
        monkeypatch.delenv(variable)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    conf = runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))
    directory = Path(conf["metrics_dir"])
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(directory) and directory.parent == tmp_path
    assert directory.is_dir()                  # made when the config loads: before a preloaded app imports
    (directory / "counter_12345.db").write_bytes(b"a live worker's")
    conf = runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))   # a reload (SIGHUP) in the same master
    assert Path(conf["metrics_dir"]) == directory and (directory / "counter_12345.db").exists()
    conf["on_exit"](None)
    assert not directory.exists()


def test_recycled_workers_fork_from_the_preloaded_app_and_keep_counting():
    body = {"tokens": ["the", "cat", "ate"], "d_model": 8, "n_heads": 4}
    env = {"GUNICORN_MAX_REQUESTS": "10", "GUNICORN_MAX_REQUESTS_JITTER": "1"}
    with Gunicorn(env, workers=1) as instance:
        first = instance.workers()
        answers = [requests.post(f"{instance.url}/v1/multi-head-attention", json=body, timeout=10)
                   for _ in range(40)]
        assert [a.status_code for a in answers] == [200] * 40
        assert len({a.content for a in answers}) == 1                # every worker computes the same
        assert instance.workers() != first                           # recycled at least once
        assert requests_total(instance, "/v1/multi-head-attention") == 40.0   # dead workers' counts kept
        assert "Booting worker" in instance.log() and "Traceback" not in instance.log()
