"""OpenAI's chat completions on the generate operation: POST /v1/chat/completions is a translation, not a second
generation. A request becomes the generate endpoint's params (service.operations.generation prepares, limits and
runs it, the same engine run); its answer and its steps become OpenAI's chat completion, its chunks and its
errors. What OpenAI's API offers and a local decoder does not do is refused plainly, naming the parameter.
"""

from __future__ import annotations

import hashlib
import http
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from marshmallow import ValidationError

from schemas.chat import DEFAULT_MAX_TOKENS, ChatCompletionRequest
from schemas.generation import GenerateRequest
from service.operations import catalogue, generation
from service.operations.catalogue import ModelNotFound, ServedModel
from service.operations.inputs import Prepared
from service.operations.jsontext import dumps
from service.problems import TYPE_BASE, Problem, ValidationProblem, invalid, pointer, problem_members
from service.runtime import metrics
from service.settings import Limits

UNSUPPORTED = TYPE_BASE + "unsupported-parameter"
GENERATE = GenerateRequest()
REQUEST = ChatCompletionRequest()
FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length"}  # generate's reasons -> OpenAI's
OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
                429: "rate_limit_error"}
# A value of these members that asks for nothing is accepted, as OpenAI's own clients may send it.
HARMLESS = {"tool_choice": ("none",), "function_call": ("none",), "response_format": ({"type": "text"},),
            "logit_bias": ({},), "tools": ([],), "functions": ([],)}
WHY = {"tools": "tool calls", "tool_choice": "tool calls", "functions": "function calls",
       "function_call": "function calls", "response_format": "response formats other than text",
       "logit_bias": "logit bias"}


class Unsupported(ValidationProblem):
    """400: the request asks for something OpenAI's API offers and this service does not do."""

    code = 400
    problem_type = UNSUPPORTED


@dataclass(frozen=True)
class ChatInput:
    """A chat request made ready: the generation prepared from it, and what its answer needs of the request."""

    generate: Prepared
    model: ServedModel
    logprobs: bool
    include_usage: bool


def refuse(body: dict[str, Any]) -> None:
    """A 400 naming the first member that asks for what this service does not do."""
    if (body.get("n") or 1) > 1:
        raise Unsupported.at(pointer("n"), "n must be 1: this service gives one choice per request.")
    for name, what in WHY.items():
        if name in body and body[name] is not None and body[name] not in HARMLESS[name]:
            raise Unsupported.at(pointer(name), f"{name} is not supported: this service does no {what}.")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name):
            raise Unsupported.at(pointer(name), f"{name} must be 0: this service applies no penalties.")


