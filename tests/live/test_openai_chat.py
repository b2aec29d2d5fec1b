"""The decoder through the official ``openai`` package, with only its ``base_url`` changed, against a real gunicorn:
plain and streamed chat completions (equal to the generate endpoint's run with the same seed), logprobs, the
attention extension through ``extra_body``, every refusal and an invalid request as the client's own exceptions,
the models as ``models.list()`` and ``models.retrieve()`` read them, and a batch of chat lines from upload to
output, whose answers equal the direct calls'."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
import requests
from openai import OpenAI
from openai.types.chat import ChatCompletion

from tests.harness import Gunicorn
from tests.live.jobs import Worker, queue_env, request_line, results

MODEL = "smollm2-135m-instruct"
ENCODER = "all-minilm-l6-v2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """gunicorn (the encoder served too, to be refused) and a batch jobs' worker beside it."""
    env = queue_env(tmp_path_factory.mktemp("openai-chat"), ATTENTION_MODELS=f"{ENCODER},{MODEL}", LOG_REQUESTS="0")
    with Worker(env) as worker, Gunicorn(env, workers=2) as instance:
        worker.ready()
        yield instance.url


@pytest.fixture
def client(server: str) -> OpenAI:
    return OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def generated(server: str, body: dict) -> dict:
    """The generate endpoint's answer to the same chat, over HTTP."""
    response = requests.post(f"{server}/v1/models/{MODEL}/generate", json={"messages": QUESTION, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_chat_completion_is_the_generate_endpoints_run(client, server):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0.7, seed=5,
                                            max_completion_tokens=12)
    same = generated(server, {"temperature": 0.7, "seed": 5, "max_new_tokens": 12})
    assert answer.id.startswith("chatcmpl-") and answer.object == "chat.completion" and answer.model == MODEL
    assert answer.system_fingerprint.startswith("fp_") and answer.created > 1_700_000_000
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.message.content == same["text"]
    assert choice.finish_reason == ("length" if same["finish_reason"] == "length" else "stop")
    assert answer.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}) == same["usage"]
    greedy = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16)
    assert (greedy.choices[0].message.content, greedy.choices[0].finish_reason) == (
        "The capital of France is Paris.", "stop")


def test_a_streamed_completion_is_the_same_answer_in_chunks(client):
    options = {"model": MODEL, "messages": QUESTION, "temperature": 0.9, "seed": 3, "max_completion_tokens": 10}
    whole = client.chat.completions.create(**options)
    chunks = list(client.chat.completions.create(**options, stream=True, stream_options={"include_usage": True}))
    *tokens, last = chunks
    assert all(chunk.object == "chat.completion.chunk" and chunk.id == last.id for chunk in chunks)
    assert tokens[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in tokens) == whole.choices[0].message.content
    assert tokens[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(chunk.usage is None for chunk in tokens)
    assert last.choices == [] and last.usage == whole.usage


def test_logprobs_are_each_tokens_with_its_most_likely_rivals(client, server):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16,
                                            logprobs=True, top_logprobs=3)
    content = answer.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == answer.choices[0].message.content
    same = generated(server, {"max_new_tokens": 16, "top_logprobs": 3})["steps"]
    for entry, step in zip(content, same, strict=False):
        assert (entry.token, entry.logprob, entry.bytes) == (step["token"], step["logprob"], step["bytes"])
        assert [(top.token, top.logprob) for top in entry.top_logprobs] == [
            (c["token"], c["logprob"]) for c in step["top"]]
    assert len(content) == len(same) - 1  # the end-of-text token is how it ended, not a token of the answer


def test_the_attention_extension_through_extra_body(client, server):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=4,
                                            extra_body={"attention": {"layers": [11], "heads": [1]}})
    attention = answer.choices[0].model_extra["attention"]
    same = generated(server, {"max_new_tokens": 4, "layers": [11], "heads": [1]})
    assert attention["tokens"] == same["tokens"]
    assert [step["attention"] for step in attention["steps"]] == [step["attention"] for step in same["steps"]]
    previous = [step["attention"][0]["weights"][0][-2] for step in attention["steps"][1:]]
    assert min(previous) > 0.5  # layer 11, head 1 is a previous-token head (docs/generation.md)


@pytest.mark.parametrize(("param", "options"), [
    ("n", {"n": 2}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("logit_bias", {"logit_bias": {"504": 10}}),
    ("presence_penalty", {"presence_penalty": 0.5}),
    ("frequency_penalty", {"frequency_penalty": 0.5}),
])
def test_what_it_does_not_do_is_the_clients_bad_request_naming_the_parameter(client, param, options):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=QUESTION, **options)
    assert refused.value.status_code == 400
    assert (refused.value.param, refused.value.code, refused.value.type) == (
        param, "unsupported_parameter", "invalid_request_error")
    assert refused.value.body["message"] in str(refused.value)


def test_an_encoder_an_unknown_model_and_an_invalid_request(client):
    with pytest.raises(openai.BadRequestError) as encoder:
        client.chat.completions.create(model=ENCODER, messages=QUESTION)
    assert (encoder.value.param, encoder.value.code) == ("model", "unsupported_parameter")
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert (unknown.value.status_code, unknown.value.code, unknown.value.param) == (404, "model_not_found", "model")
    with pytest.raises(openai.BadRequestError) as invalid:
        client.chat.completions.create(model=MODEL, messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}])
    assert invalid.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as limit:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_completion_tokens=100_000)
    assert limit.value.param == "max_completion_tokens"


def test_the_models_as_the_client_lists_and_retrieves_them(client, server):
    listed = client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in listed.data] == [
        (ENCODER, "model", "attention-service"), (MODEL, "model", "attention-service")]
    one = client.models.retrieve(MODEL)
    assert (one.id, one.object, one.created, one.owned_by) == (MODEL, "model", 0, "attention-service")
    assert one.model_extra["architecture"] == "LlamaForCausalLM"  # the service's card, beside OpenAI's members
    assert requests.get(f"{server}/v1/models", timeout=10).json()["models"][1]["name"] == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_a_batch_of_chat_lines_answers_as_the_direct_calls(client, server, tmp_path):
    bodies = {
        "greedy": {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 12},
        "seeded": {"model": MODEL, "messages": [{"role": "user", "content": "Write a word."}], "seed": 9,
                   "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 2},
        "system": {"model": MODEL, "messages": [{"role": "developer", "content": "Answer in French."}, *QUESTION],
                   "seed": 1, "temperature": 0.5, "max_tokens": 10},
        "refused": {"model": MODEL, "messages": QUESTION, "n": 2},
    }
    (path := tmp_path / "chat.jsonl").write_bytes(b"".join(request_line(custom_id, body, "/v1/chat/completions")
                                                           for custom_id, body in bodies.items()))
    with path.open("rb") as file:
        uploaded = client.files.create(file=file, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert client.files.content(batch.output_file_id).content.count(b"\n") == 3
    output, errors = results(server, batch.model_dump(), bodies)
    for custom_id, line in output.items():
        direct = client.chat.completions.create(**bodies[custom_id])
        got = line["response"]["body"]
        assert got["id"].startswith("chatcmpl-") and got["id"] != direct.id
        # the answer as the client reads it, equal but for the id and the time, which are each answer's own
        assert ChatCompletion.model_validate({**got, "id": direct.id, "created": direct.created}) == direct, custom_id
    refused = errors["refused"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["param"] == "n"
