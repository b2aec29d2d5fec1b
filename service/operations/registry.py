"""The operation registry: every operation the service computes, declared once.

An entry says how the operation is asked for (request and response schemas, method, path, documented example),
how a request is made ready (``prepare``: its size, service.operations.sizes, and what it finds) and computed
(``compute``), how /v1/batch stacks it,
how a mask is read, what its picture is and, for those served over /v2, the model's tensors and parameters. The
/v1 routes, /v1/batch, the /v2 models, the heatmaps and the OpenAPI examples are all derived from ``OPERATIONS``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from marshmallow import Schema

from schemas.attention import BATCHABLE, AttentionRequest, AttentionResponse
from schemas.batch import PositionalEncodingBody
from schemas.census import CensusItem, CensusRequest, CensusResponse
from schemas.explain import ExplainItem, ExplainRequest, ExplainResponse
from schemas.generation import GenerateItem, GenerateRequest, GenerateResponse
from schemas.models import EncoderRequest, EncoderResponse, ModelResponse, MultiHeadRequest, SelfAttentionRequest
from schemas.pretrained import ModelAttentionItem, ModelAttentionRequest, ModelAttentionResponse
from schemas.reference import (
    CausalMaskQuery,
    CausalMaskResponse,
    EmbedRequest,
    EmbedResponse,
    PositionalEncodingQuery,
    PositionalEncodingResponse,
)
from schemas.v2 import AttentionParameters, MultiHeadParameters
from service.operations import analyses, attention, catalogue, census, generation, layers, pretrained, reference
from service.operations.catalogue import DECODER_NAME, DEFAULT_NAME
from service.operations.inputs import Prepared, sized
from service.operations.rounding import round_arrays
from service.operations.sizes import Params
from service.settings import Limits

Result = dict[str, Any]
Arrays = dict[str, np.ndarray]
FLOATS = ("FP32", "FP64")  # each computed in its own precision; v2 metadata shows the first (README: "Open Inference")


@dataclass(frozen=True)
class TensorSpec:
    """A v2 input or output: accepted datatypes (the first one shown in metadata) and ranks. ``count_limit``:
    the limit (service.settings.Limits) on an input's element count, judged from its shape before decoding."""

    name: str
    datatypes: tuple[str, ...]
    ranks: tuple[int, ...]
    shape: str  # for people, e.g. "[n_q, d_k] or [B, n_q, d_k]"
    required: bool = True
    count_limit: str = ""

    def metadata(self) -> dict[str, Any]:
        """Protocol metadata: one datatype and one shape, -1 for every variable dimension."""
        return {"name": self.name, "datatype": self.datatypes[0], "shape": [-1] * max(self.ranks)}

    def expected(self) -> str:
        """``FP32 or FP64 with shape [n_q, d_k] or [B, n_q, d_k]``: for error messages."""
        return f"{' or '.join(self.datatypes)} with shape {self.shape}"


@dataclass(frozen=True)
class V2Model:
    """How an operation is served as a v2 model: its tensors, its parameters, and ``params(inputs,
    parameters)``, the v1 params its decoded inputs and validated parameters stand for."""

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: type[Schema]
    params: Callable[[Arrays, dict[str, Any]], Params]


@dataclass(frozen=True)
class Grouping:
    """How /v1/batch computes items of an operation together when it does not stack arrays: ``key(prepared)``
    (None: alone) and ``compute(items)``, one answer per prepared item of a key, in one engine call."""

    key: Callable[[Prepared], Hashable | None]
    compute: Callable[[list[Prepared]], list[Result]]


def request_mask(params: Params) -> np.ndarray | None:
    """The request's ``mask`` as it is (None without one): it lies over the weights broadcast from the right."""
    return params.get("mask")


def request_causal(params: Params) -> bool:
    """The request's ``causal`` flag (false without one)."""
    return params.get("causal", False)


