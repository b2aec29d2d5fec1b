"""Streamed generation over real HTTP: gunicorn's sync workers, Debian's nginx in front. Events reach the client as
they are computed (through nginx too), a client that goes away stops the generation within two tokens, and a client
that stops reading cannot hold a worker: its writes time out and the same worker answers the next request.

Tokens are counted by the service's own metric (generated_tokens, summed over workers from /metrics)."""

from __future__ import annotations

import http.client
import socket
import time

import orjson
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Gunicorn, Nginx, nginx_available, wait_for

MODEL = "smollm2-135m-instruct"
PATH = f"/v1/models/{MODEL}/generate"
# Sampled, seeded: this prompt runs the whole budget here (checked in the done event where it is read).
STORY = {"prompt": "Once upon a time, in a small village by the sea,", "temperature": 0.8, "seed": 11}
WRITE_TIMEOUT = 5  # service.edge.v1.STREAM_WRITE_SECONDS


@pytest.fixture(scope="module")
def server():
    with Gunicorn({"ATTENTION_MODELS": MODEL, "LOG_REQUESTS": "0"}, workers=2) as instance:
        yield instance


def generated(instance) -> float:
    """Tokens generated so far, every worker's."""
    response = requests.get(f"{instance.url}/metrics", timeout=10)
    return sum(sample.value for family in text_string_to_metric_families(response.text) for sample in family.samples
               if sample.name == "generated_tokens_total" and sample.labels["model"] == MODEL)


def open_stream(url: str, body: dict, receive_buffer: int | None = None
                ) -> tuple[socket.socket, http.client.HTTPResponse]:
    """A streamed generate request on a socket of its own (a small receive buffer: a reader that falls behind)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    sock = connection.sock = socket.socket()  # the connection lets go of it once the answer says it closes
    if receive_buffer:  # before connecting: the window it advertises is sized from it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(60)
    sock.connect((host, int(port)))
    connection.request("POST", PATH, body=orjson.dumps({**body, "stream": True}),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
    return sock, response


def next_event(response: http.client.HTTPResponse) -> tuple[str, dict]:
    """The next server-sent event: its name and data."""
    name = response.readline().decode().strip().removeprefix("event: ")
    data = orjson.loads(response.readline().decode().removeprefix("data: "))
    assert response.readline() == b"\n"
    return name, data


def test_events_arrive_through_nginx_before_the_last_token_is_computed(server):
    if not nginx_available():
        pytest.skip("Debian's nginx is not installed (.ci/run installs it)")
    with Nginx([server.url.removeprefix("http://")]) as proxy:
        _, response = open_stream(proxy.url, {**STORY, "max_new_tokens": 120})
        assert next_event(response)[0] == "prompt"                        # its tokens, before any step
        name, first = next_event(response)
        assert name == "token" and first["index"] == 0
        before_done = generated(server)                                   # the first event is in hand
        names = [name] + [next_event(response)[0] for _ in range(120)]
        assert names == ["token"] * 120 + ["done"]
    assert before_done < 100, before_done  # not all 120 computed when the first arrived: nothing was held back


def test_a_client_that_goes_away_stops_the_generation_within_two_tokens(server):
    """Slow steps (the lens in float64 casts the output head 31 times a step: ~1 s each), so that reading the count
    just before the close misses no step: at most the one under way then, and two after."""
    sock, response = open_stream(server.url, {**STORY, "max_new_tokens": 30, "logit_lens": True, "dtype": "float64"})
    arrived = []
    assert next_event(response)[0] == "prompt"
    for _ in range(3):
        assert next_event(response)[0] == "token"
        arrived.append(time.monotonic())
    at_close = generated(server)
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    step = arrived[-1] - arrived[-2]
    settled = wait_for(lambda: _settled(server, 3 * step), 120, "the generation to stop")
    assert at_close < settled <= at_close + 1 + 2, (at_close, settled, step)  # the step under way, then two


def _settled(instance, window: float) -> float | None:
    """The count, once it has not moved for ``window`` seconds, longer than a step (None while it moves)."""
    first = generated(instance)
    time.sleep(window)
    return first if generated(instance) == first else None


def test_a_client_that_stops_reading_cannot_hold_the_worker():
    """One worker; a stream of large events (every head's row each step) to a client that reads nothing. Its
    writes block once the socket buffers are full, time out after WRITE_TIMEOUT s, and the same worker (not a
    replacement after gunicorn's 30 s timeout) answers the next request."""
    with Gunicorn({"ATTENTION_MODELS": MODEL, "LOG_REQUESTS": "0"}, workers=1) as instance:
        [worker] = instance.workers()
        body = {**STORY, "max_new_tokens": 110, "layers": list(range(30))}   # ~170 KB an event by the end
        sock, _ = open_stream(instance.url, body, receive_buffer=4096)
        started = time.monotonic()
        answered = requests.get(f"{instance.url}/v1/limits", timeout=60)
        waited = time.monotonic() - started
        assert answered.status_code == 200 and instance.workers() == [worker]
        assert waited < 25, waited                                         # freed, not killed at 30 s
        assert generated(instance) < 110                                   # and the generation stopped
        assert "Socket error processing request" in instance.log()         # gunicorn's word for the timeout
        sock.close()