def generate_body(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The generate endpoint's body for a loaded chat request, and which chat members generate's stand for."""
    maximum = next((name for name in ("max_completion_tokens", "max_tokens") if body.get(name) is not None), None)
    chosen = body.get("attention") or {}
    found: dict[str, Any] = {
        "messages": [{"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]}
                     for m in body["messages"]],
        "max_new_tokens": body[maximum] if maximum else DEFAULT_MAX_TOKENS,
        "temperature": 1.0 if body.get("temperature") is None else body["temperature"],
        "top_p": 1.0 if body.get("top_p") is None else body["top_p"],
        "top_logprobs": (body.get("top_logprobs") or 0) if body.get("logprobs") else 0,
        "dtype": "float32",
        **{name: chosen[name] for name in ("layers", "heads") if name in chosen},
        **{name: body[name] for name in ("seed", "stop") if body.get(name) is not None}}
    renamed = {"max_new_tokens": maximum or "max_completion_tokens", "layers": "attention/layers",
               "heads": "attention/heads"}
    return found, renamed


def asked(body: Any) -> int:
    """The new tokens a chat request's body asks for, read before it is validated (see generation.asked)."""
    body = body if isinstance(body, dict) else {}
    counts = [body.get(name) for name in ("max_completion_tokens", "max_tokens")]
    return next((count for count in counts if type(count) is int and count > 0), DEFAULT_MAX_TOKENS)


def translated(body: dict[str, Any]) -> tuple[ServedModel, dict[str, Any], dict[str, str]]:
    """A loaded chat request as the generate endpoint's body, its model, and which chat members generate's stand
    for: refusals first, then the model (404 unknown, 400 an encoder)."""
    refuse(body)
    model = catalogue.lookup(body["model"])
    if not model.causal:
        raise Unsupported.at(pointer("model"), f"{model.name} is an encoder ({model.pretrained.architecture}): it "
                                               "does not generate. GET /v1/models lists the decoders (causal: true).")
    found, renamed = generate_body(body)
    return model, found, renamed


def prepare(body: dict[str, Any], limits: Limits) -> ChatInput:
    """A loaded chat request made ready: translated, then loaded and prepared by the generate operation (its
    schema, its limits), its errors pointing at the chat request's members."""
    model, found, renamed = translated(body)
    try:
        prepared = generation.prepare({**GENERATE.load(found), "model": model}, limits)
    except ValidationError as exc:
        raise renamed_problem(invalid(exc.messages), renamed) from None
    except ValidationProblem as exc:
        raise renamed_problem(exc, renamed) from None
    options = body.get("stream_options") or {}
    return ChatInput(prepared, model, bool(body.get("logprobs")), bool(options.get("include_usage")))


@dataclass(frozen=True)
class BatchItem:
    """A batch line's chat request translated: the generate op's /v1/batch body, and what its answer needs."""

    body: dict[str, Any]
    model: ServedModel
    logprobs: bool
    renamed: dict[str, str]


def batch_item(body: Any) -> BatchItem | Problem:
    """A batch line's body as a generate item, or the problem the endpoint would answer (a stream is refused: a
    batch's answers are written whole)."""
    try:
        loaded = REQUEST.load(body)
        if loaded.get("stream"):
            raise Unsupported.at(pointer("stream"), "A batch's answers are written whole: stream is not supported.")
        model, found, renamed = translated(loaded)
    except ValidationError as exc:
        return invalid(exc.messages)
    except Problem as exc:
        return exc
    return BatchItem({**found, "model": model.name}, model, bool(loaded.get("logprobs")), renamed)


def renamed_problem(problem: Problem, renamed: dict[str, str]) -> Problem:
    """``problem`` with its pointers into the generate body turned into pointers into the chat request (in its
    detail too, which names them when marshmallow refused the body)."""
    for error in problem.members.get("errors", []):
        if "pointer" in error:
            head, _, rest = error["pointer"][1:].partition("/")
            if head in renamed:
                chat_pointer = "/" + renamed[head] + ("/" + rest if rest else "")
                problem.description = problem.description.replace(error["pointer"] + ":", chat_pointer + ":")
                error["pointer"] = chat_pointer
    return problem


def fingerprint(model: ServedModel, dtype: str) -> str:
    """The same fingerprint, the same weights and precision: what OpenAI's ``system_fingerprint`` promises."""
    return "fp_" + hashlib.sha256(f"{model.name}|{model.source}|{dtype}".encode()).hexdigest()[:12]


def _head(model: ServedModel, kind: str) -> dict[str, Any]:
    """What every object of one answer shares: a fresh id, the time, the model, the fingerprint."""
    return {"id": "chatcmpl-" + secrets.token_hex(12), "object": kind, "created": int(time.time()),
            "model": model.name, "system_fingerprint": fingerprint(model, "float32")}


def _logprob(step: dict[str, Any]) -> dict[str, Any]:
    """A generate step as OpenAI's logprobs entry: the token, its log-probability, its bytes, the candidates."""
    return {"token": step["token"], "logprob": step["logprob"], "bytes": step["bytes"],
            "top_logprobs": [{"token": c["token"], "logprob": c["logprob"], "bytes": c["bytes"]}
                             for c in step["top"]]}


def _texts(model: ServedModel, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps that are text: the end-of-text token is how the answer ended, not a token of it (as OpenAI)."""
    eos = model.pretrained.tokenizer.eos_id
    return [step for step in steps if step["id"] != eos]


def _attention(step: dict[str, Any]) -> dict[str, Any]:
    return {"token": step["token"], "attention": step["attention"]}


def completion(model: ServedModel, answer: dict[str, Any], logprobs: bool) -> dict[str, Any]:
    """The generate operation's whole answer as OpenAI's chat completion (with the attention extension when its
    steps carry rows)."""
    steps = _texts(model, answer["steps"])
    choice: dict[str, Any] = {
        "index": 0, "message": {"role": "assistant", "content": answer["text"], "refusal": None},
        "logprobs": {"content": [_logprob(step) for step in steps], "refusal": None} if logprobs else None,
        "finish_reason": FINISH[answer["finish_reason"]]}
    if answer["steps"] and "attention" in answer["steps"][0]:
        choice["attention"] = {"tokens": answer["tokens"], "steps": [_attention(step) for step in answer["steps"]]}
    return {**_head(model, "chat.completion"), "choices": [choice], "usage": answer["usage"]}


def compute(found: ChatInput) -> dict[str, Any]:
    """The chat completion: the generate operation's whole answer, translated."""
    return completion(found.model, generation.compute(found.generate), found.logprobs)


def chunks(found: ChatInput) -> Iterator[bytes]:
    """The answer as OpenAI streams it: ``data:`` lines of ``chat.completion.chunk`` objects, the role first, a
    chunk per generated token as soon as it is computed, the finish reason, with ``include_usage`` a last chunk
    of usage alone, then ``data: [DONE]``; a failure midway is ``data: {"error": ...}`` (the status is sent).
    Closing the iterator (the client went away) stops the generation before its next step."""
    head = _head(found.model, "chat.completion.chunk")
    usage = {"usage": None} if found.include_usage else {}
    eos = found.model.pretrained.tokenizer.eos_id

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
        return _data({**head, "choices": [{"index": 0, "delta": delta, "logprobs": more.pop("logprobs", None),
                                           "finish_reason": finish, **more}], **usage})

    try:
        run, steps = generation.steps(found.generate)
        yield chunk({"role": "assistant", "content": ""})
        for step in steps:
            more: dict[str, Any] = {}
            if found.logprobs and step["id"] != eos:
                more["logprobs"] = {"content": [_logprob(step)], "refusal": None}
            if "attention" in step:
                more["attention"] = _attention(step)
            if step["text"] or more:
                yield chunk({"content": step["text"]}, **more)
        metrics.count_elements(found.generate.work.weights)
        yield chunk({}, FINISH[run.finish_reason])
        if found.include_usage:
            summary = generation.summary(found.generate, run)
            yield _data({**head, "choices": [], "usage": summary["usage"]})
    except Exception as exc:  # the status line is sent: a failure midway is a line with OpenAI's error
        yield _data({"error": openai_error(problem_members(generation.midway_problem(exc)))})
        return
    yield b"data: [DONE]\n\n"


def _data(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def param(where: str) -> str:
    """A JSON pointer as OpenAI names a parameter: ``/messages/0/content`` -> ``messages[0].content``."""
    name = ""
    for part in where.lstrip("/").split("/") if where else ():
        part = part.replace("~1", "/").replace("~0", "~")
        name += f"[{part}]" if part.isdigit() else ("." if name else "") + part
    return name


def status(problem: dict[str, Any]) -> int:
    """The status OpenAI's clients expect: an invalid request is a 400 (the service's own endpoints say 422)."""
    return 400 if problem["status"] == 422 else problem["status"]


def openai_error(problem: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``error`` object for a problem's members: message, type, param (the first error's), code."""
    errors = problem.get("errors") or [{}]
    where = errors[0].get("pointer") or errors[0].get("parameter")
    code = status(problem)
    kind = OPENAI_TYPES.get(code, "server_error" if code >= 500 else "invalid_request_error")
    named = {ModelNotFound.problem_type: "model_not_found", UNSUPPORTED: "unsupported_parameter"}
    reason = named.get(problem["type"]) or problem["type"].removeprefix(TYPE_BASE).replace("-", "_")
    return {"message": problem["detail"], "type": kind, "param": param(where) if where else None,
            "code": None if reason == "about:blank" else reason}


def problem(error: Problem | Exception) -> dict[str, Any]:
    """A problem's members as /v1/chat/completions answers them: the status OpenAI's clients expect, and OpenAI's
    ``error`` beside the problem's own members, so that both kinds of client read it."""
    members = problem_members(error)
    code = status(members)
    title = members["title"] if code == members["status"] else http.HTTPStatus(code).phrase
    return {**members, "status": code, "title": title, "error": openai_error(members)}
