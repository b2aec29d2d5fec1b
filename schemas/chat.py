"""OpenAI's chat completions contract: POST /v1/chat/completions, its answer, its streamed chunks, and the models
list as OpenAI's clients read it. What the service does not do (n > 1, tools, response formats, logit bias,
penalties) is declared here so that the spec shows it; the operation (service.operations.chat) refuses it."""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate

from schemas.base import Schema
from schemas.fields import MAX_SEED, BoundedList, StrictFloat, strict_bool, strict_int
from schemas.generation import MAX_STOP_CHARS, MAX_STOPS, MAX_TOP_LOGPROBS, StepAttention, Usage
from schemas.pretrained import MAX_MESSAGES, indices

ROLES = ("system", "developer", "user", "assistant")  # developer: OpenAI's newer name for system
FINISH_REASONS = ("stop", "length")
DEFAULT_MAX_TOKENS = 64  # OpenAI's default is the model's whole context; this service's gunicorn times out at 30 s


class TextContent(fields.Field):
    """A message's content: a string, or an array of text parts ``{"type": "text", "text": ...}`` (joined with a
    newline, as vLLM joins them); loaded as the one string the chat template reads."""

    def __init__(self, **kwargs: Any) -> None:
        part = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
                "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
        kwargs["metadata"] = {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": part}],
                              **kwargs.get("metadata", {})}
        super().__init__(**kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        if isinstance(value, list) and value:
            for i, part in enumerate(value):
                if not (isinstance(part, dict) and part.keys() == {"type", "text"} and part["type"] == "text"
                        and isinstance(part["text"], str)):
                    raise ValidationError({i: ['A content part here is {"type": "text", "text": "..."}: this '
                                               "model reads text only."]})
            value = "\n".join(part["text"] for part in value)
        if not isinstance(value, str):
            raise ValidationError("A string, or a non-empty array of text parts.")
        if not value.strip():
            raise ValidationError("Must hold something other than whitespace.")
        return value


class Stop(fields.Field):
    """``stop``: one string or up to MAX_STOPS, loaded as a list."""

    def __init__(self, **kwargs: Any) -> None:
        one = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
        kwargs["metadata"] = {"oneOf": [one, {"type": "array", "items": one, "minItems": 1, "maxItems": MAX_STOPS}],
                              **kwargs.get("metadata", {})}
        super().__init__(allow_none=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> list[str]:
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOPS:
            raise ValidationError(f"A string, or 1 to {MAX_STOPS} strings.")
        for i, stop in enumerate(stops):
            if not isinstance(stop, str) or not 1 <= len(stop) <= MAX_STOP_CHARS:
                raise ValidationError({i: [f"A string of 1 to {MAX_STOP_CHARS} characters."]})
        return stops


class ChatMessage(Schema):
    """One message: ``developer`` is read as ``system`` (the chat template knows system, user and assistant)."""

    role = fields.String(required=True, validate=validate.OneOf(ROLES))
    content = TextContent(required=True)
    name = fields.String(metadata={"description": "Accepted and not read (the chat template has no names)."})


class StreamOptions(Schema):
    include_usage = strict_bool(load_default=False, metadata={
        "description": "A last chunk with `choices: []` and `usage`; the others carry `usage: null`."})


class AttentionSelection(Schema):
    """The extension: which layers and heads each generated token's attention row is returned for."""

    layers = indices("layers")
    heads = indices("heads")


class ChatCompletionRequest(Schema):
    """OpenAI's chat completion request, as far as a local decoder answers it."""

    model = fields.String(required=True, metadata={"description": "A served decoder's name (GET /v1/models)."})
    messages = BoundedList(fields.Nested(ChatMessage), required=True, validate=validate.Length(1, MAX_MESSAGES))
    max_completion_tokens = strict_int(1, allow_none=True, metadata={
        "description": f"Tokens to generate at most (default {DEFAULT_MAX_TOKENS}); at most max_new_tokens "
                       "(GET /v1/limits)."})
    max_tokens = strict_int(1, allow_none=True, metadata={
        "description": "The older name of max_completion_tokens (which wins when both are given)."})
    temperature = StrictFloat(allow_none=True, validate=validate.Range(0, 2), metadata={
        "description": "Default 1, as OpenAI's (the generate endpoint's default is 0, greedy). 0: greedy."})
    top_p = StrictFloat(allow_none=True, validate=validate.Range(0, 1, min_inclusive=False), metadata={
        "description": "Default 1."})
    seed = strict_int(0, MAX_SEED, allow_none=True, metadata={
        "description": "The draw's seed: the same seed, machine and model give the same answer."})
    stop = Stop(metadata={"description": f"A string or up to {MAX_STOPS}: the text ends before the first one."})
    logprobs = strict_bool(allow_none=True, load_default=False, metadata={
        "description": "Each token's log-probability in `choices[].logprobs.content`."})
    top_logprobs = strict_int(0, MAX_TOP_LOGPROBS, allow_none=True, metadata={
        "description": "With logprobs: the most likely tokens at each position (0 to 20)."})
    n = strict_int(1, allow_none=True, metadata={"description": "1 only: this service gives one choice."})
    stream = strict_bool(allow_none=True, load_default=False, metadata={
        "description": "Server-sent `chat.completion.chunk` objects, a token each, then `data: [DONE]`."})
    stream_options = fields.Nested(StreamOptions, allow_none=True)
    user = fields.String(metadata={"description": "Accepted and not read."})
    attention = fields.Nested(AttentionSelection, metadata={
        "description": "Extension: each generated token's attention row over every token so far in the selected "
                       "layers and heads (the other defaults to all), in `choices[].attention`."})
    # Declared so that a client sees them; a value that asks for something this service does not do is a 400.
    tools = fields.Raw(metadata={"description": "Refused: no tool calls."})
    tool_choice = fields.Raw(metadata={"description": "Refused (`none` accepted): no tool calls."})
    functions = fields.Raw(metadata={"description": "Refused: no function calls."})
    function_call = fields.Raw(metadata={"description": "Refused (`none` accepted): no function calls."})
    response_format = fields.Raw(metadata={"description": "Refused (`{\"type\": \"text\"}` accepted)."})
    logit_bias = fields.Raw(metadata={"description": "Refused (an empty object accepted)."})
    presence_penalty = StrictFloat(allow_none=True, metadata={"description": "0 only."})
    frequency_penalty = StrictFloat(allow_none=True, metadata={"description": "0 only."})


class TopLogprob(Schema):
    token = fields.String(required=True)
    logprob = fields.Float(required=True)
    bytes = fields.List(fields.Integer(), required=True, allow_none=True)


class TokenLogprob(TopLogprob):
    top_logprobs = fields.List(fields.Nested(TopLogprob), required=True)


class ChoiceLogprobs(Schema):
    content = fields.List(fields.Nested(TokenLogprob), required=True, allow_none=True)
    refusal = fields.List(fields.Nested(TokenLogprob), required=True, allow_none=True)


class TokenAttention(Schema):
    """One generated token's attention row (the extension)."""

    token = fields.String(required=True)
    attention = fields.List(fields.Nested(StepAttention), required=True)


class ChoiceAttention(Schema):
    """The extension's answer: the prompt's tokens (the rows' first columns) and a row set per generated token."""

    tokens = fields.List(fields.String(), required=True)
    steps = fields.List(fields.Nested(TokenAttention), required=True)


class AssistantMessage(Schema):
    role = fields.String(required=True, validate=validate.OneOf(["assistant"]))
    content = fields.String(required=True)
    refusal = fields.String(required=True, allow_none=True)


class Choice(Schema):
    index = fields.Integer(required=True)
    message = fields.Nested(AssistantMessage, required=True)
    logprobs = fields.Nested(ChoiceLogprobs, required=True, allow_none=True)
    finish_reason = fields.String(required=True, validate=validate.OneOf(FINISH_REASONS), metadata={
        "description": "stop: the end of the text or a stop string; length: max_completion_tokens."})
    attention = fields.Nested(ChoiceAttention, metadata={"description": "Only with the `attention` extension."})


class ChatCompletion(Schema):
    """OpenAI's chat completion object. A streamed answer is `chat.completion.chunk` objects instead."""

    id = fields.String(required=True)
    object = fields.String(required=True, validate=validate.OneOf(["chat.completion"]))
    created = fields.Integer(required=True)
    model = fields.String(required=True)
    system_fingerprint = fields.String(required=True, metadata={
        "description": "The model's weights and the compute's precision: equal fingerprints, equal seeds, equal "
                       "answers (on one machine)."})
    choices = fields.List(fields.Nested(Choice), required=True)
    usage = fields.Nested(Usage, required=True)  # the generate endpoint's, which are OpenAI's

