"""POST /v1/chat/completions on the real decoder: the answer is the generate endpoint's run translated (text, finish
reason, usage, logprobs, the attention extension); the stream carries the same tokens as chunks; every refusal and
every invalid request a 400 problem with OpenAI's ``error`` naming the parameter, an unknown model a 404
``model_not_found``; GET /v1/models and /v1/models/{name} with OpenAI's members beside the service's."""

from __future__ import annotations

import orjson
import pytest
from threadpoolctl import threadpool_limits

from schemas.chat import DEFAULT_MAX_TOKENS
from service.operations import chat, generation
from service.settings import Access, Limits
from tests.conftest import app_with, assert_problem

MODEL = "smollm2-135m-instruct"
URL = "/v1/chat/completions"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GENERATE = f"/v1/models/{MODEL}/generate"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with threadpool_limits(1):
        yield


def complete(client, body: dict) -> dict:
    response = client.post(URL, json={"model": MODEL, "messages": QUESTION, **body})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    return response.get_json()


def generated(client, body: dict) -> dict:
    response = client.post(GENERATE, json={"messages": QUESTION, **body})
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def lines(response) -> list:
    """A stream's ``data:`` lines, each parsed (``[DONE]`` kept as the string)."""
    assert response.mimetype == "text/event-stream"
    found = []
    for block in response.get_data(as_text=True).split("\n\n"):
        if block:
            assert block.startswith("data: ") and "\n" not in block
            data = block.removeprefix("data: ")
            found.append(data if data == "[DONE]" else orjson.loads(data))
    return found


def openai_error(response, status: int, param: str | None, code: str | None, *pointers: str) -> dict:
    """The problem, with OpenAI's ``error`` beside its members."""
    body = assert_problem(response, status, *pointers)
    assert body["error"]["message"] == body["detail"]
    assert body["error"]["type"] == "invalid_request_error"
    assert (body["error"]["param"], body["error"]["code"]) == (param, code)
    return body


# --- the answer -------------------------------------------------------------------------------------------------

def test_the_answer_is_the_generate_endpoints_run_translated(client):
    got = complete(client, {"max_completion_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 7,
                            "logprobs": True, "top_logprobs": 3})
    same = generated(client, {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 7, "top_logprobs": 3})
    assert got["id"].startswith("chatcmpl-") and got["object"] == "chat.completion" and got["model"] == MODEL
    assert isinstance(got["created"], int) and got["system_fingerprint"].startswith("fp_")
    (choice,) = got["choices"]
    assert choice["message"] == {"role": "assistant", "content": same["text"], "refusal": None}
    assert choice["finish_reason"] == {"stop_sequence": "stop"}.get(same["finish_reason"], same["finish_reason"])
    assert got["usage"] == same["usage"]
    texts = [step for step in same["steps"] if step["token"] != "<|im_end|>"]  # the end of text is no token
    assert choice["logprobs"]["content"] == [
        {"token": s["token"], "logprob": s["logprob"], "bytes": s["bytes"],
         "top_logprobs": [{"token": c["token"], "logprob": c["logprob"], "bytes": c["bytes"]} for c in s["top"]]}
        for s in texts]
    assert "attention" not in choice


def test_greedy_ends_at_the_end_of_text_as_stop_and_a_stop_string_as_stop(client):
    done = complete(client, {"temperature": 0, "max_tokens": 12})
    assert done["choices"][0]["message"]["content"] == "The capital of France is Paris."
    assert done["choices"][0]["finish_reason"] == "stop" and done["choices"][0]["logprobs"] is None
    cut = complete(client, {"temperature": 0, "max_tokens": 12, "stop": " is"})
    assert (cut["choices"][0]["message"]["content"], cut["choices"][0]["finish_reason"]) == (
        "The capital of France", "stop")
    short = complete(client, {"temperature": 0, "max_completion_tokens": 2, "max_tokens": 9})  # the newer name wins
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 2


def test_the_defaults_are_openais_and_the_messages_are_read_as_the_template_reads_them():
    body, renamed = chat.generate_body({"messages": [
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "a\nb"}]})
    assert body == {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}],
                    "max_new_tokens": DEFAULT_MAX_TOKENS, "temperature": 1.0, "top_p": 1.0, "top_logprobs": 0,
                    "dtype": "float32"}
    assert renamed["max_new_tokens"] == "max_completion_tokens"
    body, renamed = chat.generate_body({"messages": [], "max_tokens": 5, "logprobs": True, "top_logprobs": 4,
                                        "attention": {"layers": [3]}, "seed": 2, "stop": ["x"]})
    assert body["max_new_tokens"] == 5 and renamed["max_new_tokens"] == "max_tokens"
    assert (body["top_logprobs"], body["layers"], body["seed"], body["stop"]) == (4, [3], 2, ["x"])


