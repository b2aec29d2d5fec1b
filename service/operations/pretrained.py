"""A trained model on any sentence: POST /v1/models/{model}/attention, the /v1/batch op ``model-attention`` and
the model's /v2 entry.

``prepare`` makes a request ready once: it judges the text's length before anything reads it (tokenizing takes
~2 s a megabyte), tokenizes it, chooses the layers and heads and says what the request computes
(service.operations.sizes); ``compute`` runs the engine's BERT on what it found and keeps the selected layers and
heads; ``compute_many`` runs items of one :func:`group_key` (model, length, options) as one engine call, which
/v1/batch groups them by.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

import attention as engine
from service.operations import sizes
from service.operations.catalogue import ServedModel
from service.operations.inputs import EngineCall, Prepared, Result
from service.operations.sizes import ENCODER_TRACE_ARRAYS, Along, Params, Work
from service.problems import ValidationProblem, pointer
from service.settings import Limits

TEXTS = ("text", "text_pair")
FEWER = (pointer("layers"), pointer("heads"))


@dataclass(frozen=True)
class ModelInput:
    """What preparing a model's request found: the model, the text's word pieces, the chosen layers and heads
    (sorted)."""

    model: ServedModel
    encoding: engine.Encoded
    layers: list[int]
    heads: list[int]


def admit(params: Params, limits: Limits) -> None:
    """Refuse a text longer than ``max_text_chars`` code points, before it is tokenized."""
    for name in TEXTS:
        if name in params:
            limits.check("max_text_chars", len(params[name]), pointer=pointer(name))


def encoded(model: ServedModel, params: Params) -> engine.Encoded:
    """The request's word pieces; a text or text_pair with no token but the specials ([CLS] [SEP]) is a 422."""
    encoding = model.pretrained.tokenizer.encode(params["text"], params.get("text_pair"))
    for segment, where in enumerate(TEXTS):  # text's word pieces are of type 0, text_pair's of type 1
        if where in params and not (~encoding.special & (encoding.type_ids == segment)).any():
            raise ValidationProblem.at(pointer(where), f"The model's tokenizer finds no token in {where} "
                                                       "(only [CLS] and [SEP] would remain).")
    return encoding


def positioned(model: ServedModel, params: Params) -> engine.Encoded:
    """:func:`encoded`, within the model's positions: past its last learned one is a 422 at /text."""
    encoding = encoded(model, params)
    n, maximum = len(encoding.tokens), model.config.max_positions
    if n > maximum:
        raise ValidationProblem.at(pointer("text"), f"{n} tokens, past the model's {maximum} positions "
                                   f"(max_positions, GET /v1/models/{model.name}).",
                                   limit={"name": "max_positions", "maximum": maximum, "value": n})
    return encoding


def selected(params: Params, name: str, count: int) -> list[int]:
    """The requested layers or heads, in increasing order (default all); one past ``count`` is a 422."""
    chosen = params.get(name)
    if chosen is None:
        return list(range(count))
    for i, index in enumerate(chosen):
        if index >= count:
            raise ValidationProblem.at(pointer(name, i), f"{name[:-1]} {index} is out of range: the model has "
                                                         f"{count} {name}, 0 to {count - 1}.")
    return sorted(chosen)


def prepare(params: Params, limits: Limits) -> Prepared:
    """The request made ready: its text judged by length, tokenized once, its layers and heads chosen, its size
    checked; ``params["model"]`` is the served model (the route, or a batch item's name, resolved it)."""
    admit(params, limits)
    model: ServedModel = params["model"]
    config = model.config
    found = ModelInput(model, positioned(model, params), selected(params, "layers", config.n_layers),
                       selected(params, "heads", config.n_heads))
    size = work(params, found)
    sizes.check(size, limits)
    return Prepared(params, size, found)


def work(params: Params, found: ModelInput) -> Work:
    """One sentence of n tokens: L_sel * h_sel * n * n weights returned; per layer B * n * d_ff hidden numbers
    computed only; n * d_model outputs (with hidden states L + 1 more, with trace 7 a selected layer)."""
    config = found.model.config
    n = len(found.encoding.tokens)
    where = pointer("text")
    arrays = 1 + (config.n_layers + 1) * params["return_hidden_states"]
    arrays += ENCODER_TRACE_ARRAYS * len(found.layers) * params["trace"]
    hidden = Along(n * config.d_ff, 1, where, returned=False, repeat=config.n_layers)
    per_layer = 4 * config.d_model**2 + 2 * config.d_model * config.d_ff  # Q, K, V, W_o, W_1, W_2
    return Work((("max_sequence_length", n, where),),
                **sizes.weighing(params, len(found.layers) * len(found.heads) * n * n, pointer("layers")),
                along=(hidden, Along(n * config.d_model, arrays, where)), macs=n * config.n_layers * per_layer,
                fewer=FEWER)


