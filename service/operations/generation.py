"""A decoder generating text: POST /v1/models/{model}/generate (JSON, its steps' heatmap, or a stream of events)
and the /v1/batch op ``generate``.

``prepare`` makes a request ready once: the model must be a decoder; the prompt is judged by length, tokenized,
and what the generation may cost is checked before a token is computed: the tokens asked for against
``max_new_tokens`` (a step with the logit lens counts as the several steps its compute is), the attention rows of
every step against ``max_weight_elements``. ``steps`` runs the engine's generation (attention/generation.py)
and turns each step into its answer; ``compute`` collects them, ``events`` streams them as server-sent events.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

import attention as engine
from schemas.generation import GenerateRequest
from service.operations import pretrained, sizes
from service.operations.catalogue import ServedModel
from service.operations.inputs import EngineCall, Prepared, Result
from service.operations.jsontext import dumps
from service.operations.rounding import round_arrays
from service.operations.sizes import Along, Params, Work
from service.problems import (
    InternalError,
    LimitExceeded,
    Problem,
    ValidationProblem,
    attention_problem,
    pointer,
    problem_members,
)
from service.runtime import metrics
from service.settings import Limits

FEWER = (pointer("layers"), pointer("heads"), pointer("max_new_tokens"))
DEFAULT_NEW_TOKENS = GenerateRequest().fields["max_new_tokens"].load_default
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationInput:
    """What preparing a generation found: the model, the prompt's tokens, the layers and heads whose rows each step
    returns (None: no rows)."""

    model: ServedModel
    encoding: engine.TokenizedText
    layers: list[int] | None
    heads: list[int] | None


def lens_factor(model: ServedModel) -> float:
    """What the logit lens adds to a step, in steps: n_layers + 1 hidden states through the output head (d_model x
    vocab each) against one token's multiply-adds through every layer and the head (~6.5 for SmolLM2-135M)."""
    config = model.config
    head = config.d_model * config.vocab_size
    return (config.n_layers + 1) * head / (config.n_layers * pretrained.macs_per_token(model) + head)


def new_tokens(model: ServedModel, params: Params) -> int:
    """The tokens a request asks for, as max_new_tokens counts them: a step with the lens counts 1 + lens_factor."""
    count = params["max_new_tokens"]
    return math.ceil(count * (1 + lens_factor(model))) if params["logit_lens"] else count


def asked(model: ServedModel, body: Any) -> int:
    """The new tokens a request's body asks for, as max_new_tokens counts them, read before it is validated (a batch
    job cuts its file by them): a value its schema would refuse counts as the default, the request being refused
    then without computing anything."""
    body = body if isinstance(body, dict) else {}
    count = body.get("max_new_tokens")
    valid = type(count) is int and count > 0
    return new_tokens(model, {"max_new_tokens": count if valid else DEFAULT_NEW_TOKENS,
                              "logit_lens": body.get("logit_lens") is True})


def prepare(params: Params, limits: Limits) -> Prepared:
    """The request made ready: a decoder, its prompt judged, tokenized and positioned, its cost checked."""
    model: ServedModel = params["model"]
    if not model.causal:
        raise ValidationProblem.at(pointer(pretrained.input_member(params)), (
            f"{model.name} is an encoder ({model.pretrained.architecture}): it reads text, it does not generate. "
            "GET /v1/models lists the decoders (causal: true)."))
    pretrained.admit(params, limits)
    encoding = pretrained.positioned(model, params)
    rows = "layers" in params or "heads" in params or params.get("format") == "svg"  # a picture is of the rows
    config = model.config
    found = GenerationInput(model, encoding,
                            pretrained.selected(params, "layers", config.n_layers) if rows else None,
                            pretrained.selected(params, "heads", config.n_heads) if rows else None)
    n, asked = len(encoding.tokens), params["max_new_tokens"]
    if n + asked > config.max_positions:
        raise ValidationProblem.at(pointer("max_new_tokens"), f"{n} prompt tokens and {asked} new ones pass the "
                                   f"model's {config.max_positions} positions (max_positions, GET /v1/models/"
                                   f"{model.name}).", limit={"name": "max_positions", "maximum": config.max_positions,
                                                             "value": n + asked})
    _check_new_tokens(model, params, limits)
    size = work(params, found)
    sizes.check(size, limits)
    return Prepared(params, size, found)