def test_content_parts_and_developer_are_the_same_chat_as_strings_and_system(client):
    parts = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in one word."}]
    one = complete(client, {"messages": [{"role": "developer", "content": parts}, *QUESTION], "temperature": 0,
                            "max_tokens": 6})
    other = complete(client, {"messages": [{"role": "system", "content": "You are terse.\nAnswer in one word."},
                                           *QUESTION], "temperature": 0, "max_tokens": 6})
    assert one["choices"] == other["choices"] and one["usage"] == other["usage"]


def test_the_attention_extension_is_each_generated_tokens_rows_as_generate_gives_them(client):
    got = complete(client, {"temperature": 0, "max_tokens": 4, "attention": {"layers": [11], "heads": [1, 0]}})
    same = generated(client, {"max_new_tokens": 4, "layers": [11], "heads": [0, 1]})
    attention = got["choices"][0]["attention"]
    assert attention["tokens"] == same["tokens"]
    assert attention["steps"] == [{"token": s["token"], "attention": s["attention"]} for s in same["steps"]]
    assert attention["steps"][0]["attention"][0]["heads"] == [0, 1]


# --- the stream -------------------------------------------------------------------------------------------------

def test_the_stream_is_the_same_tokens_as_chunks_then_usage_then_done(client):
    body = {"temperature": 0.9, "seed": 11, "max_tokens": 6, "logprobs": True}
    whole = complete(client, body)
    response = client.post(URL, json={"model": MODEL, "messages": QUESTION, **body, "stream": True,
                                      "stream_options": {"include_usage": True}})
    assert response.status_code == 200 and response.headers["X-Accel-Buffering"] == "no"
    *chunks, usage, done = lines(response)
    assert done == "[DONE]"
    assert usage["choices"] == [] and usage["usage"] == whole["usage"] and usage["object"] == "chat.completion.chunk"
    assert {c["id"] for c in [*chunks, usage]} == {usage["id"]} and all(c["usage"] is None for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    logprobs = [entry for c in chunks if (lp := c["choices"][0]["logprobs"]) for entry in lp["content"]]
    assert logprobs == whole["choices"][0]["logprobs"]["content"]


def test_without_include_usage_no_chunk_carries_usage(client):
    response = client.post(URL, json={"model": MODEL, "messages": QUESTION, "max_tokens": 2, "stream": True})
    *chunks, done = lines(response)
    assert done == "[DONE]" and all("usage" not in c and c["choices"] for c in chunks)


def test_a_failure_midway_is_an_error_line_and_no_done(client, monkeypatch):
    real = generation.steps

    def failing(prepared):
        run, steps = real(prepared)

        def broken():
            yield next(steps)
            raise RuntimeError("boom")

        return run, broken()

    monkeypatch.setattr(generation, "steps", failing)
    response = client.post(URL, json={"model": MODEL, "messages": QUESTION, "max_tokens": 4, "stream": True})
    assert response.status_code == 200
    found = lines(response)
    assert found[-1] == {"error": {"message": "The server failed to finish this generation; this is a bug.",
                                   "type": "server_error", "param": None, "code": None}}
    assert "[DONE]" not in found and len(found) == 3  # the role, one token, the error


# --- refusals and errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("member", "value"), [
    ("n", 2), ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "auto"),
    ("functions", [{"name": "f"}]), ("function_call", "auto"), ("response_format", {"type": "json_object"}),
    ("logit_bias", {"50256": -100}), ("presence_penalty", 0.5), ("frequency_penalty", -1.0),
])
def test_what_the_service_does_not_do_is_a_400_naming_the_parameter(client, member, value):
    response = client.post(URL, json={"model": MODEL, "messages": QUESTION, member: value})
    body = openai_error(response, 400, member, "unsupported_parameter", f"/{member}")
    assert body["type"] == chat.UNSUPPORTED and body["title"] == "Bad Request"


def test_values_that_ask_for_nothing_are_accepted(client):
    got = complete(client, {"n": 1, "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {},
                            "presence_penalty": 0, "frequency_penalty": 0.0, "tools": [], "max_tokens": 1,
                            "user": "u", "temperature": None, "stream_options": None})
    assert got["usage"]["completion_tokens"] == 1


def test_an_encoder_is_a_400_naming_the_model(client):
    response = client.post(URL, json={"model": "all-minilm-l6-v2", "messages": QUESTION})
    assert "encoder" in openai_error(response, 400, "model", "unsupported_parameter", "/model")["detail"]