def group_key(prepared: Prepared) -> Hashable | None:
    """What /v1/batch computes items together by: the model, the length in tokens and every option that changes
    the compute; None (alone) with trace, whose intermediates are per item anyway."""
    params, found = prepared.params, prepared.found
    if params["trace"]:
        return None
    return (found.model.name, len(found.encoding.tokens), params["dtype"], tuple(found.layers), tuple(found.heads),
            params["return_hidden_states"])


def compute(prepared: Prepared) -> Result:
    """{tokens, token_ids, output (n, d_model), layers [{layer, heads, weights (h_sel, n, n), trace?}],
    hidden_states?}: the model on the request's text."""
    return compute_many([prepared])[0]


def compute_many(items: list[Prepared]) -> list[Result]:
    """Answers to items of one :func:`group_key` (or one item), in ONE engine call: their word pieces stacked
    (G, n), every layer computed once for all of them."""
    first = items[0]
    with EngineCall((), list, first.params, sum(item.work.weights for item in items)):
        if first.params["trace"]:  # alone (group_key)
            return [_traced(first)]
        return _computed(first, [item.found.encoding for item in items])


def _computed(first: Prepared, encodings: list[engine.Encoded]) -> list[Result]:
    """The forward pass of G texts of one length, split into G answers."""
    options, found = first.params, first.found
    ids = np.stack([encoding.ids for encoding in encodings])                # (G, n)
    types = np.stack([encoding.type_ids for encoding in encodings])         # (G, n)
    out = found.model.pretrained.bert(ids, types, dtype=options["dtype"], weights_of=found.layers, heads=found.heads,
                                      hidden_states=options["return_hidden_states"])
    answers = []
    for g, encoding in enumerate(encodings):
        answer = {"tokens": encoding.tokens, "token_ids": encoding.ids.tolist(), "output": out.output[g],
                  "layers": [{"layer": i, "heads": found.heads, "weights": out.weights[i][g]} for i in found.layers]}
        if out.hidden_states is not None:
            answer["hidden_states"] = [state[g] for state in out.hidden_states]   # n_layers + 1 of (n, d_model)
        answers.append(answer)
    return answers


def _traced(prepared: Prepared) -> Result:
    """One text with every stage of its selected layers and heads (only those are kept)."""
    params, found = prepared.params, prepared.found
    encoding, layers, heads = found.encoding, found.layers, found.heads
    trace = found.model.pretrained.bert.trace(encoding.ids[None], encoding.type_ids[None], dtype=params["dtype"],
                                              layers=layers, heads=heads)
    result = {"tokens": encoding.tokens, "token_ids": encoding.ids.tolist(), "output": trace.output[0],
              "layers": [_traced_layer(i, heads, trace.layers[i]) for i in layers]}
    if params["return_hidden_states"]:
        result["hidden_states"] = [state[0] for state in trace.hidden_states]
    return result


def _traced_layer(index: int, heads: list[int], trace: engine.EncoderLayerTrace) -> dict:
    """A selected layer with its trace: per selected head q, k, v, the score stages and weights; the attention
    after W_o and the add & norm and feed-forward stages, as /v1/encoder names them."""
    stages = {name: array[0] for name, array in trace.as_dict().pop("attention").items()}
    layer = {name: array[0] for name, array in trace.as_dict().items() if name != "attention"}
    return {"layer": index, "heads": heads, "weights": stages["weights"], "trace": {"attention": stages, **layer}}


def settings(params: Params, result: Result) -> list[str]:
    """The run's settings a picture of the model's weights states: the model, its size, its trained weights and
    learned positions, no causal mask, the precision."""
    model: ServedModel = params["model"]
    config = model.config
    texts = "text and text_pair" if "text_pair" in params else "text"
    return [f"model: {model.name}", f"{config.n_layers} layers × {config.n_heads} heads, d_model {config.d_model}",
            "trained weights (no seed)", "positional encoding: learned", "causal: no", f"input: {texts}",
            f"dtype: {params['dtype']}"]
