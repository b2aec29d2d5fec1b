"""Pure compute functions: validated params (a schema's ``load`` output) -> result dict of arrays.

Each ``compute_*(params, limits)`` first checks the shapes against ``limits`` (422 before any
compute), then calls the engine. No Flask here, so a batch endpoint can call them per item;
``ENDPOINTS`` maps each endpoint name to its request schema and compute function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from marshmallow import Schema

import attention as engine
from schemas.attention import AttentionRequest
from schemas.models import EncoderRequest, MultiHeadRequest, SelfAttentionRequest
from schemas.reference import CausalMaskQuery, EmbedRequest, PositionalEncodingQuery
from service.operations.limits import Limits
from service.problems import UNKNOWN_TOKEN, LimitExceeded, ValidationProblem, pointer
from service.runtime import metrics

Params = dict[str, Any]
Result = dict[str, Any]


def _cast(array: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """The input in the requested precision; values that overflow float32 are refused. An array that
    is float32 already (a v2 FP32 tensor, checked finite when decoded) is used as it is: no copy."""
    if dtype == "float64" or array.dtype == np.float32:
        return array
    with np.errstate(over="ignore"):
        cast = array.astype(np.float32)
    if not np.isfinite(cast).all():
        raise ValidationProblem.at(pointer(*name.split(".")), f"{name} has values beyond the float32 range.")
    return cast


def batch_size(*arrays: np.ndarray | None, core: int = 2) -> int:
    """Largest product of leading (batch/head) axes among the arrays, core axes excluded."""
    largest = 1
    for array in arrays:  # a loop, not max(<generator>): on every request
        if array is not None:
            largest = max(largest, math.prod(array.shape[:-core]))
    return largest


def _run(params: Params, call: Callable[[bool], tuple], trace: Callable[[], engine.AttentionTrace]) -> Result:
    """{output, weights, trace?}: ``call(return_weights)`` normally, ``trace()`` with trace=true.

    weights is null unless ``return_weights``.
    """
    extra = {}
    if params["trace"]:
        stages = trace().as_dict()
        output, weights = stages.pop("output"), stages["weights"]  # the output is the answer's, not the trace's
        extra["trace"] = stages
    else:
        output, weights = call(params["return_weights"])
    return {"output": output, "weights": weights if params["return_weights"] else None, **extra}


def compute_attention(params: Params, limits: Limits) -> Result:
    """softmax(Q K^T * scale) V. Q (B?, n_q, d_k), K (B?, n_k, d_k), V (B?, n_k, d_v), mask (.., n_q, n_k).

    -> output (B?, n_q, d_v), weights (B?, n_q, n_k), trace {scores, scaled_scores, masked_scores, weights}.
    """
    q, k, v = (_cast(params[name], params["dtype"], name) for name in ("query", "key", "value"))
    mask = params["mask"]
    for name, array in (("query", q), ("key", k), ("value", v)):
        limits.check("max_sequence_length", array.shape[-2], pointer=pointer(name))
        limits.check("max_d_model", array.shape[-1], pointer=pointer(name))
    batch = batch_size(q, k, v, mask if mask is not None and mask.ndim > 2 else None)
    elements = _check_elements(params, batch * q.shape[-2] * k.shape[-2], limits, pointer("query"))
    # B * n_q * d_v: mostly the batch of queries (over one shared key and value) makes it large
    limits.check("max_output_elements", batch * q.shape[-2] * v.shape[-1], pointer=pointer("query"))
    options = {"scale": params["scale"], "causal": params["causal"]}
    with _EngineCall(("query",), _scores_culprits, params, elements):
        return _run(params, lambda weights: engine.scaled_dot_product_attention(q, k, v, mask, return_weights=weights,
                                                                                **options),
                    lambda: engine.trace_attention(q, k, v, mask, **options))


def _tokens(tokens: list[str], d_model: int | None) -> np.ndarray:
    """(n, d_model) toy embeddings; unknown words are 422 pointing at each one, listing the known."""
    try:
        return engine.embed(tokens, d_model)
    except engine.UnknownTokenError as exc:
        errors = [{"pointer": pointer("tokens", i), "detail": f"unknown token {word!r}"}
                  for i, word in enumerate(tokens) if word in exc.unknown]
        raise ValidationProblem(f"Unknown tokens {exc.unknown}; known: {exc.known}.",
                                problem_type=UNKNOWN_TOKEN, errors=errors, known=exc.known) from None


def input_member(params: Params) -> str:
    """The request member that holds the input sentence: ``tokens`` or ``embeddings``."""
    return "tokens" if "tokens" in params else "embeddings"


def check_tokens(params: Params, limits: Limits) -> None:
    """The sentence's length and width limits, before its tokens are embedded."""
    limits.check("max_sequence_length", len(params["tokens"]), pointer=pointer("tokens"))
    limits.check("max_d_model", params.get("d_model", 4), pointer=pointer("d_model"))


