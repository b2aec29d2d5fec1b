"""Attention layers on a sentence: self-attention, multi-head attention and the encoder stack.

Each operation is a ``work_*`` (what it computes, from shapes: service.operations.sizes; the registry prepares a
request by it) and a ``compute_*`` (runs the engine's layer on the prepared request's sentence).
"""

from __future__ import annotations

import numpy as np

import attention as engine
from service.operations import analyses, sizes
from service.operations.inputs import (
    EngineCall,
    Prepared,
    Result,
    answer,
    explicit_weights,
    input_member,
    masking,
    sentence,
    sentence_dims,
    sentence_shape,
)
from service.operations.sizes import ENCODER_TRACE_ARRAYS, LAYER_TRACE_ARRAYS, Along, Params, Work
from service.problems import pointer

LAYER_INPUTS = ("X", "query", "key", "value")  # what the layers call their input and its projections


def _weighing(params: Params, heads: int, n: int, layers: int = 1, *, per_head_mask: bool = False) -> dict:
    """The Work fields of B * h * n * n (* layers) weights; B counts a mask's batch axes too. ``per_head_mask``:
    a mask with one axis more than X is one mask per head (engine.is_per_head), whose head axis is not a batch."""
    x_ndim = 2 if "tokens" in params else params["embeddings"].ndim
    mask = params["mask"]
    if mask is not None and per_head_mask and engine.is_per_head(mask.ndim, x_ndim):
        mask = mask[..., 0, :, :]                                   # drop the head axis (a view)
    batch = sizes.batch_size(params.get("embeddings"), mask if mask is not None and mask.ndim > 2 else None)
    return sizes.weighing(params, batch * heads * n * n * layers, pointer(input_member(params)))


def _draws(params: Params, op: str, d_model: int, drawn: int) -> tuple | None:
    """The seeded layer's key and the random numbers it draws; explicit weights draw none."""
    if params.get("weights"):
        return None
    return (op, params["seed"], d_model, params.get("d_k"), params.get("n_heads"), params.get("n_layers"),
            params.get("d_ff")), drawn


def width_of_self_attention(params: Params) -> int | None:
    """Self-attention's d_k: given, else the explicit W_q's, else None (the engine's default, d_model)."""
    weights = params.get("weights")
    return params.get("d_k") or (weights["w_q"].shape[-1] if weights else None)


def work_self_attention(params: Params) -> Work:
    """One head: B * n * n weights, B * n * d_k outputs (and q, k, v with trace), 3 * d_model * d_k projections."""
    batch, n, d = sentence_shape(params)
    d_k = width_of_self_attention(params)
    dims = (*sentence_dims(params, n, d), ("max_d_model", d_k or 0, pointer("d_k")),
            ("max_heads", 1, pointer("n_heads")))
    width, where = d_k or d, pointer("d_k" if "d_k" in params else input_member(params))
    output = Along(batch * n * width, 1 + LAYER_TRACE_ARRAYS * params["trace"], where)
    projections = Along(3 * d * width, int(params["trace"]), pointer("trace"), checked=False)  # trace: w_q, w_k, w_v
    return Work(dims, **_weighing(params, 1, n), along=(output, projections), macs=batch * n * 3 * d * width,
                draws=_draws(params, "self-attention", d, 3 * d * width))


def compute_self_attention(prepared: Prepared) -> Result:
    """One head: X (B?, n, d_model) -> output (B?, n, d_k), weights (B?, n, n), trace adds q, k, v."""
    params = prepared.params
    x = sentence(params)
    layer = engine.SelfAttention(x.shape[-1], width_of_self_attention(params), params["seed"],
                                 **explicit_weights(params))
    return _run_layer(layer, x, params, prepared.work.weights)


def work_multi_head(params: Params) -> Work:
    """h heads: B * h * n * n weights, B * n * d_model outputs (and q, k, v with trace), 4 * d_model^2 weights."""
    batch, n, d = sentence_shape(params)
    heads = params["n_heads"]
    dims = (*sentence_dims(params, n, d), ("max_heads", heads, pointer("n_heads")))
    output = Along(batch * n * d, 1 + LAYER_TRACE_ARRAYS * params["trace"], pointer(input_member(params)))
    projections = Along(4 * d * d, int(params["trace"]), pointer("trace"), checked=False)  # trace: w_q, w_k, w_v, w_o
    return Work(dims, **_weighing(params, heads, n, per_head_mask=True), along=(output, projections),
                macs=batch * n * 4 * d * d,
                draws=_draws(params, "multi-head-attention", d, 4 * d * d))


def compute_multi_head(prepared: Prepared) -> Result:
    """h heads: X (B?, n, d_model) -> output (B?, n, d_model), weights (B?, h, n, n), trace per head."""
    params = prepared.params
    x = sentence(params)
    layer = engine.MultiHeadAttention(x.shape[-1], params["n_heads"], params["seed"], **explicit_weights(params))
    return _run_layer(layer, x, params, prepared.work.weights)


def _run_layer(layer: engine.SelfAttention | engine.MultiHeadAttention, x: np.ndarray, params: Params,
               elements: int) -> Result:
    """The layer's answer; its ``elements`` attention weights counted once it has answered."""
    options = {"mask": params["mask"], "causal": params["causal"]}
    with EngineCall(LAYER_INPUTS, _input_culprits, params, elements):
        result = answer(params, lambda weights: layer(x, return_weights=weights, **options),
                        lambda: layer.trace(x, **options))
    if params["trace"]:  # the weights behind every stage, so each number can be checked by hand
        result["trace"].update(layer.weights_in(result["output"].dtype))
    return result


