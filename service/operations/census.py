"""A head census: POST /v1/models/{model}/census, its /v1/batch op and batch-job endpoint ``census``.

``prepare`` judges the request before anything is computed: the number of texts (``max_census_texts``, at /texts),
then each text as POST /v1/models/{model}/attention judges its text (max_text_chars before it is tokenized, a token
besides the specials, the model's positions, max_sequence_length; errors at /texts/<i>), then what the census
costs. The texts are run in batches, sorted by length and padded to their longest, each batch's weights (every
layer, every head: L B H n_max^2) within max_weight_elements and its feed-forward's numbers (B n_max d_ff) within
max_output_elements; a text too long to fit a batch alone is refused at /texts/<i>, naming the limit. ``compute``
runs a forward pass per batch and combines the batches' censuses by their counts (attention.census: exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import attention as engine
from attention.census import STATISTICS
from service.operations import padded, pretrained, sizes
from service.operations.catalogue import ServedModel
from service.operations.inputs import EngineCall, Prepared, Result
from service.operations.sizes import Along, Params, Work
from service.problems import LimitExceeded, pointer
from service.settings import Limits

TEXTS = pointer("texts")
SEPARATOR = "[SEP]"  # an encoder's separator token ([CLS] is position 0, counted by "first")


@dataclass(frozen=True)
class CensusInput:
    """What preparing a census found: the model, each text's tokens, and the batches (indices into ``encodings``,
    each batch's texts of increasing length)."""

    model: ServedModel
    encodings: list[pretrained.Tokens]
    batches: list[list[int]]


def prepare(params: Params, limits: Limits) -> Prepared:
    """The request made ready: the texts counted, each judged and tokenized once, batched; its size checked."""
    model: ServedModel = params["model"]
    texts = params["texts"]
    limits.check("max_census_texts", len(texts), pointer=TEXTS)
    encodings = [padded.encoded_item(model, text, limits, pointer("texts", i)) for i, text in enumerate(texts)]
    lengths = [len(encoding.tokens) for encoding in encodings]
    found = CensusInput(model, encodings, batched(model, lengths, limits))
    size = work(found)
    try:
        sizes.check(size, limits)
    except LimitExceeded as exc:
        alone = size.weights_where != TEXTS and exc.members["limit"]["name"] == "max_weight_elements"
        if alone:  # one text whose weights alone are past the limit: say what they are
            n, config = max(lengths), model.config
            for error in exc.members["errors"]:
                error["detail"] += (f" A census holds every layer's and head's weights of a text at once: "
                                    f"{config.n_layers} x {config.n_heads} x {n}^2 for this text's {n} tokens.")
        raise
    return Prepared(params, size, found)


def batch_weights(model: ServedModel, size: int, longest: int) -> int:
    """The attention weights of a batch of ``size`` texts padded to ``longest`` tokens: every layer, every head."""
    config = model.config
    return config.n_layers * size * config.n_heads * longest * longest


def batch_hidden(model: ServedModel, size: int, longest: int) -> int:
    """The feed-forward's hidden numbers of such a batch, in one layer (one array of the forward pass)."""
    return size * longest * pretrained.hidden_width(model)


def batched(model: ServedModel, lengths: Sequence[int], limits: Limits) -> list[list[int]]:
    """The texts in batches: by increasing length, each batch as large as its weights (L B H n_max^2) stay within
    max_weight_elements and its feed-forward's numbers (B n_max hidden) within max_output_elements. A text past
    either alone is a batch of its own (which :func:`work` then refuses, naming it)."""
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        batch = batches[-1] if batches else []
        size, longest = len(batch) + 1, lengths[index]  # sorted: the new text is the batch's longest
        if batch and batch_weights(model, size, longest) <= limits.max_weight_elements \
                and batch_hidden(model, size, longest) <= limits.max_output_elements:
            batch.append(index)
        else:
            batches.append([index])
    return batches


