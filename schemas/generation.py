"""A decoder generating text: POST /v1/models/{model}/generate, its answer, its streamed events and its batch item."""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate, validates_schema

from schemas.base import Schema
from schemas.fields import MAX_SEED, BoundedList, StrictFloat, strict_bool, strict_int
from schemas.pretrained import ModelSelection, messages_field
from schemas.tensor import Tensor

MAX_STOPS = 4           # stop strings of one request, as OpenAI's API takes
MAX_STOP_CHARS = 256    # code points of one stop string
MAX_TOP_LOGPROBS = 20   # candidates reported per step, as OpenAI's API reports at most
FINISH_REASONS = ("stop", "length", "stop_sequence")


class GenerateRequest(ModelSelection):
    """A prompt (or a chat) and how to continue it: how many tokens, how to choose each, what to show of each step."""

    prompt = fields.String(metadata={
        "description": "The text to continue, as it is (no chat template). At most max_text_chars code points "
                       "(GET /v1/limits). Give it or `messages`."})
    messages = messages_field("A chat, rendered by the model's own chat template with the assistant's turn opened: "
                              "the model writes the assistant's answer. At most max_text_chars code points in all.")
    max_new_tokens = strict_int(1, load_default=32, metadata={
        "description": "Tokens to generate at most (the end-of-text token counts as one); at most max_new_tokens "
                       "(GET /v1/limits), and within the model's positions with the prompt."})
    temperature = StrictFloat(load_default=0.0, validate=validate.Range(min=0), metadata={
        "description": "0: greedy, the most likely token every step (the default). Above 0: the logits are divided "
                       "by it and a token is drawn (below 1 sharper, above 1 flatter)."})
    top_k = strict_int(0, load_default=0, metadata={
        "description": "Draw only among the k most likely tokens, after temperature (0: all)."})
    top_p = StrictFloat(load_default=1.0, validate=validate.Range(min=0, max=1, min_inclusive=False), metadata={
        "description": "Draw only among the fewest most likely tokens whose probabilities (after temperature and "
                       "top-k, renormalised) reach p (1: all)."})
    seed = strict_int(0, MAX_SEED, metadata={
        "description": "Seed of the draw (numpy's PCG64, one uniform number a step): the same seed, machine and "
                       "dtype give the same tokens. Default: a fresh one, reported in the answer."})
    stop = BoundedList(fields.String(validate=validate.Length(1, MAX_STOP_CHARS)),
                       validate=validate.Length(1, MAX_STOPS), metadata={
                           "description": f"1 to {MAX_STOPS} non-empty strings: the text ends before the first one "
                                          "generated (finish_reason stop_sequence)."})
    top_logprobs = strict_int(0, MAX_TOP_LOGPROBS, load_default=5, metadata={
        "description": "Candidates reported per step, the most likely first, with the model's log-probabilities."})
    logit_lens = strict_bool(load_default=False, metadata={
        "description": "Add each step's logit lens: the 5 tokens each layer's hidden state would predict (final "
                       "norm and output head applied); it costs ~7 tokens' compute a step (GET /v1/limits)."})
    stream = strict_bool(load_default=False, metadata={
        "description": "Answer text/event-stream: `event: prompt` with the prompt's tokens, an `event: token` per "
                       "step as it is computed, then `event: done` with everything but the steps (or `event: error` "
                       "with a problem)."})

    @validates_schema
    def _one_input(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "messages" in data and "prompt" in data:
            raise ValidationError("Give prompt or messages, not both.", "messages")
        if "messages" not in data and "prompt" not in data:
            raise ValidationError("Give the prompt to continue (or the chat's messages).", "prompt")
        if "prompt" in data and not data["prompt"].strip():
            raise ValidationError("Must hold something other than whitespace.", "prompt")


class GenerateItem(GenerateRequest):
    """A /v1/batch item of op generate: the endpoint's body (not streamed) plus the model's name."""

    class Meta:
        exclude = ("stream",)

    model = fields.String(required=True, metadata={"description": "A served decoder's name (GET /v1/models)."})


class LensToken(Schema):
    """A token and its log-probability (natural log)."""

    token = fields.String(required=True)
    id = fields.Integer(required=True)
    logprob = fields.Float(required=True)


class Candidate(LensToken):
    """A token the model considered, with its log-probability under the model (before temperature and the filters)
    and its probability in the distribution the token was drawn from (0: filtered out)."""

    bytes = fields.List(fields.Integer(), required=True)
    drawn = fields.Float(required=True, metadata={
        "description": "Its probability after temperature, top-k and top-p (greedy: 1 for the chosen token)."})


class LensLayer(Schema):
    """What the hidden state after ``after_layers`` layers (0: the embeddings) would predict."""

    after_layers = fields.Integer(required=True)
    top = fields.List(fields.Nested(LensToken), required=True)


class StepAttention(Schema):
    """The new token's own attention row in one layer, per selected head, over every token so far, itself last."""

    layer = fields.Integer(required=True)
    heads = fields.List(fields.Integer(), required=True)
    weights = Tensor(required=True, ranks=(2,), metadata={"description": "(h_sel, n_keys)."})


class GeneratedStep(Schema):
    """One generated token and how it was chosen."""

    index = fields.Integer(required=True)
    token = fields.String(required=True, metadata={
        "description": "Its text alone (U+FFFD where it ends inside a UTF-8 character)."})
    id = fields.Integer(required=True)
    bytes = fields.List(fields.Integer(), required=True)
    logprob = fields.Float(required=True, metadata={"description": "Under the model, natural log."})
    kept = fields.Integer(required=True, metadata={"description": "Tokens left after the sampling filters."})
    top = fields.List(fields.Nested(Candidate), required=True)
    text = fields.String(required=True, metadata={
        "description": "The text this step releases (a cut character or a possible stop string waits)."})
    attention = fields.List(fields.Nested(StepAttention), metadata={"description": "Only with layers or heads."})
    logit_lens = fields.List(fields.Nested(LensLayer), metadata={"description": "Only with logit_lens."})


class Usage(Schema):
    prompt_tokens = fields.Integer(required=True)
    completion_tokens = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)


class GenerateResponse(Schema):
    """The prompt's tokens, every step, the text, why it ended, the token counts and the seed drawn with."""

    tokens = fields.List(fields.String(), required=True)
    token_ids = fields.List(fields.Integer(), required=True)
    steps = fields.List(fields.Nested(GeneratedStep), required=True)
    text = fields.String(required=True, metadata={
        "description": "The generated text, without the stop string; the end-of-text token is a step, not text."})
    finish_reason = fields.String(required=True, validate=validate.OneOf(FINISH_REASONS), metadata={
        "description": "stop: the end-of-text token; length: max_new_tokens; stop_sequence: a stop string."})
    usage = fields.Nested(Usage, required=True)
    seed = fields.Integer(required=True)
