"""Scaled dot-product attention on explicit Q, K, V: POST /v1/attention and v2's scaled_dot_product_attention."""

from __future__ import annotations

import attention as engine
from service.operations import sizes
from service.operations.inputs import EngineCall, Prepared, Result, answer, cast, masking, sized
from service.operations.sizes import Along, Params, Work
from service.problems import pointer

QKV = ("query", "key", "value")


def work(params: Params) -> Work:
    """B * n_q * n_k weights and B * n_q * d_v outputs; B counts the mask's batch axes too."""
    q, k, v, mask = (params[name] for name in (*QKV, "mask"))
    dims = tuple((limit, array.shape[axis], pointer(name)) for name, array in zip(QKV, (q, k, v), strict=True)
                 for limit, axis in (("max_sequence_length", -2), ("max_d_model", -1)))
    batch = sizes.batch_size(q, k, v, mask if mask is not None and mask.ndim > 2 else None)
    # B * n_q * d_v: mostly the batch of queries (over one shared key and value) makes it large
    output = Along(batch * q.shape[-2] * v.shape[-1], 1, pointer("query"))
    return Work(dims, **sizes.weighing(params, batch * q.shape[-2] * k.shape[-2], pointer("query")), along=(output,))


prepare = sized(work)


def compute(prepared: Prepared) -> Result:
    """softmax(Q K^T * scale) V. Q (B?, n_q, d_k), K (B?, n_k, d_k), V (B?, n_k, d_v), mask (.., n_q, n_k).

    -> output (B?, n_q, d_v), weights (B?, n_q, n_k), trace {scores, scaled_scores, masked_scores, weights}.
    """
    params = prepared.params
    q, k, v = (cast(params[name], params["dtype"], name) for name in QKV)
    mask, options = params["mask"], {"scale": params["scale"], "causal": params["causal"]}
    with EngineCall(("query",), _culprits, params, prepared.work.weights):
        return answer(params, lambda weights: engine.scaled_dot_product_attention(q, k, v, mask,
                                                                                  return_weights=weights, **options),
                      lambda: engine.trace_attention(q, k, v, mask, **options))


def _culprits(params: Params) -> list[str]:
    """Scores that overflowed are q . k * scale: any of the three may be too large (the engine says "query")."""
    return [pointer(name) for name in ("query", "key", "scale") if name != "scale" or params["scale"] is not None]


def settings(params: Params, result: Result) -> list[str]:
    """The run's settings a picture of its weights states: the scale (given, or 1/sqrt(d_k)), causal, the mask."""
    scale = params["scale"]
    return [f"scale: 1/√{params['query'].shape[-1]}" if scale is None else f"scale: {scale:g}", *masking(params)]