def work(found: CensusInput) -> Work:
    """Each batch of B texts padded to n_max tokens holds L B H n_max^2 weights at once (the heaviest batch's
    checked against max_weight_elements, the widest's B n_max hidden numbers of a layer against max_output_elements,
    each blamed on its text when it is alone, else on /texts) and computes B n_max tokens through every layer (the
    multiply-adds of pretrained.macs_per_token). What the other batches hold counts in a /v1/batch's budget only, as
    computed; the answer is at most 7 (L, H) tables."""
    model, config = found.model, found.model.config
    lengths = [len(encoding.tokens) for encoding in found.encodings]
    shapes = [(len(batch), lengths[batch[-1]]) for batch in found.batches]     # (B, n_max) per batch
    weights = [batch_weights(model, b, n) for b, n in shapes]
    hidden = [batch_hidden(model, b, n) for b, n in shapes]
    heaviest, widest = int(np.argmax(weights)), int(np.argmax(hidden))  # the batches the limits judge

    def blamed(k: int) -> str:
        return pointer("texts", found.batches[k][0]) if len(found.batches[k]) == 1 else TEXTS

    others = sum(weights) - weights[heaviest] + config.n_layers * (sum(hidden) - hidden[widest])
    padded_tokens = sum(b * n for b, n in shapes)
    answer = len(STATISTICS) * config.n_layers * config.n_heads
    dims = tuple(("max_sequence_length", n, pointer("texts", i)) for i, n in enumerate(lengths))
    return Work(dims, weights=weights[heaviest], weights_where=blamed(heaviest),
                along=(Along(hidden[widest], 1, blamed(widest), returned=False, repeat=config.n_layers),
                       Along(others, 1, TEXTS, returned=False, checked=False),
                       Along(answer, 1, TEXTS, checked=False)),
                macs=padded_tokens * config.n_layers * pretrained.macs_per_token(model))


def compute(prepared: Prepared) -> Result:
    """{texts, tokens, statistics: {name: {mean (L, H), count}}}: a forward pass per batch, the batches' censuses
    combined by their counts; the means in the request's dtype."""
    params, found = prepared.params, prepared.found
    with EngineCall((), list, params, prepared.work.weights):
        total = None
        for batch in found.batches:
            census = batch_census(found.model, [found.encodings[i] for i in batch], params["dtype"])
            total = census if total is None else total.combined(census)
    dtype = np.dtype(params["dtype"])
    return {"texts": len(found.encodings), "tokens": sum(len(encoding.tokens) for encoding in found.encodings),
            "statistics": {name: {"mean": total.means[name].astype(dtype), "count": total.counts[name]}
                           for name in total.means}}


def batch_census(model: ServedModel, encodings: Sequence[pretrained.Tokens], dtype: str) -> engine.Census:
    """The census of texts run as one padded batch: the forward pass with every layer's weights, the punctuation
    (a WordPiece's "##" stripped; a decoder's tokens are text already) and an encoder's [SEP] marked."""
    b, n = len(encodings), max(len(encoding.tokens) for encoding in encodings)
    ids, types = np.zeros((b, n), np.int64), np.zeros((b, n), np.int64)        # (B, n); past an item's end: padding
    punctuation, separators = np.zeros((b, n), bool), np.zeros((b, n), bool)   # (B, n)
    markers = () if model.causal else ("##",)
    for i, encoding in enumerate(encodings):
        length = len(encoding.tokens)
        ids[i, :length] = encoding.ids
        punctuation[i, :length] = engine.punctuation_marks(encoding.tokens, markers)
        if not model.causal:
            types[i, :length] = encoding.type_ids
            separators[i, :length] = [token == SEPARATOR for token in encoding.tokens]
    lengths = np.array([len(encoding.tokens) for encoding in encodings])     # (B,)
    out = pretrained.forward(model, ids, lengths, types=None if model.causal else types, dtype=dtype)
    return engine.head_census(out.weights, punctuation, lengths, None if model.causal else separators)
