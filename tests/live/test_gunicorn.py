"""The real server: gunicorn with service/gunicorn.conf.py on a free loopback port, real HTTP."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from service.operations.catalogue import DEFAULTS
from tests.close import assert_text_close
from tests.conftest import ROOT
from tests.harness import Gunicorn, children, new_masters, requests_total, stop_master, wait_for
from tests.live.conftest import gunicorn_server


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """Base URL of a running gunicorn (2 workers, 4 KiB body limit, the default models: it serves openapi.yaml as
    it is); always stopped afterwards."""
    with gunicorn_server(WEB_CONCURRENCY="2", ATTENTION_MAX_BODY_BYTES="4096",
                         ATTENTION_MODELS=",".join(DEFAULTS)) as url:
        yield url


def test_multi_head_over_real_http(server, seed_script):
    tokens = ["the", "cat", "ate", "food", "it"]
    x = np.pad(seed_script.embed(tokens), ((0, 0), (0, 4))) + seed_script.positional_encoding(5, 8)
    _, heads = seed_script.MultiHeadAttention(8, 4)(x, mask=seed_script.causal_mask(5))
    response = requests.post(f"{server}/v1/multi-head-attention", timeout=10, json={
        "tokens": tokens, "d_model": 8, "n_heads": 4, "positional_encoding": True, "causal": True})
    assert response.headers["Content-Type"] == "application/json"
    np.testing.assert_allclose(response.json()["weights"], np.stack(heads), rtol=1e-12, atol=1e-15)


def test_an_answer_of_megabytes_arrives_whole_over_real_http(server, seed_script):
    """Past ONE_WRITE_MAX the headers and the body go in two sends (no joining copy): still one answer."""
    response = requests.get(f"{server}/v1/positional-encoding?n_positions=1024&d_model=512", timeout=30)
    assert len(response.content) > 1 << 20 and int(response.headers["Content-Length"]) == len(response.content)
    np.testing.assert_allclose(response.json()["encoding"], seed_script.positional_encoding(1024, 512), rtol=1e-12)


def test_limits_and_readiness_over_real_http(server):
    assert requests.get(f"{server}/v1/limits", timeout=10).json()["max_body_bytes"] == 4096
    assert requests.get(f"{server}/readyz", timeout=10).json() == {"status": "ready"}


def test_chunked_oversize_body_is_413_over_real_http(server):
    def chunks():  # a generator body is sent with Transfer-Encoding: chunked, no Content-Length
        yield b'{"query": [['
        for _ in range(2000):
            yield b"1.0, "
        yield b"1.0]]}"

    response = requests.post(f"{server}/v1/attention", data=chunks(), timeout=10,
                             headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.headers["Content-Type"] == "application/problem+json"
    assert "max_body_bytes" in response.json()["detail"]


def test_chunked_small_body_is_answered_over_real_http(server):
    def chunks():
        yield b'{"query": [[1.0]], "key": [[1.0]], '
        yield b'"value": [[6.0]]}'

    response = requests.post(f"{server}/v1/attention", data=chunks(), timeout=10,
                             headers={"Content-Type": "application/json"})
    assert response.json() == {"output": [[6.0]], "weights": [[1.0]]}


def test_errors_over_real_http(server):
    missing = requests.get(f"{server}/v1/missing", timeout=10)
    assert missing.status_code == 404 and missing.json()["status"] == 404
    spec = requests.get(f"{server}/openapi.yaml", timeout=10)
    assert_text_close(spec.text, (ROOT / "openapi.yaml").read_text())  # its examples: another machine's digits


def test_a_worker_gives_back_what_a_large_answer_took():
    """A ~100 MB answer (encoder traces) grew its worker by ~135 MB: the freed blocks below live ones stayed.
    After such an answer malloc_trim returns them, all but the kept top (GUNICORN_MALLOC_KEEP_MB, 64 MiB): it
    grows by ~90 MB. Growth, not the total, is asserted: the idle worker's size moves with imports and machine.
    (A single request's answer is bounded by max_output_elements far below that: a batch of two largest traces
    makes it.)"""
    words = (["the", "cat", "ate", "food", "it"] * 100)[:480]
    trace = {"tokens": words, "d_model": 512, "n_heads": 1, "n_layers": 1, "d_ff": 512, "trace": True,
             "return_weights": False}  # d_ff 512: the budget counts its hidden layer, the answer has none of it
    body = {"requests": [{"id": str(seed), "op": "encoder", "body": {**trace, "seed": seed}} for seed in (0, 1)]}
    # No trained model: its 86 MB of shared weights would count in every worker's RSS, and this is about the heap.
    with Gunicorn({"LOG_REQUESTS": "0", "ATTENTION_MODELS": ""}, compose=True) as instance:
        before = instance.rss_kib()
        response = requests.post(f"{instance.url}/v1/batch", json=body, timeout=60)
        assert response.status_code == 200 and len(response.content) > 90 << 20  # 97.6 MiB
        assert all(item["status"] == 200 for item in response.json()["responses"])
        after = instance.rss_kib()
    growth = max(after[pid] - before[pid] for pid in before)
    assert growth < (64 + 48) * 1024, (before, after)  # measured: 89-94 MiB; without the trim 136 MiB


def test_a_metrics_directory_the_operator_names_is_emptied_of_metrics_files_never_removed(tmp_path):
    (tmp_path / "keep.txt").write_text("the operator's")
    (tmp_path / "counter_999999.db").write_bytes(b"a dead instance's")
    with Gunicorn({"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "WEB_CONCURRENCY": "1"}) as server:
        assert not (tmp_path / "counter_999999.db").exists()  # would be summed into this instance's metrics
        assert requests.get(f"{server.url}/v1/limits", timeout=10).status_code == 200
        assert list(tmp_path.glob("*.db"))  # the worker's own
    assert (tmp_path / "keep.txt").read_text() == "the operator's"
    assert not list(tmp_path.glob("*.db"))


def test_a_metrics_file_still_empty_does_not_fail_the_scrape(tmp_path):
    """A worker creates its metrics file and only then sizes it: a scrape in that moment read 0 bytes and
    answered 500 (prometheus-client's issue #1199), and would for good had the worker been killed then."""
    with Gunicorn({"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "WEB_CONCURRENCY": "2"}) as server:
        for _ in range(3):
            assert requests.get(f"{server.url}/v1/limits", timeout=10).status_code == 200
        (tmp_path / "histogram_999999.db").touch()  # created, not yet sized, by a worker killed there
        for _ in range(4):  # whichever worker answers
            assert requests_total(server, "/v1/limits") == 3


def test_recycled_workers_leave_their_counts_not_their_files(tmp_path):
    """Each exited worker left two metrics files for good, and a scrape reads every file (~0.2 ms each)."""
    with Gunicorn({"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "WEB_CONCURRENCY": "2",
                   "GUNICORN_MAX_REQUESTS": "4", "GUNICORN_MAX_REQUESTS_JITTER": "0", "LOG_REQUESTS": "0"}) as server:
        for _ in range(40):  # about 10 workers recycled
            assert requests.get(f"{server.url}/v1/limits", timeout=10).status_code == 200
        counted = requests_total(server, "/v1/limits")
        files = sorted(path.name for path in tmp_path.glob("*.db"))
    assert counted == 40
    assert len([name for name in files if name.startswith("counter_")]) <= 3, files  # the exited + 2 live workers'
    assert len(files) <= 10, files


def _children(pid: int) -> list[int]:
    with contextlib.suppress(FileNotFoundError):  # gone
        return children(pid)
    return []


@pytest.mark.parametrize(("named", "reloaded", "kept"),
                         [(False, True, "new"), (True, False, "new"), (True, False, "old")],
                         ids=["own directory, reloaded first", "named directory", "named directory, rolled back"])
def test_an_upgrade_in_place_keeps_requests_and_metrics_working(tmp_path, named, reloaded, kept):
    """USR2 starts a second master; the operator then stops the old one (or, rolling back, the new one). The old master
    used to empty the metrics directory the new one used (a named one; or its own, which a SIGHUP had written into the
    environment the new master got) and to remove it at exit: from then on /metrics, and after a worker recycled every
    request, was a 500. A master stopped while the other runs must leave a named directory's files to it."""
    (tmp_path / "tmp").mkdir()
    env = {"WEB_CONCURRENCY": "2", "LOG_REQUESTS": "0", "TMPDIR": str(tmp_path / "tmp")}
    if named:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "metrics")
    with Gunicorn(env) as server:

        def answer(times: int) -> None:
            for _ in range(times):
                assert requests.get(f"{server.url}/v1/limits", timeout=10).status_code == 200

        answer(5)
        if reloaded:
            before = set(server.workers())
            os.kill(server.pid, signal.SIGHUP)
            wait_for(lambda: len(now := set(server.workers())) == 2 and not now & before, 30, "new workers")
        masters: list[int] = []
        try:
            os.kill(server.pid, signal.SIGUSR2)
            masters += wait_for(lambda: [pid for pid in new_masters(server.pid) if len(_children(pid)) == 2], 30,
                                "the new master and its workers")
            answer(5)  # both masters' workers accept now
            survivor = masters[0] if kept == "new" else server.pid
            stop_master(server.pid if kept == "new" else masters[0])
            answer(5)
            recycled = _children(survivor)
            for worker in recycled:  # as max_requests does: the new workers open their metrics files anew
                os.kill(worker, signal.SIGTERM)
            wait_for(lambda: len(now := set(_children(survivor))) == 2 and not now & set(recycled), 30, "new workers")
            answer(5)
            total = requests_total(server, "/v1/limits")
            assert total == 20 if named else total >= 10  # a named directory's counts go on, whichever master stays
        finally:  # never leave a new master serving the port, whatever failed
            for pid in {*masters, *new_masters(server.pid)}:
                stop_master(pid)
    assert list((tmp_path / "tmp").iterdir()) == []  # each master removed its own directory
    if named:
        assert list((tmp_path / "metrics").glob("*.db")) == []  # the last master out emptied it
