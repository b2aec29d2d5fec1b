"""POST /v1/models/{model}/generate on the real decoder: the answer equals the engine's generation, step by step;
sampling repeats with its seed; the stream carries the same steps as events; the picture's rows are the new tokens;
/v1/batch's generate op; the limits (max_new_tokens with the lens counted, max_batch_new_tokens); every bad input a
422 problem with its pointer, an encoder a 422 naming its architecture."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from threadpoolctl import threadpool_limits

import attention
from service.operations import catalogue
from service.operations.generation import lens_factor
from service.settings import Limits
from tests.conftest import app_with, assert_problem
from tests.unit.operations.test_heatmap import cells, parse

MODEL = "smollm2-135m-instruct"
URL = f"/v1/models/{MODEL}/generate"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with threadpool_limits(1):
        yield


def generate(client, body: dict, url: str = URL) -> dict:
    response = client.post(url, json=body)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    return response.get_json()


def events(response) -> list[tuple[str, dict]]:
    """A text/event-stream body as (event, data) pairs."""
    found = []
    for block in response.get_data(as_text=True).split("\n\n"):
        if block:
            name, data = block.split("\n")
            found.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return found


def engine_run(body: dict, seed: int, **options) -> tuple[attention.Generation, list[attention.Step]]:
    decoder = catalogue.lookup(MODEL).pretrained
    ids = decoder.tokenizer.encode_chat(body["messages"]).ids
    generation = attention.Generation(decoder.llama, decoder.tokenizer, ids, attention.GenerationOptions(**options),
                                      attention.Sampler(attention.Sampling(body.get("temperature", 0.0)), seed))
    return generation, list(generation)


def test_the_answer_is_the_engines_generation_step_by_step(client):
    body = {"messages": QUESTION, "max_new_tokens": 16, "layers": [13, 2], "heads": [8], "top_logprobs": 3,
            "logit_lens": True}
    got = generate(client, body)
    generation, steps = engine_run(body, got["seed"], max_new_tokens=16, top_logprobs=3, layers=(2, 13), heads=(8,),
                                   logit_lens=True)
    assert got["text"] == generation.text == "The capital of France is Paris."
    assert got["finish_reason"] == "stop" and len(got["steps"]) == 8
    n = len(got["tokens"])
    assert got["usage"] == {"prompt_tokens": n, "completion_tokens": 8, "total_tokens": n + 8}
    assert got["tokens"][-4:] == ["<|im_start|>", "ass", "istant", "\n"] and len(got["token_ids"]) == n
    assert "".join(step["text"] for step in got["steps"]) == got["text"]
    tokenizer = catalogue.lookup(MODEL).pretrained.tokenizer
    for answer, step in zip(got["steps"], steps, strict=True):
        assert (answer["index"], answer["id"], answer["kept"]) == (step.index, step.token, 1)
        assert answer["token"] == tokenizer.tokenized([step.token]).tokens[0]
        assert bytes(answer["bytes"]) == step.bytes and answer["logprob"] == step.choice.logprob
        assert [c["id"] for c in answer["top"]] == step.choice.top.tolist()
        assert [c["drawn"] for c in answer["top"]] == [1.0, 0.0, 0.0]       # greedy: the chosen token alone
        assert [bytes(c["bytes"]) for c in answer["top"]] == [tokenizer.token_bytes(i) for i in step.choice.top]
        assert [a["layer"] for a in answer["attention"]] == [2, 13]
        for row, expected in zip(answer["attention"], step.attention, strict=True):
            assert row["heads"] == [8] and np.array_equal(np.float32(row["weights"]), expected)
            assert np.asarray(row["weights"]).shape == (1, n + step.index + 1)
        lens = answer["logit_lens"]
        assert [layer["after_layers"] for layer in lens] == list(range(31))
        assert [[t["id"] for t in layer["top"]] for layer in lens] == step.lens.ids.tolist()
    assert got["steps"][-1]["id"] == tokenizer.eos_id and got["steps"][-1]["text"] == ""


def test_a_seed_repeats_a_sampled_generation_and_none_reports_the_one_drawn(client):
    body = {"prompt": "Once upon a time", "max_new_tokens": 12, "temperature": 0.9, "top_k": 50, "top_p": 0.95}
    first = generate(client, {**body, "seed": 7})
    assert first["seed"] == 7 and generate(client, {**body, "seed": 7}) == first
    fresh = generate(client, body)
    assert generate(client, {**body, "seed": fresh["seed"]}) == fresh
    assert all(step["kept"] <= 50 for step in first["steps"])
    assert any(step["top"][0]["drawn"] < 1 for step in first["steps"])       # a real draw among several
    for step in first["steps"]:
        drawn = [c["drawn"] for c in step["top"]]
        assert all(0 <= p <= 1 for p in drawn) and sum(drawn) <= 1 + 1e-12


def test_a_stop_string_ends_the_text_before_it(client):
    got = generate(client, {"messages": QUESTION, "stop": ["Paris", "London"]})
    assert (got["text"], got["finish_reason"]) == ("The capital of France is ", "stop_sequence")
    got = generate(client, {"messages": QUESTION, "max_new_tokens": 3, "decimals": 2})
    assert (got["text"], got["finish_reason"], len(got["steps"])) == ("The capital of", "length", 3)
    assert got["steps"][0]["logprob"] == round(got["steps"][0]["logprob"], 2)


def test_the_stream_carries_the_answers_steps_then_the_rest(client):
    body = {"prompt": "The animal didn't cross the street because", "max_new_tokens": 6, "temperature": 0.7,
            "seed": 3, "layers": [5], "heads": [1, 2], "decimals": 4}
    response = client.post(URL, json={**body, "stream": True})
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    assert response.headers["X-Accel-Buffering"] == "no" and response.headers["Cache-Control"] == "no-cache"
    found = events(response)
    whole = generate(client, body)
    assert [name for name, _ in found] == ["prompt"] + ["token"] * 6 + ["done"]
    assert found[0][1] == {"tokens": whole["tokens"], "token_ids": whole["token_ids"]}  # before anything runs
    assert [data for _, data in found[1:-1]] == whole.pop("steps")
    assert found[-1][1] == whole


def test_an_error_midway_is_an_error_event(client, monkeypatch):
    step, calls = attention.Llama.step, []

    def failing(self, *args, **kwargs):  # the first step: the first token's event is sent before it
        calls.append(1)
        if len(calls) == 1:
            raise attention.AttentionError("X", "values overflow float32 in layer 3")
        return step(self, *args, **kwargs)

    monkeypatch.setattr(attention.Llama, "step", failing)
    response = client.post(URL, json={"prompt": "Once upon a time", "max_new_tokens": 4, "stream": True})
    found = events(response)
    assert [name for name, _ in found] == ["prompt", "token", "error"]
    assert found[-1][1]["status"] == 422 and "overflow" in found[-1][1]["detail"]


def test_the_picture_has_a_row_per_new_token_over_every_token_so_far(client):
    body = {"prompt": "Once upon a time", "max_new_tokens": 5, "layers": [13], "heads": [8, 0]}
    response = client.post(URL, json=body, headers={"Accept": "image/svg+xml"})
    assert response.status_code == 200 and response.mimetype == "image/svg+xml"
    found = cells(parse(response.get_data(as_text=True)))
    n, m = 4, 5
    assert len(found) == 2 * m * (n + m)
    later = np.tile(~np.tri(m, n + m, k=n, dtype=bool).ravel(), 2)           # keys after each new token: hatched
    assert [rect.get("class") == "cell masked" for rect in found] == later.tolist()
    steps = generate(client, body)["steps"]
    for h in range(2):
        for i, step in enumerate(steps):
            row = found[h * m * (n + m) + i * (n + m):][:n + i + 1]
            np.testing.assert_allclose([float(r.get("data-value")) for r in row], step["attention"][0]["weights"][h],
                                       rtol=1e-6)
    assert client.post(URL + "/heatmap", json=body).mimetype == "image/svg+xml"


def test_batch_items_generate_alone_and_a_bad_one_fails_alone(client):
    bodies = [{"model": MODEL, "messages": QUESTION, "max_new_tokens": 4},
              {"model": MODEL, "prompt": "Once upon a time", "max_new_tokens": 3, "temperature": 1.0, "seed": 5},
              {"model": MODEL, "prompt": "x", "top_p": 0},
              {"model": MODEL, "prompt": "x", "stream": True}]
    response = client.post("/v1/batch", json={"requests": [{"id": str(i), "op": "generate", "body": body}
                                                           for i, body in enumerate(bodies)]})
    answers = response.get_json()["responses"]
    assert [item["status"] for item in answers] == [200, 200, 422, 422]
    assert answers[2]["error"]["errors"][0]["pointer"] == "/requests/2/body/top_p"
    assert answers[3]["error"]["errors"][0]["pointer"] == "/requests/3/body/stream"
    for body, item in zip(bodies[:2], answers[:2], strict=True):
        single = {key: value for key, value in body.items() if key != "model"}
        assert item["body"] == generate(client, {**single, "seed": item["body"]["seed"]})


def test_a_batch_past_its_new_tokens_is_refused_naming_the_heaviest():
    client = app_with(limits=Limits(max_batch_new_tokens=100)).test_client()
    items = [{"id": "a", "op": "generate", "body": {"model": MODEL, "prompt": "x", "max_new_tokens": 60}},
             {"id": "b", "op": "generate", "body": {"model": MODEL, "prompt": "x", "max_new_tokens": 10,
                                                     "logit_lens": True}}]
    body = assert_problem(client.post("/v1/batch", json={"requests": items}), 413, "/requests/1", "/requests/0")
    lens = int(np.ceil(10 * (1 + lens_factor(catalogue.lookup(MODEL)))))
    assert body["limit"] == {"name": "max_batch_new_tokens", "maximum": 100, "value": 60 + lens}
    assert client.get("/v1/limits").get_json()["max_batch_new_tokens"] == 100


def test_the_lens_counts_as_its_compute_against_max_new_tokens(client):
    factor = 1 + lens_factor(catalogue.lookup(MODEL))
    assert 7 < factor < 8                                                   # 31 heads of 576 x 49,152 a step
    fits = int(256 / factor)
    assert generate(client, {"prompt": "x", "max_new_tokens": 1, "logit_lens": True})["steps"][0]["logit_lens"]
    body = assert_problem(client.post(URL, json={"prompt": "x", "max_new_tokens": fits + 1, "logit_lens": True}),
                          422, "/logit_lens")
    assert body["limit"]["name"] == "max_new_tokens" and f"as {factor:.2f}" in body["errors"][0]["detail"]
    assert_problem(client.post(URL, json={"prompt": "x", "max_new_tokens": 257, "logit_lens": True}), 422,
                   "/max_new_tokens", "/logit_lens")


@pytest.mark.parametrize(("body", "pointers"), [
    ({"prompt": ""}, ["/prompt"]),
    ({"prompt": "   "}, ["/prompt"]),
    ({}, ["/prompt"]),
    ({"prompt": "x", "messages": QUESTION}, ["/messages"]),
    ({"messages": [{"role": "tool", "content": "x"}]}, ["/messages/0/role"]),
    ({"messages": []}, ["/messages"]),
    ({"prompt": "x", "temperature": -0.5}, ["/temperature"]),
    ({"prompt": "x", "temperature": "1"}, ["/temperature"]),
    ({"prompt": "x", "top_p": 0}, ["/top_p"]),
    ({"prompt": "x", "top_p": 1.01}, ["/top_p"]),
    ({"prompt": "x", "top_k": -1}, ["/top_k"]),
    ({"prompt": "x", "top_k": 2.5}, ["/top_k"]),
    ({"prompt": "x", "max_new_tokens": 0}, ["/max_new_tokens"]),
    ({"prompt": "x", "max_new_tokens": 257}, ["/max_new_tokens"]),
    ({"prompt": "x", "stop": []}, ["/stop"]),
    ({"prompt": "x", "stop": [""]}, ["/stop/0"]),
    ({"prompt": "x", "stop": "."}, ["/stop"]),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, ["/stop"]),
    ({"prompt": "x", "top_logprobs": 21}, ["/top_logprobs"]),
    ({"prompt": "x", "seed": -1}, ["/seed"]),
    ({"prompt": "x", "layers": [30]}, ["/layers/0"]),
    ({"prompt": "x", "heads": [0, 9]}, ["/heads/1"]),
    ({"prompt": "x", "layers": [1, 1]}, ["/layers/1"]),
    ({"prompt": "x", "stream": "yes"}, ["/stream"]),
    ({"prompt": "x", "text": "y"}, ["/text"]),
])
def test_bad_input_is_a_422_naming_the_member(client, body, pointers):
    assert_problem(client.post(URL, json=body), 422, *pointers)


def test_what_the_model_or_the_limits_cannot_take_is_refused_before_computing(client):
    body = assert_problem(client.post("/v1/models/all-minilm-l6-v2/generate", json={"prompt": "x"}), 422, "/prompt")
    assert "BertModel" in body["detail"] and "does not generate" in body["detail"]
    assert_problem(client.post("/v1/models/nope/generate", json={"prompt": "x"}), 404)
    assert_problem(client.post(URL, json={"prompt": "x" * 10_001}), 422, "/prompt")
    rows = client.post(URL, json={"prompt": "x " * 500, "max_new_tokens": 256, "layers": list(range(30))})
    body = assert_problem(rows, 422, "/layers", "/heads", "/max_new_tokens")
    assert body["limit"]["name"] == "max_weight_elements"
    big = app_with(limits=Limits(max_new_tokens=9000)).test_client()
    body = assert_problem(big.post(URL, json={"prompt": "x", "max_new_tokens": 8192}), 422, "/max_new_tokens")
    assert body["limit"] == {"name": "max_positions", "maximum": 8192, "value": 8193}
    assert_problem(client.post(URL + "?format=svg", json={"prompt": "x", "stream": True}), 422, "/stream")
    assert_problem(client.post(URL + "?format=svg", json={"prompt": "x"}), 422, "format", "/layers", "/heads",
                   "/max_new_tokens")
