"""POST /v1/chat/completions: OpenAI's chat completions contract on the generate operation
(service.operations.chat translates). Every error of this route is the service's problem plus OpenAI's ``error``
object, with the status OpenAI's clients expect (an invalid request 400)."""

from __future__ import annotations

from typing import Any

from flask import Response
from werkzeug.exceptions import HTTPException

from attention.errors import AttentionError
from schemas.chat import ChatCompletion, ChatCompletionRequest
from service.edge.context import current_limits
from service.edge.errors import handle_unexpected, problem_response
from service.edge.examples import Computed
from service.edge.smorest import OPENAI_INVALID, Blueprint
from service.edge.v1 import events_doc, events_response, examples
from service.operations import chat
from service.operations.catalogue import ModelNotFound
from service.problems import Problem, attention_problem
from service.settings import Limits

blp = Blueprint("chat", __name__, url_prefix="/v1",
                description="OpenAI's chat completions: the decoder through any OpenAI client, `base_url` changed.")

RUN_OWN = {"id": "chatcmpl-2f0c5a8e9b7d41c3a6e1f0d2", "created": 1764900000}  # a run's own: fixed in the example


def _example() -> dict[str, Any] | None:
    """The real answer to the documented request (None when its model is not served), its id and time fixed."""
    try:
        found = chat.prepare(ChatCompletionRequest().load(examples.request("completions")), Limits())
    except ModelNotFound:
        return None
    return {**chat.compute(found), **RUN_OWN}


ANSWER = Computed(_example)


def _openai_problem(error: Exception) -> Response:
    """Any error of this route as a problem with OpenAI's ``error`` beside its members; a bug stays a 500."""
    if isinstance(error, AttentionError):
        error = attention_problem(error)
    elif not isinstance(error, HTTPException | Problem):
        return handle_unexpected(error)
    members = chat.problem(error)
    headers = {k: v for k, v in error.get_headers() if k.lower() != "content-type"}
    return problem_response(members.pop("status"), members.pop("title"), members.pop("detail"), members.pop("type"),
                            headers, **members)


blp.register_error_handler(Exception, _openai_problem)


@blp.route("/chat/completions", methods=["POST"])
@blp.arguments(ChatCompletionRequest, example=examples.request("completions"))
@blp.response(200, ChatCompletion, dump=False, example=ANSWER)
@blp.doc(**events_doc("With `stream: true`, server-sent `data:` lines: `chat.completion.chunk` objects (the role, "
                      "then a token each as it is computed, then the finish reason; with `include_usage` a last one "
                      "with `choices: []` and `usage`), then `data: [DONE]`; a failure midway is "
                      "`data: {\"error\": ...}`."))
@blp.alt_response(400, response=OPENAI_INVALID)  # not a 422: OpenAI's clients expect a 400
@blp.documents(404, 413, 415)
def chat_completions(body: dict[str, Any]) -> Any:
    """Create a chat completion (OpenAI's contract).

    The decoder answers the chat through the generate operation (the same engine run and limits); OpenAI's
    members as its clients read them. Refused with a 400 naming the parameter: n > 1, tools, response_format,
    logit_bias, non-zero penalties, an encoder. An unknown model is a 404 (`model_not_found`). Every error is
    a problem with OpenAI's `error` object beside its members. Extension: `attention: {"layers", "heads"}` adds
    each generated token's attention rows (`choices[].attention`).
    """
    found = chat.prepare(body, current_limits())
    if body.get("stream"):
        return events_response(chat.chunks(found))
    return chat.compute(found)
