"""Batch jobs of OpenAI's chat lines (/v1/chat/completions) and of the generate endpoint: the file is cut into chunks
within max_batch_new_tokens, each line answered as POST /v1/chat/completions answers it (a refused one with the
400 problem and OpenAI's error object)."""

from __future__ import annotations

import orjson
import pytest

from service.jobs import batches, keys, validation
from service.operations import catalogue, chat, generation
from service.operations.jsontext import dumps
from service.settings import Limits
from tests.unit.jobs.conftest import drain, request_line, results, submit

MODEL = "smollm2-135m-instruct"
CHAT = "/v1/chat/completions"
GENERATE = f"/v1/models/{MODEL}/generate"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def backend():
    return None  # SQLite


def chunk_counts(jobs, content: bytes, endpoint: str) -> list[int]:
    batch_id = submit(jobs, content, endpoint)
    validation.validate(jobs, batch_id)
    assert batches.get(jobs, "", batch_id)["status"] == "in_progress"
    return [count for _, _, _, count in jobs.store.get(keys.event(batch_id, "validated"))["chunks"]]


def test_a_chunk_of_chat_lines_asks_for_at_most_max_batch_new_tokens(make_jobs):
    jobs = make_jobs(chunk_items=256, limits=Limits(max_batch_new_tokens=20))
    asked = [{"max_tokens": 8}, {"max_completion_tokens": 8}, {"max_tokens": 8}, {}, {"max_tokens": "x"}, {"n": 1}]
    content = b"\n".join(request_line(f"c{i}", {"model": MODEL, "messages": QUESTION, **more}, CHAT)
                         for i, more in enumerate(asked))
    # 8 + 8; 8; the default 64 alone (one line past the budget runs alone); a refused value counts as the default
    assert chunk_counts(jobs, content, CHAT) == [2, 1, 1, 1, 1]


def test_a_chunk_of_generate_lines_counts_the_logit_lens_as_the_endpoint_does(make_jobs):
    jobs = make_jobs(chunk_items=256, limits=Limits(max_batch_new_tokens=40))
    asked = [{"max_new_tokens": 10}, {"max_new_tokens": 10}, {"max_new_tokens": 4, "logit_lens": True},
             {"max_new_tokens": 20}, {"max_new_tokens": 20}]
    content = b"\n".join(request_line(f"g{i}", {"messages": QUESTION, **more}, GENERATE)
                         for i, more in enumerate(asked))
    lens = generation.new_tokens(catalogue.lookup(MODEL), {"max_new_tokens": 4, "logit_lens": True})
    assert lens == 31  # 4 steps with the lens count ceil(4 x 7.53), as max_new_tokens counts them
    assert chunk_counts(jobs, content, GENERATE) == [2, 1, 2]  # 10 + 10; 31 (+ 20 > 40); 20 + 20
    assert chat.asked({"max_tokens": 3, "max_completion_tokens": 5}) == 5  # the newer name wins, as answered


def test_other_endpoints_are_cut_as_before(make_jobs):
    jobs = make_jobs(chunk_items=256, limits=Limits(max_batch_new_tokens=1))
    body = {"tokens": ["the", "cat"], "d_model": 4, "n_heads": 2}
    content = b"\n".join(request_line(f"r{i}", body) for i in range(5))
    assert chunk_counts(jobs, content, "/v1/multi-head-attention") == [5]


def test_chat_lines_are_answered_as_the_endpoint_answers_them(make_jobs):
    jobs = make_jobs(chunk_items=2)
    bodies = {
        "greedy": {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 12},
        "seeded": {"model": MODEL, "messages": QUESTION, "seed": 4, "max_completion_tokens": 6, "logprobs": True,
                   "top_logprobs": 2, "attention": {"layers": [11], "heads": [1]}},
        "two": {"model": MODEL, "messages": QUESTION, "n": 2},
        "streamed": {"model": MODEL, "messages": QUESTION, "stream": True},
        "long": {"model": MODEL, "messages": QUESTION, "max_tokens": 10_000},
        "unknown": {"model": "gpt-4o", "messages": QUESTION},
        "bad": {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
    }
    content = b"\n".join(request_line(name, body, CHAT) for name, body in bodies.items())
    batch_id = submit(jobs, content, CHAT)
    drain(jobs)
    batch = batches.get(jobs, "", batch_id)
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 7, "completed": 2, "failed": 5}
    lines = results(jobs, batch)
    for name in ("greedy", "seeded"):
        response = lines[name]["response"]
        assert response["status_code"] == 200
        direct = orjson.loads(dumps(chat.compute(chat.prepare(chat.REQUEST.load(bodies[name]), Limits()))))
        got = response["body"]
        assert got["id"].startswith("chatcmpl-") and got["id"] != direct["id"]
        assert {**got, "id": direct["id"], "created": direct["created"]} == direct
    assert lines["greedy"]["response"]["body"]["choices"][0]["message"]["content"] == "The capital of France is Paris."
    expected = {"two": (400, "n", "unsupported_parameter"), "streamed": (400, "stream", "unsupported_parameter"),
                "long": (400, "max_tokens", "validation"), "unknown": (404, "model", "model_not_found"),
                "bad": (400, "messages[0].role", "validation")}
    for name, (status, param, code) in expected.items():
        response = lines[name]["response"]
        error = response["body"]["error"]
        assert (response["status_code"], response["body"]["status"], error["param"], error["code"]) == (
            status, status, param, code), response
        assert error["message"] == response["body"]["detail"]
