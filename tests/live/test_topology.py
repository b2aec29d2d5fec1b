"""The docker-compose topology without Docker: two real gunicorn instances behind Debian's nginx on loopback.

The instances run docker-compose.yml's api command and environment; nginx runs deploy/nginx.conf
with only ports and paths changed (tests/harness.py). Load is bounded in count and time.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import threading
from collections import Counter

import numpy as np
import pytest
import requests

from service.settings import Limits
from tests.harness import (
    Gunicorn,
    Nginx,
    compose_api_environment,
    post_in_flight,
    render_nginx_conf,
    requests_total,
    slow_encoder_body,
    wait_for,
)

MHA = "/v1/multi-head-attention"
BROKEN = "tests.live.broken_replica:app"
NDJSON = {"Content-Type": "application/x-ndjson"}


def demo5_body(rng: np.random.Generator) -> dict:
    """Demo-5 sized multi-head attention with fresh random embeddings."""
    return {"embeddings": rng.standard_normal((5, 8)).tolist(), "n_heads": 4, "causal": True}






# --- docker-compose.yml, Dockerfile and deploy/nginx.conf describe the topology the tests run ---------









@pytest.mark.needs_nginx
def test_nginx_accepts_the_rendered_config(tmp_path):
    conf = tmp_path / "nginx.conf"
    conf.write_text(render_nginx_conf(8081, ["127.0.0.1:8001", "127.0.0.1:8002"], tmp_path))
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    result = subprocess.run([binary, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr


# --- the running topology ------------------------------------------------------------------------------

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


@pytest.mark.needs_nginx
def test_killing_an_instance_mid_load_fails_no_request():
    with Gunicorn(compose=True) as first, Gunicorn(compose=True) as second, \
            Nginx([f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"]) as nginx:
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


@pytest.mark.needs_nginx
def test_sigterm_drains_in_flight_requests_and_new_ones_go_to_the_other_replica():
    rng = np.random.default_rng(7)
    with Gunicorn(compose=True) as first, Gunicorn(compose=True) as second, Nginx([f"127.0.0.1:{first.port}",
                                                           f"127.0.0.1:{second.port}"]) as nginx:
        slow = post_in_flight(first, "/v1/encoder", slow_encoder_body())
        first.terminate()
        after = [requests.post(f"{nginx.url}{MHA}", json=demo5_body(rng), timeout=10) for _ in range(20)]
        assert slow.result(timeout=30).status_code == 200
        assert np.shape(slow.result().json()["output"]) == (128, 512)
        assert [r.status_code for r in after] == [200] * 20
        assert first.process.wait(timeout=25) == 0  # a clean, graceful exit
        # The last requests all went to the other replica (a first one may race the signal and still
        # be answered by the draining instance: it completes too).
        wait_for(lambda: len(nginx.access_log()) >= 20, 5, "nginx's access log lines")
        upstreams = [line["upstream"].split(", ")[-1] for line in nginx.access_log()[-10:]]
        assert upstreams == [f"127.0.0.1:{second.port}"] * 10
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{first.url}/healthz", timeout=2)


@pytest.mark.needs_nginx
def test_nginx_answers_its_own_errors_as_problems(tmp_path):
    with Gunicorn(compose=True) as instance, Nginx([f"127.0.0.1:{instance.port}"]) as nginx:
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


@pytest.mark.needs_nginx
def test_only_the_compute_endpoints_repeat_a_post_on_another_replica():
    """A replica that read a POST and failed (502): nginx repeats it on the other replica for a computation, never
    for an upload or a batch, which would be stored or run twice (the API's answer there may be a 404 while the
    route is missing: nginx's choice is what is checked)."""
    posts = {"/v1/batches": {"json": {"input_file_id": "file-1", "endpoint": MHA, "completion_window": "24h"}},
             "/v1/files": {"data": b'{"custom_id": "a"}\n', "headers": NDJSON, "params": {"purpose": "batch"}},
             MHA: {"json": demo5_body(np.random.default_rng(3))}}
    with Gunicorn(app=BROKEN) as broken, Gunicorn(compose=True) as healthy:
        first, second = f"127.0.0.1:{broken.port}", f"127.0.0.1:{healthy.port}"
        for path, request in posts.items():
            # A fresh nginx per path: each of its workers' round robin starts at the broken replica, and only its start
            # (one /healthz) has moved one of them on, so of three POSTs at least one goes to the broken replica first.
            with Nginx([first, second]) as nginx:
                answers = [requests.post(f"{nginx.url}{path}", timeout=10, **request) for _ in range(3)]
                lines = wait_for(lambda: logged_posts(nginx, 3), 5, f"nginx's access log lines of {path}")
            tried = [line["upstream"].split(", ") for line in lines]
            assert first in [upstreams[0] for upstreams in tried], (path, tried)
            if path == MHA:
                assert [first, second] in tried and [answer.status_code for answer in answers] == [200] * 3
            else:
                assert all(len(upstreams) == 1 for upstreams in tried), (path, tried)
                assert all(line["status"] == 502 for line in lines if line["upstream"] == first), lines


def logged_posts(nginx: Nginx, count: int) -> list[dict] | None:
    """nginx's access log lines of POSTs once there are ``count`` (each is written after its response)."""
    lines = [line for line in nginx.access_log() if line["method"] == "POST"]
    return lines if len(lines) == count else None


def declared_only(url: str, path: str, length: int) -> tuple[int, dict]:
    """POST headers declaring a ``length``-byte body, and no body: nginx judges client_max_body_size on the header."""
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    try:
        connection.putrequest("POST", path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(length))
        connection.endheaders()
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


@pytest.mark.needs_nginx
def test_uploads_may_exceed_the_body_limit_up_to_the_file_limit_and_nothing_else_may():
    # compose's ATTENTION_MAX_FILE_BYTES: nginx's and the service's (tests/unit/test_deploy.py)
    limits = {"max_body_bytes": Limits().max_body_bytes,
              "max_file_bytes": int(compose_api_environment()["ATTENTION_MAX_FILE_BYTES"])}
    with Gunicorn(compose=True) as instance, Nginx([f"127.0.0.1:{instance.port}"]) as nginx:
        upload = requests.post(f"{nginx.url}/v1/files", params={"purpose": "batch"}, data=b"\n" * (17 * 2**20),
                               headers={**NDJSON, "X-Request-Id": "upload-17m"}, timeout=30)
        passed = wait_for(lambda: [line for line in nginx.access_log() if line["request_id"] == "upload-17m"], 5,
                          "the upload's access log line")
        # nginx sent it to the API, whatever the API answered (not nginx's 413)
        assert passed[0]["upstream"] == f"127.0.0.1:{instance.port}", (upload.status_code, passed)
        assert passed[0]["request_bytes"] > 17 * 2**20
        for path, limit in (("/v1/batches", "max_body_bytes"), (MHA, "max_body_bytes"),
                            ("/v1/files", "max_file_bytes")):
            status, problem = declared_only(nginx.url, path, limits[limit] + 1)
            assert (status, problem["status"]) == (413, 413), (path, problem)
            assert limit in problem["detail"], problem
        assert declared_only(nginx.url, "/v1/batches", 17 * 2**20)[0] == 413


def test_metrics_of_an_instance_sum_every_worker():
    with Gunicorn(workers=2, compose=True) as instance:
        for _ in range(30):
            requests.get(f"{instance.url}/v1/limits", timeout=5)
        assert len(instance.workers()) == 2
        wait_for(lambda: requests_total(instance, "/v1/limits") == 30, 10, "every worker's updates")
        scrapes = {requests_total(instance, "/v1/limits") for _ in range(6)}
        assert scrapes == {30.0}  # whichever worker answers the scrape, it reports the instance




def test_recycled_workers_fork_from_the_preloaded_app_and_keep_counting():
    body = {"tokens": ["the", "cat", "ate"], "d_model": 8, "n_heads": 4}
    env = {"GUNICORN_MAX_REQUESTS": "10", "GUNICORN_MAX_REQUESTS_JITTER": "1"}
    with Gunicorn(env, workers=1, compose=True) as instance:
        first = instance.workers()
        answers = [requests.post(f"{instance.url}/v1/multi-head-attention", json=body, timeout=10)
                   for _ in range(40)]
        assert [a.status_code for a in answers] == [200] * 40
        assert len({a.content for a in answers}) == 1                # every worker computes the same
        assert instance.workers() != first                           # recycled at least once
        assert requests_total(instance, "/v1/multi-head-attention") == 40.0   # dead workers' counts kept
        assert "Booting worker" in instance.log() and "Traceback" not in instance.log()