def test_an_unknown_model_is_a_404_model_not_found(client):
    response = client.post(URL, json={"model": "gpt-4o", "messages": QUESTION})
    body = openai_error(response, 404, "model", "model_not_found", "model")
    assert body["known"] == ["all-minilm-l6-v2", MODEL]


@pytest.mark.parametrize(("body", "pointer", "param"), [
    ({"messages": QUESTION}, "/model", "model"),
    ({"model": MODEL}, "/messages", "messages"),
    ({"model": MODEL, "messages": []}, "/messages", "messages"),
    ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, "/messages/0/role", "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": " "}]}, "/messages/0/content", "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "/messages/0/content/0", "messages[0].content[0]"),
    ({"model": MODEL, "messages": [{"role": "user", "content": None}]}, "/messages/0/content", "messages[0].content"),
    ({"model": MODEL, "messages": QUESTION, "stop": ["a", "b", "c", "d", "e"]}, "/stop", "stop"),
    ({"model": MODEL, "messages": QUESTION, "stop": ["a", ""]}, "/stop/1", "stop[1]"),
    ({"model": MODEL, "messages": QUESTION, "top_logprobs": 21}, "/top_logprobs", "top_logprobs"),
    ({"model": MODEL, "messages": QUESTION, "temperature": 2.5}, "/temperature", "temperature"),
    ({"model": MODEL, "messages": QUESTION, "top_p": 0}, "/top_p", "top_p"),
    ({"model": MODEL, "messages": QUESTION, "max_tokens": 0}, "/max_tokens", "max_tokens"),
    ({"model": MODEL, "messages": QUESTION, "seed": -1}, "/seed", "seed"),
    ({"model": MODEL, "messages": QUESTION, "stream": "yes"}, "/stream", "stream"),
    ({"model": MODEL, "messages": QUESTION, "temprature": 1}, "/temprature", "temprature"),
    ({"model": MODEL, "messages": QUESTION, "attention": {"layers": [30]}}, "/attention/layers/0",
     "attention.layers[0]"),
    ({"model": MODEL, "messages": QUESTION, "attention": {"heads": [1, 1]}}, "/attention/heads/1",
     "attention.heads[1]"),
])
def test_an_invalid_request_is_a_400_naming_the_parameter(client, body, pointer, param):
    problem = openai_error(client.post(URL, json=body), 400, param, "validation", pointer)
    assert "/layers" not in problem["detail"].replace("/attention/layers", "")  # generate's names never show
    assert "/heads" not in problem["detail"].replace("/attention/heads", "")


def test_a_limit_is_a_400_naming_the_member_the_request_used(limits):
    client = app_with(limits=Limits(max_new_tokens=8)).test_client()
    for name in ("max_tokens", "max_completion_tokens"):
        response = client.post(URL, json={"model": MODEL, "messages": QUESTION, name: 9})
        body = openai_error(response, 400, name, "limit_exceeded", f"/{name}")
        assert body["limit"] == {"name": "max_new_tokens", "maximum": 8, "value": 9}
    response = client.post(URL, json={"model": MODEL, "messages": QUESTION})  # the default, 64, past 8
    openai_error(response, 400, "max_completion_tokens", "limit_exceeded", "/max_completion_tokens")


def test_a_body_that_is_not_json_is_a_400_and_another_media_type_a_415_both_with_openais_error(client):
    body = openai_error(client.post(URL, data=b"{not json", content_type="application/json"), 400, None,
                        "malformed_json")
    assert body["type"].endswith("malformed-json")
    response = client.post(URL, data=b"{}", content_type="text/plain")
    assert assert_problem(response, 415)["error"]["type"] == "invalid_request_error"


def test_a_missing_key_is_a_401_with_openais_authentication_error():
    locked = app_with(access=Access(api_keys=("k",))).test_client()
    response = locked.post(URL, json={"model": MODEL, "messages": QUESTION})
    body = assert_problem(response, 401)
    assert body["error"]["type"] == "authentication_error" and body["error"]["message"] == body["detail"]
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


# --- the models, as OpenAI's clients read them ------------------------------------------------------------------

def test_the_models_carry_openais_members_beside_the_services(client):
    listing = client.get("/v1/models").get_json()
    assert [card["name"] for card in listing["models"]] == ["all-minilm-l6-v2", MODEL]
    assert listing["object"] == "list"
    assert listing["data"] == [{"id": name, "object": "model", "created": 0, "owned_by": "attention-service"}
                               for name in ("all-minilm-l6-v2", MODEL)]
    one = client.get(f"/v1/models/{MODEL}").get_json()
    assert {key: one[key] for key in ("id", "object", "created", "owned_by")} == listing["data"][1]
    assert {key: value for key, value in one.items() if key not in listing["data"][1]} == listing["models"][1]
