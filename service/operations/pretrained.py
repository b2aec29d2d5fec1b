"""A trained model on any text: POST /v1/models/{model}/attention, the /v1/batch op ``model-attention`` and the
model's /v2 entry. Two kinds of model, read alike: an encoder (BERT: a text, or a pair) and a decoder (Llama: a
text, or a chat's messages through its template; every token attends only to itself and those before it).

``prepare`` makes a request ready once: it judges the text's length before anything reads it (tokenizing takes
~2 s a megabyte), tokenizes it, chooses the layers and heads and says what the request computes
(service.operations.sizes); ``compute`` runs the engine's model on what it found and keeps the selected layers and
heads; ``compute_many`` runs items of one :func:`group_key` (model, length, options) as one engine call, which
/v1/batch groups them by.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

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
Tokens = engine.Encoded | engine.TokenizedText  # an encoder's word pieces, a decoder's tokens


@dataclass(frozen=True)
class ModelInput:
    """What preparing a model's request found: the model, the text's tokens, the chosen layers and heads
    (sorted)."""

    model: ServedModel
    encoding: Tokens
    layers: list[int]
    heads: list[int]


def admit(params: Params, limits: Limits) -> None:
    """Refuse a text (a generation's prompt), or a chat's text in all, longer than ``max_text_chars`` code points,
    before it is tokenized."""
    for name in (*TEXTS, "prompt"):
        if name in params:
            limits.check("max_text_chars", len(params[name]), pointer=pointer(name))
    if "messages" in params:
        limits.check("max_text_chars", sum(len(message["content"]) for message in params["messages"]),
                     pointer=pointer("messages"))


def read_as(model: ServedModel, params: Params) -> None:
    """A decoder reads a text or messages, an encoder a text or a pair: the other way round is a 422 naming the
    architecture."""
    architecture = model.pretrained.architecture
    if model.causal and "text_pair" in params:
        raise ValidationProblem.at(pointer("text_pair"), f"{model.name} is a decoder ({architecture}): it reads one "
                                                         "text, or a chat's messages, not a pair.")
    if not model.causal and "messages" in params:
        raise ValidationProblem.at(pointer("messages"), f"{model.name} is an encoder ({architecture}): it reads a "
                                                        "text, or a pair (text_pair), not a chat.")


def encoded(model: ServedModel, params: Params) -> Tokens:
    """The request's tokens. An encoder's text or text_pair with no token but the specials ([CLS] [SEP]) is a 422;
    a decoder's chat goes through its template, and a message the template refuses is a 422 at /messages."""
    read_as(model, params)
    tokenizer = model.pretrained.tokenizer
    if model.causal:
        if "messages" not in params:
            return tokenizer.encode(params[input_member(params)])
        try:
            return tokenizer.encode_chat(params["messages"])
        except engine.AttentionError as exc:
            raise ValidationProblem.at(pointer(*exc.argument.split("/")), exc.detail) from None
    encoding = tokenizer.encode(params["text"], params.get("text_pair"))
    for segment, where in enumerate(TEXTS):  # text's word pieces are of type 0, text_pair's of type 1
        if where in params and not (~encoding.special & (encoding.type_ids == segment)).any():
            raise ValidationProblem.at(pointer(where), f"The model's tokenizer finds no token in {where} "
                                                       "(only [CLS] and [SEP] would remain).")
    return encoding


def positioned(model: ServedModel, params: Params) -> Tokens:
    """:func:`encoded`, within the model's positions: past its last one is a 422 at the input."""
    encoding = encoded(model, params)
    n, maximum = len(encoding.tokens), model.config.max_positions
    if n > maximum:
        raise ValidationProblem.at(pointer(input_member(params)), f"{n} tokens, past the model's {maximum} positions "
                                   f"(max_positions, GET /v1/models/{model.name}).",
                                   limit={"name": "max_positions", "maximum": maximum, "value": n})
    return encoding


def is_causal(params: Params) -> bool:
    """Whether the request's model is a decoder: its pictures hide each query's later keys."""
    return params["model"].causal


def input_member(params: Params) -> str:
    """What the request gives to read: ``text``, a generation's ``prompt``, or ``messages``."""
    return "messages" if "messages" in params else "prompt" if "prompt" in params else "text"


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


def model_input(params: Params, limits: Limits) -> ModelInput:
    """What every operation on a model's text finds first: the text judged by length, tokenized once within the
    model's positions, its layers and heads chosen; ``params["model"]`` is the served model (the route, or a batch
    item's name, resolved it)."""
    admit(params, limits)
    model: ServedModel = params["model"]
    config = model.config
    return ModelInput(model, positioned(model, params), selected(params, "layers", config.n_layers),
                      selected(params, "heads", config.n_heads))


def prepare(params: Params, limits: Limits) -> Prepared:
    """The request made ready: :func:`model_input`, its size checked."""
    found = model_input(params, limits)
    size = work(params, found)
    sizes.check(size, limits)
    return Prepared(params, size, found)


def work(params: Params, found: ModelInput) -> Work:
    """One text of n tokens: L_sel * h_sel * n * n weights returned; per layer n * d_ff hidden numbers computed only
    (a decoder's SwiGLU two such arrays); n * d_model outputs (with hidden states L + 1 more, with trace 7 a
    selected layer)."""
    model, config = found.model, found.model.config
    n = len(found.encoding.tokens)
    where = pointer(input_member(params))
    arrays = 1 + (config.n_layers + 1) * params["return_hidden_states"]
    arrays += ENCODER_TRACE_ARRAYS * len(found.layers) * params["trace"]
    hidden = Along(n * hidden_width(model), 1, where, returned=False, repeat=config.n_layers)
    return Work((("max_sequence_length", n, where),),
                **sizes.weighing(params, len(found.layers) * len(found.heads) * n * n, pointer("layers")),
                along=(hidden, Along(n * config.d_model, arrays, where)),
                macs=n * config.n_layers * macs_per_token(model), fewer=FEWER)


def hidden_width(model: ServedModel) -> int:
    """The feed-forward's hidden numbers a token computes in a layer: d_ff, twice for a decoder's SwiGLU (its gate
    and its up projection)."""
    return model.config.d_ff * (2 if model.causal else 1)


def macs_per_token(model: ServedModel) -> int:
    """Multiply-adds of one layer's projections and feed-forward for one token."""
    config = model.config
    if model.causal:  # W_q, W_o; W_k, W_v of the key/value heads; gate, up and down
        return 2 * config.d_model**2 + 2 * config.d_model * config.n_kv_heads * config.d_k + 3 * config.d_model \
            * config.d_ff
    return 4 * config.d_model**2 + 2 * config.d_model * config.d_ff  # Q, K, V, W_o, W_1, W_2


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
    """Answers to items of one :func:`group_key` (or one item), in ONE engine call: their tokens stacked (G, n),
    every layer computed once for all of them."""
    first = items[0]
    with EngineCall((), list, first.params, sum(item.work.weights for item in items)):
        if first.params["trace"]:  # alone (group_key)
            return [_traced(first)]
        return _computed(first, [item.found.encoding for item in items])


def forward(model: ServedModel, ids: np.ndarray, lengths: np.ndarray | None = None, *, types: np.ndarray | None = None,
            dtype: Any = np.float32, return_weights: bool = True, layers: Sequence[int] | None = None,
            heads: Sequence[int] | None = None, hidden_states: bool = False) -> Any:
    """The model's forward pass over ids (B, n) (``lengths``: (B,) real tokens, the rest padding; ``types``: an
    encoder's segments), keeping the weights of ``layers`` and ``heads`` (default all): output (B, n, d_model),
    weights per layer (B, h_sel, n, n), hidden states (B, n, d_model) each. A decoder computes no logits here."""
    options = {"dtype": dtype, "return_weights": return_weights, "weights_of": layers, "heads": heads,
               "hidden_states": hidden_states}
    if model.causal:
        return model.pretrained.llama(ids, lengths, logits=None, **options)
    return model.pretrained.bert(ids, types, lengths, **options)


def _computed(first: Prepared, encodings: list[Tokens]) -> list[Result]:
    """The forward pass of G texts of one length, split into G answers."""
    options, found = first.params, first.found
    ids = np.stack([encoding.ids for encoding in encodings])                # (G, n)
    types = None if found.model.causal else np.stack([encoding.type_ids for encoding in encodings])  # (G, n)
    out = forward(found.model, ids, types=types, dtype=options["dtype"], layers=found.layers, heads=found.heads,
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
    encoding, layers, heads, model = found.encoding, found.layers, found.heads, found.model
    options = {"dtype": params["dtype"], "layers": layers, "heads": heads}
    if model.causal:
        trace = model.pretrained.llama.trace(encoding.ids[None], logits=None, **options)
    else:
        trace = model.pretrained.bert.trace(encoding.ids[None], encoding.type_ids[None], **options)
    result = {"tokens": encoding.tokens, "token_ids": encoding.ids.tolist(), "output": trace.output[0],
              "layers": [_traced_layer(i, heads, trace.layers[i]) for i in layers]}
    if params["return_hidden_states"]:
        result["hidden_states"] = [state[0] for state in trace.hidden_states]
    return result


def _traced_layer(index: int, heads: list[int], trace: Any) -> dict:
    """A selected layer with its trace: per selected head q, k, v, the score stages and weights; the attention
    after W_o and the stages after it (an encoder's add & norm, a decoder's residual; the feed-forward; the
    output), as the layer's trace names them."""
    stages = {name: array[0] for name, array in trace.as_dict().pop("attention").items()}
    layer = {name: array[0] for name, array in trace.as_dict().items() if name != "attention"}
    return {"layer": index, "heads": heads, "weights": stages["weights"], "trace": {"attention": stages, **layer}}


def settings(params: Params, result: Result) -> list[str]:
    """The run's settings a picture of the model's weights states: the model, its size, its trained weights and
    positions, whether it is causal, its input, the precision."""
    model: ServedModel = params["model"]
    config = model.config
    texts = "text and text_pair" if "text_pair" in params else input_member(params)
    if model.causal:
        shape = f"{config.n_layers} layers × {config.n_heads} heads ({config.n_kv_heads} key/value heads)"
        positions, causal = "rotary", "yes"
    else:
        shape, positions, causal = f"{config.n_layers} layers × {config.n_heads} heads", "learned", "no"
    return [f"model: {model.name}", f"{shape}, d_model {config.d_model}", "trained weights (no seed)",
            f"positional encoding: {positions}", f"causal: {causal}", f"input: {texts}", f"dtype: {params['dtype']}"]