def sentence(params: Params, limits: Limits) -> np.ndarray:
    """The input X (B?, n, d_model) from ``embeddings`` or ``tokens``, plus positional encoding, cast."""
    if "tokens" in params:
        check_tokens(params, limits)
        x, where = _tokens(params["tokens"], params.get("d_model")), "tokens"
    else:
        x, where = params["embeddings"], "embeddings"
        if params.get("d_model", x.shape[-1]) != x.shape[-1]:
            raise ValidationProblem.at(pointer("d_model"), f"d_model={params['d_model']} differs from the "
                                       f"embeddings' last dimension {x.shape[-1]}.")
        limits.check("max_sequence_length", x.shape[-2], pointer=pointer(where))
        limits.check("max_d_model", x.shape[-1], pointer=pointer(where))
    if params["positional_encoding"]:
        x = x + engine.positional_encoding(x.shape[-2], x.shape[-1])
    return _cast(x, params["dtype"], where)


TRACE_STAGES = 4  # a trace returns scores, scaled scores, masked scores and weights: four n*n arrays
LAYER_TRACE_ARRAYS = 3  # and a layer's trace q, k, v along the positions
ENCODER_TRACE_ARRAYS = 7  # an encoder layer's: q, k, v, the heads mixed by W_o, add & norm, feed-forward, output


def weight_arrays(params: Params) -> int:
    """How many n*n arrays of attention weights a request computes or returns: one, or with trace its
    TRACE_STAGES and, unless return_weights is false, the weights once more beside the trace."""
    return TRACE_STAGES + params.get("return_weights", True) if params.get("trace") else 1


def _check_elements(params: Params, elements: int, limits: Limits, where: str) -> int:
    """A request's attention weights against the limits before any compute: max_weight_elements (times
    :func:`weight_arrays`), and max_heatmap_cells when the answer is their picture (``format`` svg, set by
    the view). Returns ``elements``, to count once the engine has answered (metrics.count_elements)."""
    _check_copies(limits, "max_weight_elements", elements, weight_arrays(params), where)
    if params.get("format") == "svg":
        limits.check("max_heatmap_cells", elements, parameter="format")
    return elements


def _check_weights(x: np.ndarray, params: Params, heads: int, limits: Limits, layers: int = 1, *,
                   per_head_mask: bool = False) -> int:
    """B * h * n * n (* layers) attention weights of X (B?, n, d_model), see :func:`_check_elements`.

    ``per_head_mask``: a mask with one axis more than X is one mask per head (multi-head attention):
    that axis is h, counted once, not a batch axis.
    """
    limits.check("max_heads", heads, pointer=pointer("n_heads"))
    mask = params["mask"]
    if mask is not None and per_head_mask and mask.ndim == x.ndim + 1:
        mask = mask[..., 0, :, :]                                   # drop the head axis (a view)
    batch = batch_size(x, mask if mask is not None and mask.ndim > 2 else None)
    return _check_elements(params, batch * heads * x.shape[-2] ** 2 * layers, limits, pointer(input_member(params)))


