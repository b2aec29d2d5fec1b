"""The building blocks and the seed's data: embeddings, positional encoding, the causal mask, the toy
vocabulary, the demos, and the engine's readiness self-test. The edge reaches the engine's data only here."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

import attention as engine
from service.operations.inputs import Prepared, Result, sentence, sentence_dims, sentence_shape
from service.operations.sizes import Along, Params, Work
from service.problems import pointer

log = logging.getLogger(__name__)
Demo = engine.Demo
DEMOS: dict[str, Demo] = engine.DEMOS
VOCABULARY = {"dimensions": engine.DIMENSIONS,
              "tokens": {word: vector.tolist() for word, vector in engine.EMBEDDINGS.items()}}
KNOWN_WORDS = frozenset(engine.EMBEDDINGS)


def work_embed(params: Params) -> Work:
    """n * d_model numbers returned (within the sentence's own limits, so not checked again)."""
    batch, n, d = sentence_shape(params)
    return Work(sentence_dims(params, n, d), along=(Along(batch * n * d, 1, pointer("tokens"), checked=False),))


def compute_embed(prepared: Prepared) -> Result:
    """tokens (n,) -> embeddings (n, d_model), positional encoding added when asked."""
    return {"embeddings": sentence(prepared.params)}


def work_positional_encoding(params: Params) -> Work:
    """n_positions * d_model numbers; both are query parameters of the GET."""
    n, d = params["n_positions"], params["d_model"]
    dims = (("max_sequence_length", n, "n_positions"), ("max_d_model", d, "d_model"))
    return Work(dims, query=True, along=(Along(n * d, 1, "n_positions", checked=False),))


def compute_positional_encoding(prepared: Prepared) -> Result:
    """n_positions, d_model -> encoding (n_positions, d_model)."""
    params = prepared.params
    return {"encoding": engine.positional_encoding(params["n_positions"], params["d_model"])}


def work_causal_mask(params: Params) -> Work:
    """size * size booleans, bound by the sequence length alone (not a /v1/batch op: no cost to count)."""
    return Work((("max_sequence_length", params["size"], "size"),), query=True)


def compute_causal_mask(prepared: Prepared) -> Result:
    """size -> mask (size, size) lower-triangular booleans."""
    return {"mask": engine.causal_mask(prepared.params["size"])}


def run_demo(name: str) -> dict[str, Any]:
    """The numbers the seed script prints for demo ``name`` (a key of DEMOS)."""
    return DEMOS[name].run()


def engine_ready() -> bool:
    """The self-test: a tiny attention whose answer is known (GET /readyz, GET /v2/health/ready)."""
    try:
        keys = np.eye(2)
        _, weights = engine.scaled_dot_product_attention(keys[:1] * 10, keys, keys)
        return bool(np.isclose(weights.sum(), 1.0) and weights[0, 0] > weights[0, 1])
    except Exception:  # readiness reports any engine failure instead of raising it
        log.exception("readiness self-test failed")
        return False