def _input_culprits(params: Params) -> list[str]:
    """A layer's input (X, or the Q, K, V projected from it) is the request's ``embeddings`` or ``tokens``, and
    its explicit ``weights`` if any (as likely to have made the numbers overflow)."""
    given = [pointer(input_member(params))]
    return [*given, pointer("weights")] if params.get("weights") else given


def work_encoder(params: Params) -> Work:
    """L blocks of h heads: B * h * n * n * L weights; per layer B * n * d_ff hidden numbers, computed only;
    B * n * d_model outputs (and 7 arrays a layer with trace); 4 * d_model^2 + 2 * d_model * d_ff weights a layer."""
    batch, n, d = sentence_shape(params)
    heads, layers = params["n_heads"], params["n_layers"]
    d_ff = params.get("d_ff", 4 * d)
    dims = (*sentence_dims(params, n, d), ("max_layers", layers, pointer("n_layers")),
            ("max_d_ff", d_ff, pointer("d_ff")), ("max_heads", heads, pointer("n_heads")))
    where = pointer(input_member(params))
    hidden = Along(batch * n * d_ff, 1, pointer("d_ff") if "d_ff" in params else where, returned=False, repeat=layers)
    output = Along(batch * n * d, 1 + ENCODER_TRACE_ARRAYS * layers * params["trace"], where)
    per_layer = 4 * d * d + 2 * d * d_ff  # Q, K, V, W_o, then W_1, W_2
    weighing = _weighing(params, heads, n, layers, per_head_mask=True)
    methods = params.get("methods") or ()
    along, fewer = [hidden, output], ()
    if methods:  # the maps returned count with the weights (as explain's), and once more as returned
        items = weighing["weights"] // (heads * n * n * layers)  # B, a mask's batch axes counted
        maps = analyses.maps(methods, n, layers, heads, items)
        weighing["weights"] += maps
        along.append(Along(maps, 1, pointer("methods"), checked=False))
        if "norms" in methods:  # each layer's transformed values f_h(x_j), (B, h, n, d_model)
            along.append(Along(items * heads * n * d, 1, where, returned=False, repeat=layers))
        fewer = (pointer("methods"),)
    return Work(dims, **weighing, along=tuple(along), macs=batch * n * layers * per_layer,
                draws=_draws(params, "encoder", d, layers * per_layer), fewer=fewer)


def compute_encoder(prepared: Prepared) -> Result:
    """n_layers encoder blocks: X (B?, n, d_model) -> output (B?, n, d_model), layers [{weights (B?, h, n, n)}]."""
    params = prepared.params
    x = sentence(params)
    encoder = engine.Encoder(x.shape[-1], params["n_heads"], params["n_layers"], params.get("d_ff"), params["seed"])
    options = {"mask": params["mask"], "causal": params["causal"]}
    methods = params.get("methods")
    with EngineCall(LAYER_INPUTS, _input_culprits, params, prepared.work.weights):
        if params["trace"]:  # never with methods (schemas.models.EncoderRequest)
            layers = encoder.trace(x, **options)
            return {"output": layers[-1].output, "layers": [
                {"weights": t.attention.weights if params["return_weights"] else None, "trace": t.as_dict()}
                for t in layers]}
        if not methods:
            output, weights = encoder(x, return_weights=params["return_weights"], **options)
            return {"output": output, "layers": [{"weights": w} for w in weights]}
        if "norms" in methods:
            out = encoder.with_norms(x, **options)
            output, weights, norms = out.output, out.weights, out.norms
        else:
            (output, weights), norms = encoder(x, **options), None
        every = list(range(params["n_layers"]))
        return {"output": output, "layers": [{"weights": w if params["return_weights"] else None} for w in weights],
                **analyses.analysed(methods, weights, norms, every, list(range(params["n_heads"])))}


def settings(params: Params, result: Result) -> list[str]:
    """The run's settings a picture of a layer's weights states: its widths, the seed (or explicit weights),
    positional encoding, causal, the mask."""
    d_model = sentence_shape(params)[2]
    widths = [f"d_model: {d_model}"]
    if "n_layers" in params:
        widths += [f"layers: {params['n_layers']}", f"d_ff: {params.get('d_ff', 4 * d_model)}"]
    if "n_heads" in params:
        widths.append(f"heads: {params['n_heads']}")
    else:
        widths.append(f"d_k: {width_of_self_attention(params) or d_model}")
    drawn = "weights: given" if params.get("weights") else f"seed: {params['seed']}"
    encoded = "yes" if params["positional_encoding"] else "no"
    return [*widths, drawn, f"positional encoding: {encoded}", *masking(params)]


def heads_mask(params: Params) -> np.ndarray | None:
    """The request's mask as it lies over multi-head weights (B?, h, n, n): a mask shared by the heads gains their
    axis (as attention.layers reads it); one with a head axis already (engine.is_per_head) is as it is."""
    mask = params["mask"]
    x_ndim = 2 if "tokens" in params else params["embeddings"].ndim
    if mask is None or mask.ndim < 2 or engine.is_per_head(mask.ndim, x_ndim):
        return mask
    return mask[..., None, :, :]