def _check_new_tokens(model: ServedModel, params: Params, limits: Limits) -> None:
    """max_new_tokens, the lens counted: past the limit because of the lens alone, /logit_lens is named."""
    asked, counted = params["max_new_tokens"], new_tokens(model, params)
    by_lens = params["logit_lens"] and asked <= limits.max_new_tokens
    try:
        limits.check("max_new_tokens", counted, pointer=pointer("logit_lens" if by_lens else "max_new_tokens"))
    except LimitExceeded as exc:
        if params["logit_lens"]:
            why = {"pointer": pointer("logit_lens"), "detail": (
                f"logit_lens counts each new token as {1 + lens_factor(model):.2f} (its compute): {asked} tokens "
                f"count {counted}; ask for fewer tokens, or leave the lens out.")}
            exc.members["errors"] = [why] if by_lens else [*exc.members["errors"], why]
        raise


def work(params: Params, found: GenerationInput) -> Work:
    """A prompt of n tokens and m new ones: rows of L_sel * h_sel weights over n + 1, ..., n + m keys; per step the
    top candidates and, with the lens, (n_layers + 1) x 5 tokens; the prompt's feed-forward computed once; the
    multiply-adds of n + m positions, m output heads, and the lens."""
    model, config = found.model, found.model.config
    n, m = len(found.encoding.tokens), params["max_new_tokens"]
    where = pointer(pretrained.input_member(params))
    rows = 0 if found.layers is None else len(found.layers) * len(found.heads) * (m * (n + 1) + m * (m - 1) // 2)
    per_step = params["top_logprobs"] + 1 + (config.n_layers + 1) * engine.generation.LENS_TOP * params["logit_lens"]
    head = config.d_model * config.vocab_size
    macs = (n + m) * config.n_layers * pretrained.macs_per_token(model) + m * head
    macs += m * (config.n_layers + 1) * head * params["logit_lens"]
    weights = sizes.weighing(params, rows, pointer("layers")) if rows else {}
    return Work((("max_sequence_length", n, where),), **weights,
                along=(Along(n * pretrained.hidden_width(model), 1, where, returned=False, repeat=config.n_layers),
                       Along(m * per_step, 1, pointer("max_new_tokens"))),
                macs=macs, fewer=FEWER, new_tokens=new_tokens(model, params))


def steps(prepared: Prepared) -> tuple[engine.Generation, Iterator[Result]]:
    """The engine's generation for the request and its steps' answers, computed as they are read."""
    params, found = prepared.params, prepared.found
    model = found.model
    options = engine.GenerationOptions(
        params["max_new_tokens"], tuple(params.get("stop", ())), params["top_logprobs"],
        None if found.layers is None else tuple(found.layers), None if found.heads is None else tuple(found.heads),
        params["logit_lens"], params["dtype"])
    sampler = engine.Sampler(engine.Sampling(params["temperature"], params["top_k"], params["top_p"]),
                             params.get("seed"))
    generation = engine.Generation(model.pretrained.llama, model.pretrained.tokenizer, found.encoding.ids, options,
                                   sampler)
    return generation, (_step(found, step) for step in generation)


def _step(found: GenerationInput, step: engine.Step) -> Result:
    """A step's answer: the token, how it was chosen, the text it releases, its rows and lens when asked."""
    tokenizer, choice = found.model.pretrained.tokenizer, step.choice
    metrics.count_generated(found.model.name, 1)
    answer = {"index": step.index, "token": _text(tokenizer, step.token), "id": step.token, "bytes": list(step.bytes),
              "logprob": choice.logprob, "kept": choice.kept,
              "top": [{"token": _text(tokenizer, i), "id": i, "bytes": list(tokenizer.token_bytes(i)), "logprob": lp,
                       "drawn": drawn}
                      for i, lp, drawn in zip(choice.top.tolist(), choice.top_logprobs.tolist(),
                                              choice.top_drawn.tolist(), strict=True)],
              "text": step.text}
    if step.attention is not None:
        answer["attention"] = [{"layer": layer, "heads": found.heads, "weights": rows}
                               for layer, rows in zip(found.layers, step.attention, strict=True)]
    if step.lens is not None:
        answer["logit_lens"] = [
            {"after_layers": depth, "top": [{"token": _text(tokenizer, i), "id": i, "logprob": lp}
                                            for i, lp in zip(ids, logprobs, strict=True)]}
            for depth, (ids, logprobs) in enumerate(zip(step.lens.ids.tolist(), step.lens.logprobs.tolist(),
                                                        strict=True))]
    return answer


def _text(tokenizer: engine.ByteBPE, token: int) -> str:
    """A token's text alone (U+FFFD where it ends inside a character)."""
    return tokenizer.tokenized([token]).tokens[0]


def summary(prepared: Prepared, generation: engine.Generation) -> Result:
    """Everything but the steps: the prompt's tokens, the text, why it ended, the counts, the seed."""
    encoding = prepared.found.encoding
    n = len(encoding.tokens)
    return {"tokens": encoding.tokens, "token_ids": encoding.ids.tolist(), "text": generation.text,
            "finish_reason": generation.finish_reason,
            "usage": {"prompt_tokens": n, "completion_tokens": generation.steps, "total_tokens": n + generation.steps},
            "seed": generation.sampler.seed}


def compute(prepared: Prepared) -> Result:
    """The whole answer: the summary with every step."""
    with EngineCall((), list, prepared.params, prepared.work.weights):
        generation, answers = steps(prepared)
        done = list(answers)
    return {**summary(prepared, generation), "steps": done}


def events(prepared: Prepared) -> Iterator[bytes]:
    """The answer as server-sent events, each step as soon as it is computed: ``prompt`` (the prompt's tokens, known
    before anything runs), ``token`` per step, then ``done`` (the summary), or ``error`` (a problem) if the
    generation fails midway. Closing the iterator (the client went away) stops the generation before its next
    step."""
    decimals = prepared.params.get("decimals")
    encoding = prepared.found.encoding
    yield _event("prompt", {"tokens": encoding.tokens, "token_ids": encoding.ids.tolist()})
    try:
        generation, answers = steps(prepared)
        for answer in answers:
            yield _event("token", round_arrays(answer, decimals))
        metrics.count_elements(prepared.work.weights)
        yield _event("done", round_arrays(summary(prepared, generation), decimals))
    except Exception as exc:  # the status line is sent: a failure midway is an event with its problem
        yield _event("error", problem_members(midway_problem(exc)))


def midway_problem(error: Exception) -> Problem:
    """What a failure midway is to the client: a request's own problem, or (a bug, logged) a 500."""
    if isinstance(error, engine.AttentionError):
        return attention_problem(error)
    if isinstance(error, Problem):
        return error
    log.error("the generation failed midway", exc_info=error)
    return InternalError("The server failed to finish this generation; this is a bug.")


def _event(name: str, data: Any) -> bytes:
    """One server-sent event: its name and one line of JSON (orjson writes no newline inside)."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def settings(params: Params, result: Result) -> list[str]:
    """The run's settings a picture of the steps' rows states: the model and its shape, the sampling, the outcome."""
    sampling = "greedy" if params["temperature"] == 0 else (
        f"temperature {params['temperature']}, top_k {params['top_k']}, top_p {params['top_p']}, seed {result['seed']}")
    return [*pretrained.settings(params, result)[:2], f"sampling: {sampling}",
            f"{len(result['steps'])} new tokens, finish: {result['finish_reason']}", f"dtype: {params['dtype']}"]


def arranged(params: Params, result: Result) -> Result:
    """The steps' rows as a picture reads a model's layers: per layer (h_sel, m, n + m), row i the new token i over
    every token so far (zeros after it), labelled with every token (columns) and the new tokens (rows)."""
    steps_ = result["steps"]
    tokens = [*result["tokens"], *(step["token"] for step in steps_)]
    layers = []
    for k, layer in enumerate(steps_[0]["attention"]):
        dtype = layer["weights"].dtype                                              # the run's: float32 stays so
        weights = np.zeros((len(layer["heads"]), len(steps_), len(tokens)), dtype)  # (h_sel, m, n + m)
        for i, step in enumerate(steps_):
            row = step["attention"][k]["weights"]                                   # (h_sel, n + i + 1)
            weights[:, i, :row.shape[-1]] = row
        layers.append({"layer": layer["layer"], "heads": layer["heads"], "weights": weights})
    return {"tokens": tokens, "row_tokens": [step["token"] for step in steps_], "layers": layers}
