"""attention/census.py: the head census against a loop over transformers' attentions, one query row at a time
(tests/unit/engine/interventions_reference.py); a padded batch's census equals its items' alone, combined."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention import AttentionError
from attention.census import Census, head_census, punctuation_marks
from tests.unit.engine.interventions_reference import census_by_loops

pytestmark = pytest.mark.usefixtures("one_thread_each")

SENTENCE = "The animal didn't cross the street, because it was too tired."
SHORT = "The cat sat on the mat."
# Means (weights, entropies in nats) against the loops over transformers' float32 attentions: measured at most 4.0e-7
# for MiniLM, 1.5e-6 for the decoder (whose weights agree with transformers' to 8e-6); padded against alone 1.3e-7.
CENSUS_BOUND = 1e-6


# --- the head census -------------------------------------------------------------------------------------------------

CENSUS_TEXTS = ["Short.", SHORT, SENTENCE, "Commas, semicolons; and -- dashes!"]


def minilm_marks(minilm, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Padded ids (B, n), lengths (B,), punctuation and [SEP] marks (B, n) of MiniLM's texts."""
    encoded = [minilm.tokenizer.encode(text) for text in texts]
    lengths = np.array([len(e.ids) for e in encoded])
    ids = np.zeros((len(texts), lengths.max()), np.int64)
    punctuation = np.zeros(ids.shape, bool)
    separators = np.zeros(ids.shape, bool)
    for row, e in enumerate(encoded):
        ids[row, :lengths[row]] = e.ids
        punctuation[row, :lengths[row]] = punctuation_marks(e.tokens)
        separators[row, :lengths[row]] = [token == "[SEP]" for token in e.tokens]
    return ids, lengths, punctuation, separators


def test_minilm_census_equals_a_loop_over_transformers_attentions(minilm, hf_bert):
    ids, lengths, punctuation, separators = minilm_marks(minilm, CENSUS_TEXTS)
    out = minilm.bert(ids, None, lengths)
    census = head_census(out.weights, punctuation, lengths, separators)
    sums, counts = {}, {}
    for row, length in enumerate(lengths):
        with torch.no_grad():
            theirs = hf_bert[np.float32](input_ids=torch.from_numpy(ids[row:row + 1, :length]), output_attentions=True)
        text_sums, text_counts = census_by_loops([a[0].numpy() for a in theirs.attentions],
                                                 punctuation[row, :length], separators[row, :length])
        for name in text_sums:
            sums[name] = sums.get(name, 0) + text_sums[name]
            counts[name] = counts.get(name, 0) + text_counts[name]
    assert census.counts == counts
    assert census.counts["first"] == lengths.sum() and census.counts["next"] == lengths.sum() - len(lengths)
    for name, mean in census.means.items():
        assert mean.shape == (6, 12)
        assert np.abs(mean - sums[name] / counts[name]).max() <= CENSUS_BOUND, name


def test_decoder_census_equals_a_loop_over_transformers_attentions(smollm, hf_smollm):
    encoded = smollm.tokenizer.encode(SENTENCE)
    marks = punctuation_marks(encoded.tokens, markers=())
    assert marks.sum() == 2                                                # ",", "." ("'t" is a word)
    census = head_census(smollm.llama(encoded.ids[None], logits=None).weights, marks[None])
    assert "separators" not in census.means and "separators" not in census.counts
    with torch.no_grad():
        theirs = hf_smollm(input_ids=torch.from_numpy(encoded.ids[None]), output_attentions=True)
    sums, counts = census_by_loops([a[0].numpy() for a in theirs.attentions], marks, None)
    assert census.counts == counts
    for name, mean in census.means.items():
        assert np.abs(mean - sums[name] / counts[name]).max() <= 10 * CENSUS_BOUND, name
    assert not census.means["next"].any()                                  # causal: no weight on the next token


def test_a_padded_census_equals_its_items_alone_combined(minilm):
    ids, lengths, punctuation, separators = minilm_marks(minilm, CENSUS_TEXTS)
    batch = head_census(minilm.bert(ids, None, lengths).weights, punctuation, lengths, separators)
    alone = None
    for row, length in enumerate(lengths):
        item = slice(row, row + 1), slice(0, length)
        census = head_census(minilm.bert(ids[item]).weights, punctuation[item], None, separators[item])
        alone = census if alone is None else alone.combined(census)
    assert batch.counts == alone.counts
    for name, mean in batch.means.items():
        assert np.abs(mean - alone.means[name]).max() <= CENSUS_BOUND, name


def test_punctuation_is_made_only_of_category_p():
    tokens = ["[CLS]", ".", "##,", " ...", "!?", "a.", "", " ", "«", "—", "$", "##s", "\ufffd", "<|im_end|>"]
    assert punctuation_marks(tokens).tolist() == [False, True, True, True, True, False, False, False, True, True,
                                                   False, False, False, False]


def test_census_combined_refuses_other_statistics():
    one = Census({"first": np.zeros((1, 1))}, {"first": 1})
    with pytest.raises(AttentionError):
        one.combined(Census({}, {}))
