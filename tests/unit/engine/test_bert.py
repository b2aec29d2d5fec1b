"""attention/bert.py on the real all-MiniLM-L6-v2, against transformers' BertModel on the same folder: every
layer's attention weights and every hidden state, one text, a pair, Unicode, a padded batch, a long text; the
trace; the refusal of ids the model has no embedding for."""

from __future__ import annotations

import numpy as np
import pytest

from attention import AttentionError, Pretrained
from tests.unit.engine.reference import TOLERANCE, max_difference, run_reference

README_SENTENCE = "The animal didn't cross the street because it was too tired."
TEXTS = {
    "plain": ("Attention is all you need.", None),
    "pair": ("Where did the animal stop?", README_SENTENCE),
    "unicode": ("Crème brûlée à Zürich, 東京タワー 🤖🎉 and \x00\x07 bells\ttabs\u200b", None),
    "readme": (README_SENTENCE, None),
}
DTYPES = [np.float32, np.float64]


def encode(model: Pretrained, text: str, pair: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A text (or pair) as ids and token types, each (1, n)."""
    encoded = model.tokenizer.encode(text, pair)
    return encoded.ids[None], encoded.type_ids[None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", TEXTS)
def test_weights_and_hidden_states_equal_transformers(minilm, hf_bert, name, dtype):
    ids, types = encode(minilm, *TEXTS[name])
    ours = minilm.bert(ids, types, dtype=dtype, hidden_states=True)
    states, weights = run_reference(hf_bert[dtype], ids, types)
    assert ours.output.dtype == dtype and all(w.dtype == dtype for w in ours.weights)
    assert len(ours.weights) == 6 and len(ours.hidden_states) == 7
    assert max_difference(ours.weights, weights) <= TOLERANCE[dtype]
    assert max_difference(ours.hidden_states, states) <= TOLERANCE[dtype]
    np.testing.assert_array_equal(ours.output, ours.hidden_states[-1])


def test_a_pair_has_both_token_types_and_they_change_the_result(minilm):
    ids, types = encode(minilm, *TEXTS["pair"])
    assert set(types[0].tolist()) == {0, 1}
    as_one_segment = minilm.bert(ids, np.zeros_like(types), return_weights=False).output
    assert np.abs(minilm.bert(ids, types, return_weights=False).output - as_one_segment).max() > 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_batch_equals_each_item_alone(minilm, hf_bert, dtype):
    items = [encode(minilm, "Short."), encode(minilm, *TEXTS["pair"]), encode(minilm, README_SENTENCE)]
    lengths = np.array([ids.shape[1] for ids, _ in items])
    n = lengths.max()
    ids, types = np.zeros((3, n), np.int64), np.zeros((3, n), np.int64)   # 0 is [PAD]
    for i, (item_ids, item_types) in enumerate(items):
        ids[i, :lengths[i]], types[i, :lengths[i]] = item_ids[0], item_types[0]
    real = np.arange(n) < lengths[:, None]                                # (B, n)
    ours = minilm.bert(ids, types, lengths, dtype=dtype, hidden_states=True)
    states, weights = run_reference(hf_bert[dtype], ids, types, real.astype(np.int64))
    for i, length in enumerate(lengths):
        alone = minilm.bert(*items[i], dtype=dtype, hidden_states=True)
        assert max_difference([w[i, :, :length, :length] for w in ours.weights], [w[0] for w in alone.weights]) \
            <= TOLERANCE[dtype]
        assert max_difference([s[i, :length] for s in ours.hidden_states], [s[0] for s in alone.hidden_states]) \
            <= TOLERANCE[dtype]
        assert max_difference([w[i, :, :length] for w in ours.weights], [w[i, :, :length] for w in weights]) \
            <= TOLERANCE[dtype]
        assert max_difference([s[i, :length] for s in ours.hidden_states], [s[i, :length] for s in states]) \
            <= TOLERANCE[dtype]
        for w in ours.weights:
            assert not w[i, :, :, length:].any()                       # padded keys weigh exactly 0
            assert not w[i, :, length:, :].any()                       # padded query rows are 0
            np.testing.assert_allclose(w[i, :, :length].sum(axis=-1), 1, atol=1e-6)
        for s in [*ours.hidden_states, ours.output]:
            assert not s[i, length:].any()                             # padded positions are 0
    assert lengths.min() < n                                           # the batch did pad


def test_a_long_text_runs_whole_and_equals_transformers(minilm, hf_bert):
    ids, types = encode(minilm, " ".join([README_SENTENCE] * 14))
    assert ids.shape[1] > 128 * 1.5                                    # past the tokenizer file's 128
    ours = minilm.bert(ids, types, hidden_states=True)
    states, weights = run_reference(hf_bert[np.float32], ids, types)
    assert max_difference(ours.weights, weights) <= TOLERANCE[np.float32]
    assert max_difference(ours.hidden_states, states) <= TOLERANCE[np.float32]


def test_defaults_segment_zero_no_padding_and_no_extras(minilm):
    ids, types = encode(minilm, README_SENTENCE)
    plain = minilm.bert(ids)
    assert plain.hidden_states is None and plain.output.dtype == np.float32
    np.testing.assert_array_equal(plain.output, minilm.bert(ids, types, np.array([ids.shape[1]])).output)
    without = minilm.bert(ids, return_weights=False)
    assert without.weights is None
    np.testing.assert_array_equal(without.output, plain.output)


@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_trace_agrees_with_the_forward_pass(minilm, dtype, tolerance):
    first, second = (encode(minilm, text)[0] for text in (README_SENTENCE, TEXTS["unicode"][0]))
    n = min(first.shape[1], second.shape[1])
    ids = np.concatenate([first[:, :n], second[:, :n]])                # (2, n): a batch, no padding
    trace = minilm.bert.trace(ids, dtype=dtype)
    traces = [trace.layers[i] for i in range(6)]
    forward = minilm.bert(ids, dtype=dtype, hidden_states=True)
    assert sorted(trace.layers) == list(range(6))
    np.testing.assert_array_equal(trace.output, forward.output)        # the untraced path computed the output
    assert max_difference(trace.hidden_states, forward.hidden_states) <= tolerance
    assert max_difference([t.output for t in traces], forward.hidden_states[1:]) <= tolerance
    assert max_difference([t.attention.weights for t in traces], forward.weights) <= tolerance
    scale = 1 / np.sqrt(32)                                            # d_k = 384 / 12
    for t in traces:
        stages = t.attention
        for a in (stages.q, stages.k, stages.v):
            assert a.shape == (2, 12, n, 32) and a.dtype == dtype
        assert stages.scores.shape == stages.weights.shape == (2, 12, n, n)
        np.testing.assert_allclose(stages.scores * scale, stages.scaled_scores, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(stages.weights.sum(axis=-1), 1, atol=tolerance)
        assert not stages.masked_scores.mask.any()                     # nothing is hidden in an unpadded batch
        assert stages.output.shape == t.add_norm_1.shape == t.feed_forward.shape == t.output.shape == (2, n, 384)


def test_a_trace_of_some_layers_and_heads_keeps_only_theirs(minilm):
    ids = encode(minilm, README_SENTENCE)[0]                           # (1, n)
    n = ids.shape[1]
    full = minilm.bert.trace(ids)
    some = minilm.bert.trace(ids, layers=[4, 1], heads=[7, 2])
    assert sorted(some.layers) == [1, 4]
    np.testing.assert_array_equal(some.output, full.output)
    for i in (1, 4):
        stages, whole = some.layers[i].attention, full.layers[i].attention
        assert stages.weights.shape == stages.scores.shape == (1, 2, n, n) and stages.q.shape == (1, 2, n, 32)
        np.testing.assert_array_equal(stages.weights, whole.weights[:, [7, 2]])
        np.testing.assert_array_equal(some.layers[i].output, full.layers[i].output)


def test_weights_of_some_heads_equal_those_of_all(minilm):
    ids = encode(minilm, README_SENTENCE)[0]
    every = minilm.bert(ids, weights_of=[0, 5])
    some = minilm.bert(ids, weights_of=[0, 5], heads=[11, 0, 3])
    np.testing.assert_array_equal(some.output, every.output)
    for i in (0, 5):
        assert some.weights[i].shape == (1, 3, ids.shape[1], ids.shape[1])
        np.testing.assert_array_equal(some.weights[i], every.weights[i][:, [11, 0, 3]])
    assert some.weights[1] is None


@pytest.mark.parametrize(("ids", "types", "argument", "message"), [
    (np.zeros((1, 513), np.int64), None, "token_ids", "513 tokens; the model has 512 positions"),
    (np.array([[101, 30522, 102]]), None, "token_ids", r"ids must be in \[0, 30522\)"),
    (np.array([[101, -1, 102]]), None, "token_ids", r"ids must be in \[0, 30522\)"),
    (np.array([[101, 2000, 102]]), np.array([[0, 2, 0]]), "token_type_ids", r"ids must be in \[0, 2\)"),
    (np.array([[101, 2000, 102]]), np.array([[0, -1, 0]]), "token_type_ids", r"ids must be in \[0, 2\)"),
    (np.array([[101, 2000, 102]]), np.array([[0, 0]]), "token_type_ids", r"expected \(1, 3\) integers"),
    (np.array([[1.0, 2.0]]), None, "token_ids", "expected"),
    (np.array([101, 2000]), None, "token_ids", "expected"),
])
def test_ids_the_model_has_no_embedding_for_are_refused(minilm, ids, types, argument, message):
    for run in (minilm.bert, minilm.bert.trace):
        with pytest.raises(AttentionError, match=message) as caught:
            run(ids, types)
        assert caught.value.argument == argument
