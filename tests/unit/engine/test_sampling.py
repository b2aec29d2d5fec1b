"""attention/sampling.py: greedy choice, temperature, top-k and top-p against transformers' own logits warpers, the
seeded draw, what is reported, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from attention import AttentionError
from attention.sampling import NUCLEUS_START, Sampler, Sampling, log_softmax, most_likely

VOCAB = 49152  # the decoder's: the nucleus search grows past its first candidates on a flat distribution


def transformers_kept(logits: np.ndarray, sampling: Sampling) -> dict[int, float]:
    """What transformers' warpers (temperature, then top-k, then top-p: its order) leave of ``logits``: id ->
    probability of the distribution it samples from."""
    scores = torch.from_numpy(logits[None].astype(np.float64))
    for warper in (TemperatureLogitsWarper(sampling.temperature), TopKLogitsWarper(sampling.top_k or logits.size),
                   TopPLogitsWarper(sampling.top_p)):
        scores = warper(None, scores)
    p = torch.softmax(scores, dim=-1)[0].numpy()
    return {int(i): float(p[i]) for i in np.flatnonzero(p > 0)}


def ours_kept(logits: np.ndarray, sampling: Sampling) -> dict[int, float]:
    kept, p = Sampler(sampling, 0).filtered(logits)
    return {int(i): float(q) for i, q in zip(kept, p, strict=True) if q > 0}


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, 40), Sampling(1.3, 0, 0.9), Sampling(0.8, 50, 0.95),
                                      Sampling(2.0, 3), Sampling(0.5, 0, 0.5), Sampling(1.0, 0, 1e-9)])
def test_the_filters_keep_what_transformers_warpers_keep(sampling):
    logits = np.random.default_rng(1).normal(0, 3, VOCAB)
    ours, theirs = ours_kept(logits, sampling), transformers_kept(logits, sampling)
    assert ours.keys() == theirs.keys()
    assert max(abs(ours[i] - theirs[i]) for i in ours) <= 1e-12
    assert math.isclose(sum(ours.values()), 1, abs_tol=1e-12)


def test_a_flat_distribution_grows_the_nucleus_past_its_first_candidates():
    logits = np.zeros(VOCAB)
    sampling = Sampling(1.0, 0, 0.99)
    kept = Sampler(sampling, 0).filtered(logits)[0]
    assert kept.size > NUCLEUS_START * 16 and kept.size == len(transformers_kept(logits, sampling))
    assert kept.tolist() == list(range(kept.size))                      # equal scores: the lower ids first


def test_greedy_takes_the_most_likely_token_the_lower_id_of_a_tie():
    logits = np.array([1.0, 5.0, 2.0, 5.0], np.float32)
    choice = Sampler(Sampling(), 0).choose(logits, top=4)
    assert (choice.token, choice.kept) == (1, 1)
    assert choice.top.tolist() == [1, 3, 2, 0]
    assert choice.top_drawn.tolist() == [1.0, 0.0, 0.0, 0.0]
    expected = log_softmax(logits.astype(np.float64))
    assert choice.logprob == expected[1] and np.array_equal(choice.top_logprobs, expected[[1, 3, 2, 0]])
    assert math.isclose(np.exp(expected).sum(), 1, abs_tol=1e-12)


def test_the_draw_is_the_documented_one_pcg64_uniform_per_step_on_the_kept_tokens():
    logits = np.random.default_rng(2).normal(0, 2, 1000)
    sampling = Sampling(0.9, 20, 0.8)
    sampler, replay = Sampler(sampling, 12345), np.random.Generator(np.random.PCG64(12345))
    for _ in range(50):
        choice = sampler.choose(logits, top=20)
        kept, p = Sampler(sampling, 0).filtered(logits)
        expected = kept[np.searchsorted(np.cumsum(p), replay.random() * np.cumsum(p)[-1], side="right")]
        assert choice.token == expected and choice.kept == kept.size
        drawn = dict(zip(choice.top.tolist(), choice.top_drawn.tolist(), strict=True))
        assert all(drawn[i] == (q if i in kept else 0.0) for i, q in zip(kept.tolist(), p, strict=True) if i in drawn)


def test_the_draw_follows_the_kept_distribution():
    """10,000 draws over three kept tokens: each frequency within 4 standard deviations of its probability."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    sampler = Sampler(Sampling(1.0, 3), 7)
    counts = np.bincount([sampler.choose(logits).token for _ in range(10_000)], minlength=4)
    p = np.array([0.5, 0.3, 0.15]) / 0.95
    assert counts[3] == 0
    assert (np.abs(counts[:3] / 10_000 - p) <= 4 * np.sqrt(p * (1 - p) / 10_000)).all(), counts


def test_a_seed_repeats_its_tokens_and_none_reports_a_fresh_one():
    logits = np.random.default_rng(3).normal(0, 1, 5000)
    run = [Sampler(Sampling(1.0), 99).choose(logits).token for _ in range(3)]
    assert len(set(run)) == 1
    first, second = Sampler(Sampling(1.0)), Sampler(Sampling(1.0))
    assert first.seed != second.seed and 0 <= first.seed < 2**63
    assert [Sampler(Sampling(1.0), first.seed).choose(logits).token for _ in range(2)] == \
        [first.choose(logits).token] * 2


def test_most_likely_sorts_only_k_and_breaks_ties_by_id():
    scores = np.array([3.0, 1.0, 3.0, 2.0, 3.0])
    assert most_likely(scores, 2).tolist() == [0, 2]
    assert most_likely(scores, 10).tolist() == [0, 2, 4, 3, 1]
    assert most_likely(scores, 0).tolist() == []


@pytest.mark.parametrize(("arguments", "argument"), [
    ({"temperature": -0.1}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"), ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"),
    ({"top_k": True}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_p": math.nan}, "top_p"),
])
def test_what_cannot_be_sampled_is_refused_by_argument(arguments, argument):
    with pytest.raises(AttentionError) as refused:
        Sampling(**arguments)
    assert refused.value.argument == argument


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_a_seed_is_a_non_negative_integer(seed):
    with pytest.raises(AttentionError) as refused:
        Sampler(Sampling(), seed)
    assert refused.value.argument == "seed"
