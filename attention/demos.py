"""The seed script's five demos, as data.

Each ``run`` returns a plain dict of the numbers the demo shows (arrays, floats, bools,
token lists), computed by the engine. The command line (``python -m attention``) and the
HTTP service both format this one source, so they can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .functional import scaled_dot_product_attention, softmax
from .layers import SelfAttention
from .masks import causal_mask
from .multihead import MultiHeadAttention
from .positional import positional_encoding
from .vocabulary import DIMENSIONS, embed

SENTENCE = ["the", "cat", "ate", "food", "it"]


def lookup() -> dict:
    """Attention as a soft dictionary lookup: the query "it" against the raw embeddings."""
    x = embed(SENTENCE)                                  # (5, 4); used directly as Q, K and V
    query = x[-1:]                                       # (1, 4): "it", pure pronoun
    output, weights = scaled_dot_product_attention(query, x, x)
    raw = query @ x.T
    return {
        "tokens": SENTENCE, "dimensions": DIMENSIONS, "query_token": SENTENCE[-1],
        "scores": raw, "scaled_scores": raw / np.sqrt(x.shape[-1]),
        "weights": weights, "row_sums": weights.sum(axis=-1), "output": output[0],
    }


def scaling() -> dict:
    """Why divide by sqrt(d_k): unscaled scores spread out with d_k and saturate softmax."""
    rng = np.random.default_rng(1)
    rows = []
    for d_k in (4, 64, 512):
        q = rng.normal(0, 1, (1, d_k))
        k = rng.normal(0, 1, (10, d_k))
        raw = (q @ k.T)[0]                               # (10,) one query against ten keys
        scaled = raw / np.sqrt(d_k)
        rows.append({
            "d_k": d_k,
            "raw_std": float(raw.std()), "raw_max_weight": float(softmax(raw).max()),
            "scaled_std": float(scaled.std()), "scaled_max_weight": float(softmax(scaled).max()),
        })
    return {"keys": 10, "rows": rows}


def positional() -> dict:
    """Attention alone is order-blind; adding positional encodings breaks the tie."""
    attn = SelfAttention(4, 4, seed=7)
    first, second = ["cat", "ate", "food"], ["food", "ate", "cat"]
    a, b = embed(first), embed(second)
    encoding = positional_encoding(3, 4)

    def same_set(x, y) -> bool:                          # compare the bags of output rows
        return bool(np.allclose(np.sort(attn(x)[0], axis=0), np.sort(attn(y)[0], axis=0)))

    return {
        "sentences": [first, second],
        "identical_without_positional_encoding": same_set(a, b),
        "identical_with_positional_encoding": same_set(a + encoding, b + encoding),
        "positional_encoding": encoding,
    }


def causal() -> dict:
    """The causal mask: no token reads a later one, so the upper triangle is exactly 0."""
    x = embed(SENTENCE) + positional_encoding(len(SENTENCE), 4)
    mask = causal_mask(len(SENTENCE))
    _, weights = SelfAttention(4, 4, seed=3)(x, mask=mask)
    return {"tokens": SENTENCE, "mask": mask, "weights": weights}


def multi_head() -> dict:
    """Four heads with their own random projections look at the same sentence differently."""
    d_model, n_heads = 8, 4
    x = embed(SENTENCE, d_model) + positional_encoding(len(SENTENCE), d_model)   # (5, 8), zero-padded
    output, weights = MultiHeadAttention(d_model, n_heads)(x, mask=causal_mask(len(SENTENCE)))
    strongest = np.asarray(SENTENCE)[weights.argmax(axis=-1)]                    # (h, n) token names
    return {
        "tokens": SENTENCE, "d_model": d_model, "n_heads": n_heads,
        "weights": weights, "strongest_links": strongest.tolist(),
        "output": output, "output_shape": list(output.shape),
    }


@dataclass(frozen=True)
class Demo:
    """One demo: a URL-friendly name, a title, what it teaches, and the function computing it."""

    name: str
    title: str
    summary: str
    run: Callable[[], dict]


DEMOS: dict[str, Demo] = {d.name: d for d in (
    Demo("lookup", "Attention is a soft dictionary lookup",
         "Q, K and V are the raw embeddings and the query is 'it'. Its vector only overlaps "
         "with itself, so every other score is 0 and softmax spreads the weight almost evenly, "
         "with a bump on 'it'. Nothing is learned yet: training would move W_q, W_k, W_v, "
         "not this mechanism.", lookup),
    Demo("scaling", "Why divide by sqrt(d_k)?",
         "Dot products of random d_k-dimensional vectors have a spread that grows like "
         "sqrt(d_k). Unscaled, wide models push softmax towards a hard argmax (one weight near "
         "1); dividing by sqrt(d_k) keeps the spread near 1 and the distribution soft.", scaling),
    Demo("positional-encoding", "Attention alone cannot tell 'cat ate food' from 'food ate cat'",
         "Self-attention is permutation-equivariant: reorder the tokens and the outputs are the "
         "same rows, reordered. Adding a sine/cosine pattern per position makes the two "
         "sentences different inputs, which is the only sense of order a transformer has.",
         positional),
    Demo("causal-mask", "The causal mask stops a decoder from reading the future",
         "With a lower-triangular mask, token i attends only to tokens 0..i: the upper "
         "triangle of the weights is exactly zero. Without the mask it is an encoder (BERT), "
         "with it a decoder (GPT); the code is otherwise the same.", causal),
    Demo("multi-head", "Multi-head attention: several questions asked at once",
         "Each head has its own random W_q, W_k, W_v and so its own attention pattern over the "
         "same sentence. The heads are concatenated and mixed by W_o; the output has the "
         "input's shape, which is what lets blocks be stacked.", multi_head),
)}
