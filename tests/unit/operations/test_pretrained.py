"""service.operations.pretrained without Flask: the text judged before it is tokenized, what a request weighs, what
/v1/batch groups items by, and a group computed in one engine call equal to each item alone."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pytest

import attention
from service.operations import catalogue, pretrained, sizes
from service.operations.inputs import Prepared
from service.operations.registry import BATCH_OPERATIONS
from service.problems import LimitExceeded, ValidationProblem
from service.settings import Limits
from tests.close import FLOAT32

MODEL = catalogue.DEFAULT_NAME


OPERATION = BATCH_OPERATIONS["model-attention"]


def params(**body) -> dict:
    """A validated /v1/batch item body of op model-attention (the endpoint's body plus the model), its model
    resolved."""
    return OPERATION.resolved(OPERATION.batch_request().load({"model": MODEL, **body}))


def prepared(item: dict, limits: Limits | None = None) -> Prepared:
    return pretrained.prepare(item, limits or Limits())


def compute(item: dict, limits: Limits) -> dict:
    return pretrained.compute(prepared(item, limits))


@pytest.fixture
def encodes(monkeypatch) -> list[str]:
    """Every text the tokenizer is given (a spy: the real method runs)."""
    texts, encode = [], attention.WordPieces.encode

    def counted(self, text, pair=None):
        texts.append(text)
        return encode(self, text, pair)

    monkeypatch.setattr(attention.WordPieces, "encode", counted)
    return texts


@pytest.mark.parametrize("member", ["text", "text_pair"])
def test_a_text_past_max_text_chars_is_refused_before_the_tokenizer_sees_it(encodes, member):
    item = params(**{"text": "fresh words", member: "never tokenized " * 1000})  # 16,000 code points
    with pytest.raises(LimitExceeded) as refused:
        compute(item, Limits())
    assert refused.value.members["limit"]["name"] == "max_text_chars" and encodes == []
    with pytest.raises(ValidationProblem, match="past the model's 512 positions"):  # judged once tokenized
        compute(item, Limits(max_text_chars=16_000))
    assert encodes == ["fresh words" if member == "text_pair" else item["text"]]


def test_work_counts_the_selected_weights_and_the_arrays_along_the_positions():
    item = params(text="the dog ate", layers=[1, 4], heads=[0, 5, 7])   # n = 5
    work = prepared(item).work
    assert (work.weights, work.weights_where, work.copies) == (2 * 3 * 5 * 5, "/layers", 1)
    assert work.dims == (("max_sequence_length", 5, "/text"),) and work.fewer == ("/layers", "/heads")
    assert [(a.size, a.arrays, a.returned) for a in work.along] == [(5 * 1536, 1, False), (5 * 384, 1, True)]
    traced = prepared(params(text="the dog ate", layers=[1, 4], trace=True, return_hidden_states=True)).work
    assert traced.along[1].arrays == 1 + 7 + 7 * 2  # output, hidden states, 7 trace arrays a selected layer
    assert traced.copies == sizes.TRACE_STAGES + 1


def group_key(item: dict) -> Hashable:
    return pretrained.group_key(prepared(item))


def test_group_key_is_the_model_the_length_and_the_options():
    key = group_key(params(text="the dog ate", layers=[3, 1]))
    assert key == (MODEL, 5, "float32", (1, 3), tuple(range(12)), False)
    assert group_key(params(text="a cat sat", layers=[1, 3], decimals=2)) == key  # decimals: rounding
    assert group_key(params(text="my", text_pair="cow", layers=[1, 3])) == key
    others = [params(text="the dog ate it", layers=[1, 3]), params(text="the dog ate", layers=[1]),
              params(text="the dog ate", layers=[1, 3], heads=[0]),
              params(text="the dog ate", layers=[1, 3], dtype="float64"),
              params(text="the dog ate", layers=[1, 3], return_hidden_states=True)]
    assert len({key, *map(group_key, others)}) == 1 + len(others)
    assert group_key(params(text="the dog ate", trace=True)) is None  # alone


def test_a_group_is_one_engine_call_equal_to_each_item_alone(monkeypatch):
    calls, forward = [], attention.Bert.__call__
    monkeypatch.setattr(attention.Bert, "__call__", lambda self, ids, *a, **k: calls.append(ids.shape) or
                        forward(self, ids, *a, **k))
    items = [params(text=text, layers=[0, 5], heads=[2, 11], return_hidden_states=True)
             for text in ("the dog ate", "a cat sat", "one two three")]
    together = pretrained.compute_many([prepared(item) for item in items])
    assert calls == [(3, 5)]
    for item, answer in zip(items, together, strict=True):
        alone = compute(item, Limits())
        assert answer["tokens"] == alone["tokens"] and answer["token_ids"] == alone["token_ids"]
        # equal to float32's last places: the kernel's sums differ between a batch's shapes and one sentence's
        np.testing.assert_allclose(answer["output"], alone["output"], **FLOAT32)
        np.testing.assert_allclose(np.stack(answer["hidden_states"]), np.stack(alone["hidden_states"]), **FLOAT32)
        for ours, theirs in zip(answer["layers"], alone["layers"], strict=True):
            assert ours["layer"] == theirs["layer"] and ours["heads"] == theirs["heads"] == [2, 11]
            np.testing.assert_allclose(ours["weights"], theirs["weights"], **FLOAT32)
    assert calls == [(3, 5), (1, 5), (1, 5), (1, 5)]
