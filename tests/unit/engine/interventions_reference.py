"""The definitions attention/interventions.py and attention/census.py are proven against, written the plain way:
one transformers run per knockout with the head's context zeroed by a forward pre-hook on the output projection,
measures one vector at a time, the census one query row at a time. Nothing shared with the engine."""

from __future__ import annotations

import math

import numpy as np
import torch


def knocked_by_hook(model, output_projection, ids: np.ndarray, head: int, d_k: int) -> np.ndarray:
    """transformers' ``model`` on ids (1, n) with head ``head``'s columns of the input of ``output_projection`` (the
    heads' context vectors side by side, before W_O) set to zero -> its output's first tensor [0] (last hidden state
    (n, d_model) or logits (n, vocab))."""

    def zero_head(module, args):
        context = args[0].clone()
        context[..., head * d_k:(head + 1) * d_k] = 0
        return (context, *args[1:])

    hook = output_projection.register_forward_pre_hook(zero_head)
    try:
        return plain_run(model, ids)
    finally:
        hook.remove()


def plain_run(model, ids: np.ndarray) -> np.ndarray:
    """transformers' ``model`` on ids (1, n) -> its logits (n, vocab) if it has a head, else its last hidden state
    (n, d_model)."""
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids))
    first = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return first[0].numpy()


def shift_by_loops(full: np.ndarray, run: np.ndarray) -> tuple[float, float]:
    """full, run (n, d_model) last hidden states -> (1 - cos of their mean-pooled embeddings, the largest L2 norm of a
    position's change), in float64, a position and a coordinate at a time."""
    n, d = full.shape
    pooled_full = [sum(float(full[i, c]) for i in range(n)) / n for c in range(d)]
    pooled_run = [sum(float(run[i, c]) for i in range(n)) / n for c in range(d)]
    dot = sum(a * b for a, b in zip(pooled_full, pooled_run, strict=True))
    cosine = dot / math.sqrt(sum(a * a for a in pooled_full) * sum(b * b for b in pooled_run))
    largest = max(math.sqrt(sum((float(run[i, c]) - float(full[i, c])) ** 2 for c in range(d))) for i in range(n))
    return 1 - cosine, largest


def kl_by_definition(full: np.ndarray, run: np.ndarray) -> float:
    """KL(p_full || p_run) in nats of two logit vectors (vocab,), via probabilities in float64."""
    p = np.exp(full.astype(np.float64) - full.max())
    p /= p.sum()
    q = np.exp(run.astype(np.float64) - run.max())
    q /= q.sum()
    kept = p > 0
    return float(np.sum(p[kept] * np.log(p[kept] / q[kept])))


def census_by_loops(attentions: list[np.ndarray], punctuation: np.ndarray, separators: np.ndarray | None
                    ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """One text's attentions (n_layers of (h, n, n)) -> per statistic the (n_layers, h) sums over its rows and the
    rows counted, one row at a time."""
    n_layers, (h, n, _) = len(attentions), attentions[0].shape
    names = ["first", "self", "previous", "next", "punctuation", "entropy"] + (["separators"] if separators is not
                                                                                 None else [])
    sums = {name: np.zeros((n_layers, h)) for name in names}
    counts = {name: 0 for name in names}
    for layer, weights in enumerate(attentions):
        for head in range(h):
            for i in range(n):
                row = [float(w) for w in weights[head, i]]
                sums["first"][layer, head] += row[0]
                sums["self"][layer, head] += row[i]
                sums["punctuation"][layer, head] += sum(w for w, p in zip(row, punctuation, strict=True) if p)
                sums["entropy"][layer, head] -= sum(w * math.log(w) for w in row if w > 0)
                if separators is not None:
                    sums["separators"][layer, head] += sum(w for w, s in zip(row, separators, strict=True) if s)
                if i > 0:
                    sums["previous"][layer, head] += row[i - 1]
                if i < n - 1:
                    sums["next"][layer, head] += row[i + 1]
    for name in names:
        counts[name] = n - 1 if name in ("previous", "next") else n
    return sums, counts