@dataclass(frozen=True)
class Drawing:
    """How an operation's weights are drawn (service.operations.pictures): the title, the names of the leading axes
    of its weights (``before_batch`` and ``after_batch`` the optional batch axis), ``settings(params, result)``: the
    run's settings, written in the picture, ``mask(params)``: the request's mask (true = may attend) as it lies
    over the weights, and ``causal(params)``: whether a key after its query is hidden too. ``arranged(params,
    result)``: the answer as a picture reads it when its weights are not ``layers`` or ``weights`` (a generation's
    steps), with ``row_tokens`` when its rows are the last of its ``tokens``. ``picture(params, result,
    color_scale)``: an operation whose answer is more than weights draws it itself (its cells checked when it was
    prepared)."""

    title: str
    before_batch: tuple[str, ...]
    after_batch: tuple[str, ...]
    settings: Callable[[Params, Result], list[str]]
    mask: Callable[[Params], np.ndarray | None] = request_mask
    causal: Callable[[Params], bool] = request_causal
    arranged: Callable[[Params, Result], Result] | None = None
    picture: Callable[[Params, Result, str], str] | None = None


@dataclass(frozen=True)
class Operation:
    """One operation. ``doc``: summary line, blank line, description. ``area``: the /v1 blueprint (its tag).
    ``prepare(params, limits)`` makes one validated request ready, once: sized and checked against the limits
    before any compute, with what it found on the way (service.operations.inputs.Prepared); ``compute(prepared)``
    computes it (:meth:`answer` rounds it as the endpoint answers). ``stacked``: the inputs /v1/batch stacks along a
    new axis to compute a group in one call (empty: one by one). ``per_head_mask``: its mask may carry a head axis
    (engine.is_per_head). ``batch_request``: the body schema of a batch item (None: not in /v1/batch). ``path``:
    under /v1, may hold a path parameter (``<model>``) that ``path_parameters`` resolves (a model's name to the
    served model: an unknown one is a 404) into the params; ``path_example`` gives its value for the documented
    example. ``grouping``: how /v1/batch groups items that have nothing to stack (a model's texts). ``events``: the
    answer as server-sent events (text/event-stream), for a request with ``stream: true``."""

    name: str
    area: str
    doc: str
    request: type[Schema]
    response: type[Schema]
    prepare: Callable[[Params, Limits], Prepared]
    compute: Callable[[Prepared], Result]
    example: dict[str, Any]
    grouping: Grouping | None = None
    method: str = "POST"
    stacked: tuple[str, ...] = ()
    per_head_mask: bool = False
    drawing: Drawing | None = None
    batch_request: type[Schema] | None = None
    v2: V2Model | None = None
    path: str = ""
    path_parameters: dict[str, Callable[[str], Any]] = field(default_factory=dict)
    path_example: dict[str, str] = field(default_factory=dict)
    events: Callable[[Prepared], Iterator[bytes]] | None = None

    @property
    def route(self) -> str:
        """The /v1 path of the operation."""
        return self.path or f"/{self.name}"

    def resolved(self, params: Params) -> Params:
        """``params`` with its path parameters resolved (a batch item names its model in its body)."""
        if not self.path_parameters:  # most operations: no copy, on every batch item
            return params
        return {**params, **{name: resolve(params[name]) for name, resolve in self.path_parameters.items()}}

    def answer(self, params: Params, limits: Limits) -> Result:
        """The endpoint's answer to validated, resolved ``params``: prepared, computed, rounded to its decimals."""
        return round_arrays(self.compute(self.prepare(params, limits)), params.get("decimals"))


SENTENCE = ["the", "cat", "ate", "food", "it"]
ONE_HOT = [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]


def _attention_params(inputs: Arrays, parameters: dict[str, Any]) -> Params:
    return {**inputs, "mask": inputs.get("mask"), **parameters}


