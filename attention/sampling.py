"""Choosing the next token from a decoder's logits: greedy, or drawn after temperature, top-k and top-p.

The model gives a score (logit) to every token of its vocabulary; softmax turns them into probabilities. Greedy
decoding takes the most likely token every time: the same prompt, the same text. Sampling draws from the
distribution instead, reshaped first, in this order (transformers' and llama.cpp's):

    temperature T   divide the logits by T: below 1 sharpens the distribution, above 1 flattens it
    top-k           keep the k most likely tokens (0: all)
    top-p           of those, keep the fewest most likely whose probabilities (renormalised) sum to p (1: all)

and draw one of the kept tokens with probability proportional to its renormalised probability. The draw uses numpy's
PCG64 generator seeded by the request's seed, one uniform number per step, so the same seed, machine and precision
give the same tokens. Temperature 0 is greedy and draws nothing. Ties go to the lower token id everywhere.

Every probability reported is the model's own (log-softmax of the raw logits), before temperature and the filters;
beside it, the probability each candidate had in the distribution actually drawn from (0 once filtered out).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from .errors import AttentionError

SEED_BITS = 62  # a fresh seed fits a signed 64-bit integer, and the requests' seed limit, with room to spare
NUCLEUS_START = 256  # candidates sorted first for top-p alone; 16 times more while they hold less than p


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: ``temperature`` 0 (greedy) or above; ``top_k`` 0 (off) or the candidates kept;
    ``top_p`` in (0, 1], 1 (off). :class:`AttentionError` naming the field for anything else."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise AttentionError("temperature", f"expected a finite number >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise AttentionError("top_k", f"expected an integer >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise AttentionError("top_p", f"expected a number in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Choice:
    """One chosen token. ``logprob``: its log-probability under the model (natural log, before temperature and the
    filters); ``kept``: the candidates left after the filters (1 when greedy); ``top``: the most likely token ids,
    most likely first, with their model ``top_logprobs`` and ``top_drawn``, each one's probability in the
    distribution the token was drawn from (greedy: 1 for the chosen token, 0 for the others)."""

    token: int
    logprob: float
    kept: int
    top: np.ndarray            # (k,) int64
    top_logprobs: np.ndarray   # (k,) float64
    top_drawn: np.ndarray      # (k,) float64


def fresh_seed() -> int:
    """A random seed for a request that gives none (the answer reports it, so the run can be repeated)."""
    return secrets.randbits(SEED_BITS)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(..., vocab) logits -> log-probabilities in float64 (the max subtracted first: no overflow)."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def most_likely(scores: np.ndarray, k: int) -> np.ndarray:
    """The ids of the ``k`` highest of ``scores`` (vocab,), highest first, ties to the lower id: a partition
    (linear) then a sort of the k alone."""
    k = min(k, scores.shape[-1])
    if k <= 0:
        return np.empty(0, np.int64)
    threshold = np.partition(scores, scores.size - k)[scores.size - k]        # the k-th highest value
    above = np.flatnonzero(scores > threshold)
    tied = np.flatnonzero(scores == threshold)[:k - above.size]             # the lowest ids among the ties
    chosen = np.concatenate([above, tied])
    return chosen[np.lexsort((chosen, -scores[chosen]))]                     # by score, then by id


class Sampler:
    """Chooses tokens for one generation as ``sampling`` says, drawing from PCG64 seeded with ``seed`` (None: a
    fresh one, kept in :attr:`seed`)."""

    def __init__(self, sampling: Sampling, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise AttentionError("seed", f"expected an integer >= 0, got {seed!r}")
        self.sampling = sampling
        self.seed = fresh_seed() if seed is None else seed
        self._random = np.random.Generator(np.random.PCG64(self.seed))

    def choose(self, logits: np.ndarray, top: int = 0) -> Choice:
        """The next token from ``logits`` (vocab,), with the ``top`` most likely candidates reported."""
        logprobs = log_softmax(logits)                                       # (vocab,) the model's own
        if self.sampling.greedy:
            kept = np.array([int(np.argmax(logits))])                        # argmax: the first (lowest id) of ties
            drawn = np.ones(1)
        else:
            kept, drawn = self.filtered(logits)
        token = int(kept[0]) if kept.size == 1 else int(kept[self._draw(drawn)])
        ids = most_likely(logprobs, top)
        in_draw = np.zeros(logprobs.size)                                    # (vocab,) 0 where filtered out
        in_draw[kept] = drawn
        return Choice(token, float(logprobs[token]), int(kept.size), ids, logprobs[ids], in_draw[ids])

    def filtered(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Temperature, then top-k, then top-p: the kept ids and their renormalised probabilities (float64); most
        likely first when a filter cut (temperature alone keeps every id, in id order, with no sort)."""
        scaled = logits.astype(np.float64) / self.sampling.temperature        # (vocab,)
        if self.sampling.top_k:
            kept = most_likely(scaled, self.sampling.top_k)                  # (k,) most likely first
            p = np.exp(scaled[kept] - scaled[kept[0]])
            p /= p.sum()                                                     # renormalised over the k
        else:
            p = np.exp(scaled - scaled.max())
            p /= p.sum()                                                     # (vocab,)
            if self.sampling.top_p == 1:
                return np.arange(scaled.size), p
            kept = self._nucleus(scaled, p)
            p = p[kept]
        if self.sampling.top_p < 1:
            enough = int(np.searchsorted(np.cumsum(p), self.sampling.top_p)) + 1  # the fewest that reach p
            kept, p = kept[:enough], p[:enough] / p[:enough].sum()
        return kept, p

    def _nucleus(self, scaled: np.ndarray, p: np.ndarray) -> np.ndarray:
        """The most likely ids, most likely first, enough to hold ``top_p`` of ``p`` (vocab,): a few hundred
        sorted, not the whole vocabulary, unless the distribution is that flat."""
        size = NUCLEUS_START
        while True:
            ids = most_likely(scaled, size)
            if size >= scaled.size or p[ids].sum() >= self.sampling.top_p:
                return ids
            size *= 16

    def _draw(self, p: np.ndarray) -> int:
        """An index into ``p`` (probabilities, summing to 1), drawn with one uniform number."""
        cumulative = np.cumsum(p)
        return min(int(np.searchsorted(cumulative, self._random.random() * cumulative[-1], side="right")),
                   p.size - 1)