def _check_positions(x: np.ndarray, width: int, params: Params, limits: Limits, width_name: str | None = None,
                     arrays: int = 1) -> None:
    """``arrays`` * B * n * width numbers computed along the positions of X (B?, n, d_model) against
    max_output_elements: what a layer returns (its output, and with trace q, k, v and the encoder's other stages)
    and the encoder's feed-forward layer (width d_ff), computed but not returned. The input's own size says
    little: without this, embeddings of 2^20 one-number positions and d_k = 512 passed every limit and asked for
    4 GiB per array, and a 0.8 MB body of 6-layer encoder trace answered 327 MB of JSON (42 arrays of the
    input's size, each number written in ~20 bytes, not 2). ``width_name`` is blamed if the request gives it,
    else the input."""
    where = width_name if width_name in params else input_member(params)
    _check_copies(limits, "max_output_elements", batch_size(x) * x.shape[-2] * width, arrays, pointer(where))


def _check_copies(limits: Limits, name: str, size: int, copies: int, where: str) -> None:
    """``copies`` times ``size`` numbers against the limit ``name``, blaming ``where``. More than one copy is
    what trace=true asks for (each stage is another array of that size), so when one copy alone is within this
    limit, /trace is blamed too. (Only this limit: without the trace, another may still refuse the request.)"""
    try:
        limits.check(name, size * copies, pointer=where)
    except LimitExceeded as exc:
        if copies > 1 and size <= getattr(limits, name):
            exc.members["errors"].append({"pointer": pointer("trace"), "detail": (
                f"trace=true counts {copies} x {size} numbers against {name}; without it, {size}.")})
        raise


class _EngineCall:
    """Around the engine call of a request whose ``elements`` attention weights passed the limits: counted
    (metrics.count_elements) once it answers; engine errors about one of ``arguments`` (e.g. an overflow)
    point at every request member that may have caused them, ``culprits(params)`` (JSON Pointers, built only
    then); other errors propagate unchanged. (A class, not @contextmanager: a generator costs more.)"""

    def __init__(self, arguments: tuple[str, ...], culprits: Callable[[Params], list[str]], params: Params,
                 elements: int) -> None:
        self.arguments, self.culprits, self.params, self.elements = arguments, culprits, params, elements

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, traceback: Any) -> None:
        if exc is None:
            metrics.count_elements(self.elements)
        elif isinstance(exc, engine.AttentionError) and exc.argument in self.arguments:
            errors = [{"pointer": where, "detail": exc.detail} for where in self.culprits(self.params)]
            raise ValidationProblem(exc.detail, errors=errors) from None


def _scores_culprits(params: Params) -> list[str]:
    """Scores that overflowed are q . k * scale: any of the three may be too large (the engine says "query")."""
    return [pointer(name) for name in ("query", "key", "scale") if name != "scale" or params["scale"] is not None]


def _input_culprits(params: Params) -> list[str]:
    """A layer's input (X, or the Q, K, V projected from it) is the request's ``embeddings`` or ``tokens``, and
    its explicit ``weights`` if any (as likely to have made the numbers overflow)."""
    given = [pointer(input_member(params))]
    return [*given, pointer("weights")] if params.get("weights") else given


LAYER_INPUTS = ("X", "query", "key", "value")  # what the layers call their input and its projections


def _run_layer(layer: engine.SelfAttention | engine.MultiHeadAttention, x: np.ndarray, params: Params,
               elements: int) -> Result:
    """The layer's answer; its ``elements`` attention weights counted once it has answered."""
    options = {"mask": params["mask"], "causal": params["causal"]}
    with _EngineCall(LAYER_INPUTS, _input_culprits, params, elements):
        return _run(params, lambda weights: layer(x, return_weights=weights, **options),
                    lambda: layer.trace(x, **options))


def _weights(params: Params) -> dict[str, np.ndarray]:
    """The explicit weights, if any, in the requested precision (float32: within its range)."""
    return {name: _cast(w, params["dtype"], f"weights.{name}") for name, w in (params.get("weights") or {}).items()}


def width_of_self_attention(params: Params) -> int | None:
    """Self-attention's d_k: given, else the explicit W_q's, else None (the engine's default, d_model)."""
    weights = params.get("weights")
    return params.get("d_k") or (weights["w_q"].shape[-1] if weights else None)


