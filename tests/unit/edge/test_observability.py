"""Request ids, the per-request JSON log line, app logs and /metrics (in-process; multiprocess in test_topology)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import orjson
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from service.edge.observability import JsonFormatter
from service.runtime import metrics
from service.runtime.logwriter import stdout_lines
from service.settings import Limits, Observability
from tests.conftest import ROOT, app_with, assert_problem

DEMO5 = {"tokens": ["the", "cat", "ate", "food", "it"], "d_model": 8, "n_heads": 4, "positional_encoding": True,
         "causal": True}


def scrape(client) -> dict[tuple[str, tuple], float]:
    """Every sample of GET /metrics by (name, sorted labels)."""
    response = client.get("/metrics")
    assert response.status_code == 200 and response.mimetype == "text/plain"
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.get_data(as_text=True))
            for sample in family.samples}


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def elements_sum() -> float:
    """The attention weights counted so far in this process."""
    return REGISTRY.get_sample_value("attention_weight_elements_per_request_sum")


def run_python(code: str, **env: str) -> list[str]:
    """The output lines of ``code`` run by a fresh interpreter in the repository, with only PATH and ``env`` set
    (the metrics' mode is chosen at import)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                          env={"PATH": os.environ.get("PATH", ""), **env}).stdout.splitlines()


def log_lines(capfd) -> list[dict]:
    stdout_lines().flush()  # request lines are written in batches (see test_logwriter)
    return [orjson.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("sent", ["abc", "A.b-c_9", "x" * 128])
def test_a_sane_request_id_is_echoed(client, sent):
    assert client.get("/healthz", headers={"X-Request-Id": sent}).headers["X-Request-Id"] == sent


@pytest.mark.parametrize("sent", [None, "", "x" * 129, "has space", "semi;colon", "ünï", "a\"b", "../../etc"])
def test_an_insane_or_missing_request_id_is_replaced(client, sent):
    headers = {} if sent is None else {"X-Request-Id": sent}
    got = client.get("/healthz", headers=headers).headers["X-Request-Id"]
    assert got != sent and re.fullmatch(r"[0-9a-f]{32}", got)


def test_generated_request_ids_differ(client):
    assert len({client.get("/healthz").headers["X-Request-Id"] for _ in range(20)}) == 20


@pytest.mark.parametrize(("method", "path", "send", "status"), [
    ("get", "/v1/nope", {}, 404),
    ("get", "/v1/attention", {}, 405),
    ("post", "/v1/attention", {"data": b"{", "content_type": "application/json"}, 400),
    ("post", "/v1/attention", {"data": b"{}", "content_type": "text/plain"}, 415),
    ("post", "/v1/attention", {"json": {"query": [[1.0]]}}, 422),
])
def test_every_problem_carries_the_request_id(client, method, path, send, status):
    response = getattr(client, method)(path, headers={"X-Request-Id": "trace-1"}, **send)
    body = assert_problem(response, status)
    assert body["request_id"] == response.headers["X-Request-Id"] == "trace-1"


def test_a_500_carries_the_request_id_in_body_log_and_header(app, capfd, monkeypatch):
    @app.get("/boom")
    def boom():
        raise RuntimeError("secret internals")

    log_lines(capfd)  # earlier tests' lines
    response = app.test_client().get("/boom", headers={"X-Request-Id": "r500"})
    body = assert_problem(response, 500)
    assert body["request_id"] == "r500" and "secret" not in body["detail"]
    [line] = [line for line in log_lines(capfd) if line["event"] == "request"]
    assert line["request_id"] == "r500" and line["status"] == 500


def test_one_json_line_per_request_with_route_status_duration_sizes_and_id(client, capfd):
    log_lines(capfd)  # earlier tests' lines
    response = client.post("/v1/multi-head-attention", json=DEMO5, headers={"X-Request-Id": "demo5"})
    client.get("/v1/demos/lookup")
    first, second = log_lines(capfd)
    assert first["request_id"] == "demo5" and first["status"] == 200 and first["method"] == "POST"
    assert first["route"] == first["path"] == "/v1/multi-head-attention"
    assert first["request_bytes"] == len(orjson.dumps(DEMO5))
    assert first["response_bytes"] == len(response.get_data()) > 0
    assert 0 < first["duration_ms"] < 10_000
    assert second["route"] == "/v1/demos/<string:name>" and second["path"] == "/v1/demos/lookup"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", first["time"])


def test_a_content_length_past_the_limit_is_recorded_as_the_limit_plus_one(client, capfd):
    """2^64 was a 500 on every route (orjson refused the integer, after the app's answer was ready), and any
    claimed size went into the request size metric as it was."""
    log_lines(capfd)  # earlier tests' lines
    before = scrape(client)
    response = client.get("/healthz", environ_overrides={"CONTENT_LENGTH": str(2**64)})
    assert response.status_code == 200
    [line] = [line for line in log_lines(capfd) if line["path"] == "/healthz"]
    assert line["status"] == 200 and line["request_bytes"] == Limits().max_body_bytes + 1
    assert value(scrape(client), "http_request_size_bytes_sum", route="/healthz") - value(
        before, "http_request_size_bytes_sum", route="/healthz") == Limits().max_body_bytes + 1
    small = app_with(limits=Limits(max_body_bytes=100)).test_client()
    small.get("/healthz", environ_overrides={"CONTENT_LENGTH": "5000"})   # the app's own limit, not the default
    assert [line["request_bytes"] for line in log_lines(capfd) if line["path"] == "/healthz"] == [101]


def test_request_lines_can_be_turned_off(capfd):
    client = app_with(observability=Observability(log_requests=False)).test_client()
    log_lines(capfd)
    client.get("/healthz")
    assert log_lines(capfd) == []


def test_app_log_lines_are_json_with_the_request_id(app):
    formatter = JsonFormatter()
    record = logging.LogRecord("service.x", logging.WARNING, __file__, 1, "odd %s", ("thing",), None)
    assert orjson.loads(formatter.format(record))["request_id"] is None
    written = []

    @app.get("/logs-something")
    def logs_something():
        written.append(orjson.loads(formatter.format(record)))
        return {}

    app.test_client().get("/logs-something", headers={"X-Request-Id": "in-ctx"})
    [line] = written
    assert line["request_id"] == "in-ctx" and line["message"] == "odd thing" and line["level"] == "warning"


def test_requests_are_counted_by_route_rule_method_and_status(client):
    before = scrape(client)
    for name in ("lookup", "scaling", "nope"):
        client.get(f"/v1/demos/{name}")
    client.get("/no/such/path/1")
    client.get("/no/such/path/2")
    client.open("/healthz", method="BREW")
    after = scrape(client)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("http_requests_total", route="/v1/demos/<string:name>", method="GET", status="200") == 2
    assert delta("http_requests_total", route="/v1/demos/<string:name>", method="GET", status="404") == 1
    assert delta("http_requests_total", route=metrics.UNMATCHED, method="GET", status="404") == 2
    assert delta("http_requests_total", route=metrics.UNMATCHED, method="other", status="405") == 1
    assert delta("http_request_duration_seconds_count", route="/v1/demos/<string:name>", method="GET") == 3
    assert not [key for key in after if "/no/such" in str(key)]  # raw paths never become labels


def test_sizes_elements_and_in_flight(client):
    before = scrape(client)
    response = client.post("/v1/multi-head-attention", json=DEMO5)
    client.post("/v1/encoder", json={"tokens": ["the", "cat"], "n_heads": 2, "n_layers": 3, "return_weights": False})
    client.post("/v1/multi-head-attention", json={**DEMO5, "n_heads": 99})  # refused: not computed
    after = scrape(client)
    route = "/v1/multi-head-attention"
    assert value(after, "http_request_size_bytes_sum", route=route) - value(
        before, "http_request_size_bytes_sum", route=route) == 2 * len(orjson.dumps(DEMO5)) + 1
    assert value(after, "http_response_size_bytes_count", route=route) - value(
        before, "http_response_size_bytes_count", route=route) == 2
    assert value(after, "http_response_size_bytes_sum", route=route) - value(
        before, "http_response_size_bytes_sum", route=route) > len(response.get_data())
    # 4 heads x 5 x 5, then 2 heads x 2 x 2 x 3 layers (weights computed even when not returned)
    assert value(after, "attention_weight_elements_per_request_sum") - value(
        before, "attention_weight_elements_per_request_sum") == 100 + 24
    assert value(after, "attention_weight_elements_per_request_count") - value(
        before, "attention_weight_elements_per_request_count") == 2
    assert value(after, "http_requests_in_flight") == 1  # the scrape itself


def test_batch_sizes_hook(client):
    before = scrape(client)
    metrics.observe_batch(3)
    after = scrape(client)
    assert value(after, "batch_items_count") - value(before, "batch_items_count") == 1
    assert value(after, "batch_items_sum") - value(before, "batch_items_sum") == 3


def test_documented_examples_are_not_counted_as_work(client):
    from service.edge.v1 import examples
    from service.operations.registry import OPERATIONS

    client.post("/v1/multi-head-attention", json=DEMO5)  # counted: the sum is live
    before = elements_sum()
    examples.answer(OPERATIONS["multi-head-attention"])
    assert elements_sum() == before


def test_a_batch_records_its_size_and_the_items_work(client):
    before = scrape(client)
    items = [{"id": str(i), "op": "multi-head-attention", "body": DEMO5} for i in range(3)]
    assert client.post("/v1/batch", json={"requests": items}).status_code == 200
    after = scrape(client)
    assert value(after, "batch_items_sum") - value(before, "batch_items_sum") == 3
    assert value(after, "attention_weight_elements_per_request_sum") - value(
        before, "attention_weight_elements_per_request_sum") == 300



def test_a_failed_stack_is_not_counted_on_top_of_its_items(client):
    """Two attention items of one shape, one whose scores overflow: the stacked call fails in the engine and
    each item is recomputed alone; only the work that answered counts (as for the two single requests)."""
    good = {"query": [[1.0]], "key": [[1.0], [0.0]], "value": [[1.0], [2.0]]}
    bad = {**good, "query": [[1e200]], "key": [[1e200], [0.0]]}
    singles_before = elements_sum()
    assert client.post("/v1/attention", json=good).status_code == 200
    assert client.post("/v1/attention", json=bad).status_code == 422
    singles = elements_sum() - singles_before
    before = elements_sum()
    items = [{"id": "good", "op": "attention", "body": good}, {"id": "bad", "op": "attention", "body": bad}]
    answer = client.post("/v1/batch", json={"requests": items}).get_json()
    assert [item["status"] for item in answer["responses"]] == [200, 422]
    assert elements_sum() - before == singles == 2  # the good item: 1 query x 2 keys


def test_a_request_refused_by_a_limit_or_the_engine_is_not_counted(client):
    """The metric counts requests that passed every limit and were computed: a multi-head request past
    max_output_elements (checked after the weights) and one whose numbers overflow are not."""
    narrow = app_with(limits=Limits(max_output_elements=8)).test_client()
    before = elements_sum()
    two_tokens = {"tokens": ["the", "cat"], "d_model": 8, "n_heads": 2}  # 2 x 8 numbers out, 8 weights
    assert narrow.post("/v1/multi-head-attention", json=two_tokens).json["limit"]["name"] == "max_output_elements"
    huge = {"embeddings": [[1e200] * 8] * 2, "n_heads": 2}
    assert client.post("/v1/multi-head-attention", json=huge).status_code == 422
    assert elements_sum() == before


def test_a_new_app_has_counted_no_work():
    code = ("from prometheus_client import REGISTRY; from service.edge import create_app; create_app(); "
            "print(REGISTRY.get_sample_value('attention_weight_elements_per_request_sum'), "
            "REGISTRY.get_sample_value('attention_weight_elements_per_request_count'))")
    assert run_python(code)[-1].split() == ["0.0", "0.0"]


def test_a_forked_child_writes_its_own_metrics_file_named_by_its_pid(tmp_path):
    code = ("import os\n"
            "from service.runtime import metrics\n"
            "metrics.ELEMENTS.observe(3)\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    metrics.ELEMENTS.observe(5)\n"
            "    os._exit(0)\n"
            "os.waitpid(child, 0)\n"
            "print(os.getpid(), child)\n"
            "print(metrics.exposition()[0].decode())\n")
    lines = run_python(code, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    parent, child = lines[0].split()
    assert {f"histogram_{parent}.db", f"histogram_{child}.db"} <= set(os.listdir(tmp_path))
    assert "attention_weight_elements_per_request_sum 8.0" in lines


def test_exited_workers_fold_into_one_file_per_kind_and_the_scrape_stays_the_same(tmp_path):
    code = ("import os, runpy\n"
            "conf = runpy.run_path('service/gunicorn.conf.py')\n"  # what the gunicorn master runs
            "from service.runtime import metrics\n"
            "metrics.ELEMENTS.observe(3)\n"
            "children = []\n"
            "for amount in (5, 7):\n"
            "    child = os.fork()\n"
            "    if child == 0:\n"
            "        metrics.ELEMENTS.observe(amount)\n"
            "        metrics.REQUESTS.labels('/v1/limits', 'GET', '200').inc()\n"
            "        os._exit(0)\n"
            "    os.waitpid(child, 0)\n"
            "    children.append(child)\n"
            "before = metrics.exposition()[0]\n"
            "conf['_hooks'].metrics.fold_exited_workers()\n"
            "after = metrics.exposition()[0]\n"
            "print(os.getpid(), *children)\n"
            "print(sorted(before.splitlines()) == sorted(after.splitlines()))\n"
            "print(after.decode())\n")
    lines = run_python(code, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    parent, *children = lines[0].split()
    assert lines[1] == "True"  # the same lines (their order follows the order files are listed in)
    assert "attention_weight_elements_per_request_sum 15.0" in lines
    assert 'http_requests_total{method="GET",route="/v1/limits",status="200"} 2.0' in lines
    left = {name for name in os.listdir(tmp_path) if name.startswith(("counter", "histogram"))}
    assert left == {f"histogram_{parent}.db", "counter_exited.db", "histogram_exited.db"}, children


def test_a_scrape_leaves_out_metrics_files_empty_or_removed_since_listed(tmp_path):
    """Empty: created, not yet sized (the live case is in test_gunicorn). Removed: a dead worker's live gauge."""
    (tmp_path / "histogram_1.db").touch()
    assert not metrics._has_bytes(str(tmp_path / "histogram_1.db"))
    assert not metrics._has_bytes(str(tmp_path / "gauge_livesum_2.db"))


def test_log_timestamps_are_datetimes_iso_format_in_utc():
    from datetime import UTC, datetime

    from service.edge.observability import _now

    before, stamp, after = datetime.now(UTC), _now(), datetime.now(UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", stamp)
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= datetime.fromisoformat(stamp) <= after


def test_the_method_label_is_upper_case_as_werkzeug_reads_it(client, capfd):
    log_lines(capfd)
    client.open("/healthz", method="get", headers={"X-Request-Id": "lower"})
    [line] = [line for line in log_lines(capfd) if line["request_id"] == "lower"]
    assert line["method"] == "GET" and line["route"] == "/healthz"


@pytest.mark.parametrize(("epoch", "stamp"), [(1764467190.8309999, "2025-11-30T01:46:30.831+00:00"),
                                              (1764467190.9999996, "2025-11-30T01:46:31.000+00:00"),
                                              (1764467190.0004, "2025-11-30T01:46:30.000+00:00")])
def test_log_timestamps_round_to_the_microsecond_first_as_datetime_does(monkeypatch, epoch, stamp):
    from datetime import UTC, datetime

    from service.edge import observability

    monkeypatch.setattr(observability.time, "time", lambda: epoch)
    assert observability._now() == stamp == datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def test_forked_workers_do_not_generate_the_same_request_ids():
    from service.edge.observability import fresh_id

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a worker forked from the same master: its generator must not replay the parent's
        os.write(write, fresh_id().encode())
        os._exit(0)
    os.waitpid(child, 0)
    theirs, ours = os.read(read, 64).decode(), fresh_id()
    os.close(read)
    os.close(write)
    assert re.fullmatch(r"[0-9a-f]{32}", theirs) and theirs != ours