def _multi_head_params(inputs: Arrays, parameters: dict[str, Any]) -> Params:
    return {"embeddings": inputs["embeddings"], "mask": None, "n_heads": parameters["num_heads"],
            "seed": parameters["seed"], "causal": parameters["causal"],
            "positional_encoding": parameters["positional_encoding"]}


OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    Operation(
        "attention", "attention", """Scaled dot-product attention.

softmax(Q K^T * scale) V on explicit Q, K, V (scale defaults to 1/sqrt(d_k)). The example is the
seed's demo 1: the query "it" against the raw toy embeddings. A query row whose keys are all
masked gets zero weights and a zero output.""",
        AttentionRequest, AttentionResponse, attention.prepare, attention.compute,
        {"query": [[0.0, 0.0, 0.0, 1.0]], "key": ONE_HOT, "value": ONE_HOT, "decimals": 4},
        stacked=("query", "key", "value"), batch_request=AttentionRequest,
        drawing=Drawing("Scaled dot-product attention weights", (), (), attention.settings),
        v2=V2Model(
            "scaled_dot_product_attention",
            "softmax(Q K^T * scale) V, as POST /v1/attention. Parameters: scale (number, default 1/sqrt(d_k)), "
            "causal (bool). FP32 or FP64 (all alike), rank 2 or 3 (leading batch dim); mask is BOOL, "
            "true = may attend, broadcastable to [B, n_q, n_k].",
            (TensorSpec("query", FLOATS, BATCHABLE, "[n_q, d_k] or [B, n_q, d_k]"),
             TensorSpec("key", FLOATS, BATCHABLE, "[n_k, d_k] or [B, n_k, d_k]"),
             TensorSpec("value", FLOATS, BATCHABLE, "[n_k, d_v] or [B, n_k, d_v]"),
             TensorSpec("mask", ("BOOL",), (1, 2, 3), "broadcastable to [B, n_q, n_k]", required=False)),
            (TensorSpec("output", FLOATS, BATCHABLE, "[n_q, d_v] or [B, n_q, d_v]"),
             TensorSpec("weights", FLOATS, BATCHABLE, "[n_q, n_k] or [B, n_q, n_k]")),
            AttentionParameters, _attention_params)),
    Operation(
        "self-attention", "attention", """Single-head self-attention.

Q, K and V are projections of the same input (embeddings, or toy-vocabulary tokens) by W_q, W_k,
W_v drawn as the seed script does from `seed` (or given in `weights`).""",
        SelfAttentionRequest, ModelResponse, sized(layers.work_self_attention), layers.compute_self_attention,
        {"tokens": ["cat", "ate", "food"], "positional_encoding": True, "causal": True, "seed": 3, "decimals": 4},
        stacked=("embeddings",), drawing=Drawing("Self-attention weights", (), (), layers.settings),
        batch_request=SelfAttentionRequest),
    Operation(
        "multi-head-attention", "attention", """Multi-head attention.

n_heads heads of width d_model / n_heads (head i seeded with seed + i, W_o with seed + 99),
concatenated and mixed by W_o. The example is the seed's demo 5: the same per-head weights.""",
        MultiHeadRequest, ModelResponse, sized(layers.work_multi_head), layers.compute_multi_head,
        {"tokens": SENTENCE, "d_model": 8, "n_heads": 4, "positional_encoding": True, "causal": True,
         "decimals": 3},
        stacked=("embeddings",), per_head_mask=True, batch_request=MultiHeadRequest,
        drawing=Drawing("Multi-head attention weights", (), ("head",), layers.settings, layers.heads_mask),
        v2=V2Model(
            "multi_head_attention",
            "Multi-head self-attention with the seeded weights, as POST /v1/multi-head-attention. Parameters: "
            "num_heads (int, required), seed (int, default 0: the seed script's weights), causal, "
            "positional_encoding (bools). embeddings FP32 or FP64.",
            (TensorSpec("embeddings", FLOATS, BATCHABLE, "[n, d_model] or [B, n, d_model]"),),
            (TensorSpec("output", FLOATS, BATCHABLE, "[n, d_model] or [B, n, d_model]"),
             TensorSpec("weights", FLOATS, (3, 4), "[h, n, n] or [B, h, n, n]")),
            MultiHeadParameters, _multi_head_params)),
    Operation(
        "encoder", "attention", """A stack of transformer encoder blocks.

Each block: multi-head attention, add & norm, position-wise feed-forward (ReLU), add & norm.
Returns the final output and each layer's attention weights.""",
        EncoderRequest, EncoderResponse, sized(layers.work_encoder), layers.compute_encoder,
        {"tokens": ["cat", "ate", "food"], "d_model": 8, "n_heads": 2, "n_layers": 2, "decimals": 3},
        stacked=("embeddings",), per_head_mask=True,
        drawing=Drawing("Encoder attention weights", ("layer",), ("head",), layers.settings,
                        layers.heads_mask), batch_request=EncoderRequest),
    Operation(
        "embed", "reference", """Embed tokens.

One row per token from the toy vocabulary, zero-padded to d_model, plus the positional encoding
when asked. Unknown tokens are a 422 listing the known ones.""",
        EmbedRequest, EmbedResponse, sized(reference.work_embed), reference.compute_embed,
        {"tokens": ["cat", "it"], "d_model": 6, "positional_encoding": True, "decimals": 4},
        batch_request=EmbedRequest),
    Operation(
        "positional-encoding", "reference", """Sinusoidal positional encoding.

PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same angle), section 3.5.""",
        PositionalEncodingQuery, PositionalEncodingResponse, sized(reference.work_positional_encoding),
        reference.compute_positional_encoding, {"n_positions": 3, "d_model": 4, "decimals": 4}, method="GET",
        batch_request=PositionalEncodingBody),
    Operation(
        "causal-mask", "reference", """Causal mask.

Lower-triangular booleans: row i may attend to columns 0..i (true = may attend).""",
        CausalMaskQuery, CausalMaskResponse, sized(reference.work_causal_mask), reference.compute_causal_mask,
        {"size": 3}, method="GET"),
    Operation(
        "model-attention", "models", """A trained model's attention on any text.

The text through the model's own tokenizer and its n_layers x n_heads attention heads, computed by the
numpy engine, equal to transformers (GET /v1/models lists what is served). An encoder (BertModel) reads
a text, or a pair (text_pair); a decoder (LlamaForCausalLM, causal: each token attends only to itself
and those before it) reads a text, or a chat's messages through its chat template. Returns the tokens,
the last hidden state and, for the selected layers and heads (default all), the weights (h, n, n) as
/v1/encoder's layers. The example: layer 0, head 0 of "the dog ate".""",
        ModelAttentionRequest, ModelAttentionResponse, pretrained.prepare, pretrained.compute,
        {"text": "the dog ate", "layers": [0], "heads": [0], "decimals": 3},
        drawing=Drawing("Attention weights", ("layer",), ("head",), pretrained.settings,
                        causal=pretrained.is_causal),
        batch_request=ModelAttentionItem,
        path="/models/<model>/attention", path_parameters={"model": catalogue.lookup},
        path_example={"model": DEFAULT_NAME},
        grouping=Grouping(pretrained.group_key, pretrained.compute_many)),
    Operation(
        "generate", "models", """A decoder continuing a prompt or a chat, token by token, every step shown.

Greedy (temperature 0, the default) or drawn after temperature, top-k and top-p with a seeded PCG64. Each
step gives its token, its log-probability and the candidates before the filters (with what the filters
kept); with layers or heads, the new token's own attention row over every token so far; with logit_lens,
what each layer would have predicted. The text ends at the end-of-text token, a stop string or
max_new_tokens. `stream: true` answers server-sent events, a step each as it is computed. The example: the
first tokens of SmolLM2's answer to a question, with layer 13's head 8.""",
        GenerateRequest, GenerateResponse, generation.prepare, generation.compute,
        {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_new_tokens": 4,
         "layers": [13], "heads": [8], "top_logprobs": 2, "seed": 0, "decimals": 3},
        drawing=Drawing("Attention of the generated tokens", ("layer",), ("head",), generation.settings,
                        causal=pretrained.is_causal, arranged=generation.arranged),
        batch_request=GenerateItem,
        path="/models/<model>/generate", path_parameters={"model": catalogue.lookup},
        path_example={"model": DECODER_NAME}, events=generation.events),
    Operation(
        "model-explain", "models", """Beyond raw weights: rollout, flow, norms, head knockout and token occlusion.

A head's weights say where it looks, not what it moves, and a token reaches the output through every
layer. methods: rollout (Abnar & Zuidema 2020: per layer 0.5 mean over heads of the weights + 0.5 I,
rows renormalised, multiplied from the first layer up; (n, n) after each selected layer), flow (same
paper: the maximum flow from each input token to each last-layer position through those layers, (n, n),
at most max_flow_tokens tokens) and norms (Kobayashi et al. 2020: ||alpha f(x)||, what each selected
head and the whole layer move from each key into each query; per selected layer (h_sel, n, n) and
(n, n)). What a head or a token matters, by running the model again without it: knockout (Michel et al.
2019: each head of knock, default every one, with its output before W_O zeroed; at most max_knockouts)
and occlusion (each token in turn: an encoder reads [MASK] in its place, a decoder's prompt loses it);
an encoder's runs are compared by the cosine distance of the mean-pooled sentence embeddings and the
largest change of a position's last hidden state, a decoder's by the KL divergence of the next-token
distribution and whether its top token changed; every run together at most max_rerun_tokens tokens
through a layer. The input is read as by POST /v1/models/{model}/attention. The example: rollout after
the last layer (5) and the norms of its head 0 on "the dog ate".""",
        ExplainRequest, ExplainResponse, analyses.prepare, analyses.compute,
        {"text": "the dog ate", "methods": ["rollout", "norms"], "layers": [5], "heads": [0], "decimals": 3},
        drawing=Drawing("Beyond raw weights", ("layer",), ("head",), pretrained.settings,
                        causal=pretrained.is_causal, picture=analyses.picture),
        batch_request=ExplainItem,
        path="/models/<model>/explain", path_parameters={"model": catalogue.lookup},
        path_example={"model": DEFAULT_NAME}),
    Operation(
        "census", "models", """Where each head looks, on average, over many texts: a head census.

Clark et al. 2019 ("What Does BERT Look At?"): per layer and head, averaged over every query row of
every text, the weight on position 0 ([CLS], or a decoder's first token), on separator tokens ([SEP];
none for a decoder), on the row's own position, on the previous and the next position (rows that have
one), on punctuation tokens, and the row's entropy in nats; each with the count of rows it averages, so
that censuses combine exactly (mean = sum(mean_i * count_i) / sum(count_i): a larger corpus goes through
a batch job, a line per chunk of texts). Each text is read as POST /v1/models/{model}/attention reads its
text; at most max_census_texts texts. The example: three sentences on all-MiniLM-L6-v2.""",
        CensusRequest, CensusResponse, census.prepare, census.compute,
        {"texts": ["The cat sat on the mat.", "Where did it go?", "It rained, so we stayed in."], "decimals": 3},
        batch_request=CensusItem,
        path="/models/<model>/census", path_parameters={"model": catalogue.lookup},
        path_example={"model": DEFAULT_NAME}),
)}
BATCH_OPERATIONS = {name: op for name, op in OPERATIONS.items() if op.batch_request is not None}
V2_MODELS = {op.v2.name: op for op in OPERATIONS.values() if op.v2 is not None}