def compute_self_attention(params: Params, limits: Limits) -> Result:
    """One head: X (B?, n, d_model) -> output (B?, n, d_k), weights (B?, n, n), trace adds q, k, v."""
    x = sentence(params, limits)
    weights = _weights(params)
    d_k = width_of_self_attention(params)
    limits.check("max_d_model", d_k or 0, pointer=pointer("d_k"))
    elements = _check_weights(x, params, 1, limits)
    _check_positions(x, d_k or x.shape[-1], params, limits, "d_k", 1 + LAYER_TRACE_ARRAYS * params["trace"])
    layer = engine.SelfAttention(x.shape[-1], d_k, params["seed"], **weights)
    return _run_layer(layer, x, params, elements)


def compute_multi_head(params: Params, limits: Limits) -> Result:
    """h heads: X (B?, n, d_model) -> output (B?, n, d_model), weights (B?, h, n, n), trace per head."""
    x = sentence(params, limits)
    elements = _check_weights(x, params, params["n_heads"], limits, per_head_mask=True)
    _check_positions(x, x.shape[-1], params, limits, arrays=1 + LAYER_TRACE_ARRAYS * params["trace"])
    layer = engine.MultiHeadAttention(x.shape[-1], params["n_heads"], params["seed"], **_weights(params))
    return _run_layer(layer, x, params, elements)


def compute_encoder(params: Params, limits: Limits) -> Result:
    """n_layers encoder blocks: X (B?, n, d_model) -> output (B?, n, d_model), layers [{weights (B?, h, n, n)}]."""
    x = sentence(params, limits)
    limits.check("max_layers", params["n_layers"], pointer=pointer("n_layers"))
    d_ff = params.get("d_ff", 4 * x.shape[-1])
    limits.check("max_d_ff", d_ff, pointer=pointer("d_ff"))
    elements = _check_weights(x, params, params["n_heads"], limits, params["n_layers"], per_head_mask=True)
    _check_positions(x, d_ff, params, limits, "d_ff")
    traced = ENCODER_TRACE_ARRAYS * params["n_layers"] * params["trace"]  # every layer's stages
    _check_positions(x, x.shape[-1], params, limits, arrays=1 + traced)
    encoder = engine.Encoder(x.shape[-1], params["n_heads"], params["n_layers"], params.get("d_ff"), params["seed"])
    options = {"mask": params["mask"], "causal": params["causal"]}
    with _EngineCall(LAYER_INPUTS, _input_culprits, params, elements):
        if params["trace"]:
            layers = encoder.trace(x, **options)
            return {"output": layers[-1].output, "layers": [
                {"weights": t.attention.weights if params["return_weights"] else None, "trace": t.as_dict()}
                for t in layers]}
        output, weights = encoder(x, return_weights=params["return_weights"], **options)
        return {"output": output, "layers": [{"weights": w} for w in weights]}


def compute_embed(params: Params, limits: Limits) -> Result:
    """tokens (n,) -> embeddings (n, d_model), positional encoding added when asked."""
    return {"embeddings": sentence(params, limits)}


def compute_positional_encoding(params: Params, limits: Limits) -> Result:
    """n_positions, d_model -> encoding (n_positions, d_model)."""
    limits.check("max_sequence_length", params["n_positions"], parameter="n_positions")
    limits.check("max_d_model", params["d_model"], parameter="d_model")
    return {"encoding": engine.positional_encoding(params["n_positions"], params["d_model"])}


def compute_causal_mask(params: Params, limits: Limits) -> Result:
    """size -> mask (size, size) lower-triangular booleans."""
    limits.check("max_sequence_length", params["size"], parameter="size")
    return {"mask": engine.causal_mask(params["size"])}


class Endpoint(NamedTuple):
    """What a batch item of this kind is validated with and computed by."""

    schema: type[Schema]
    compute: Callable[[Params, Limits], Result]


ENDPOINTS: dict[str, Endpoint] = {
    "attention": Endpoint(AttentionRequest, compute_attention),
    "self-attention": Endpoint(SelfAttentionRequest, compute_self_attention),
    "multi-head-attention": Endpoint(MultiHeadRequest, compute_multi_head),
    "encoder": Endpoint(EncoderRequest, compute_encoder),
    "embed": Endpoint(EmbedRequest, compute_embed),
    "positional-encoding": Endpoint(PositionalEncodingQuery, compute_positional_encoding),
    "causal-mask": Endpoint(CausalMaskQuery, compute_causal_mask),
}
