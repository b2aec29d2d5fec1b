"""Many sentences through a served model as one padded batch: the model's /v2 entry.

The texts are tokenized one by one (each checked as POST /v1/models/{model}/attention checks its text, the
error pointing at the item: ``/text/2``), padded to the longest, and run by ONE engine call with their lengths:
the engine zeros the padded positions and query rows itself, and padded keys weigh exactly 0. The real
positions of an item equal that item computed alone, to float32 rounding.
"""

from __future__ import annotations

import numpy as np

from service.operations import pretrained, sizes
from service.operations.catalogue import ServedModel
from service.operations.inputs import EngineCall, Result
from service.operations.sizes import Along, Params, Work
from service.problems import ValidationProblem, pointer
from service.settings import Limits

TEXT = pointer("text")


def compute(params: Params, limits: Limits) -> Result:
    """``params``: model (served), text (list of B str), layers and heads (lists, or None: all), return_weights.
    -> {tokens (B, n) object array of str, "" past an item's end; last_hidden_state (B, n, d_model) float32,
    zeros past an item's end; attentions (B, L_sel, H_sel, n, n) float32 when return_weights}, n the longest
    item's tokens. Every check (each text, then the batch's size) comes before the engine runs."""
    model: ServedModel = params["model"]
    config = model.config
    layers = pretrained.selected(params, "layers", config.n_layers)
    heads = pretrained.selected(params, "heads", config.n_heads)
    encodings = [_encoded(model, params, i, limits) for i in range(len(params["text"]))]
    b, n = len(encodings), max(len(e.tokens) for e in encodings)
    size = _work(model, params, n, len(layers) * len(heads))
    sizes.check(size, limits)
    ids, types = np.zeros((b, n), np.int64), np.zeros((b, n), np.int64)   # (B, n); past an item's end: padding
    tokens = np.full((b, n), "", dtype=object)                            # (B, n)
    for i, encoding in enumerate(encodings):
        length = len(encoding.tokens)
        ids[i, :length], tokens[i, :length] = encoding.ids, encoding.tokens
        if not model.causal:  # a decoder has no segments
            types[i, :length] = encoding.type_ids
    lengths = np.array([len(e.tokens) for e in encodings])                # (B,)
    with EngineCall((), list, params, size.weights):
        out = pretrained.forward(model, ids, lengths, types=None if model.causal else types,
                                 return_weights=params["return_weights"], layers=layers, heads=heads)
    result = {"tokens": tokens, "last_hidden_state": out.output}          # (B, n, d_model)
    if params["return_weights"]:
        result["attentions"] = np.stack([out.weights[i] for i in layers], axis=1)  # (B, L, H, n, n)
    return result


def _encoded(model: ServedModel, params: Params, index: int, limits: Limits) -> pretrained.Tokens:
    """Item ``index``'s tokens after the checks of a v1 text (:func:`encoded_item`), errors at /text/index."""
    return encoded_item(model, params["text"][index], limits, pointer("text", index))


def encoded_item(model: ServedModel, text: str, limits: Limits, where: str) -> pretrained.Tokens:
    """A text's tokens after the checks of a v1 text (whitespace, max_text_chars before tokenizing, a token besides
    the specials, max_positions, max_sequence_length), every error pointing at ``where`` (``/text/2``)."""
    item = {"model": model, "text": text}
    try:
        if not text.strip():
            raise ValidationProblem.at(TEXT, "Must hold something other than whitespace.")
        pretrained.admit(item, limits)
        encoding = pretrained.positioned(model, item)
        limits.check("max_sequence_length", len(encoding.tokens), pointer=TEXT)
    except ValidationProblem as exc:
        for error in exc.members.get("errors", []):
            if error.get("pointer") == TEXT:
                error["pointer"] = where
        raise
    return encoding


def _work(model: ServedModel, params: Params, n: int, selected: int) -> Work:
    """B items padded to n tokens, ``selected`` = L_sel * H_sel heads: B * selected * n * n weights returned (when
    asked); B * n * d_model outputs; per layer B * n * d_ff hidden numbers (a decoder's: 2 d_ff)
    computed only. The texts' count and
    lengths are to blame."""
    config, b = model.config, len(params["text"])
    weights = b * selected * n * n if params["return_weights"] else 0
    hidden = Along(b * n * pretrained.hidden_width(model), 1, TEXT, returned=False, repeat=config.n_layers)
    return Work(**sizes.weighing(params, weights, TEXT), along=(hidden, Along(b * n * config.d_model, 1, TEXT)),
                fewer=pretrained.FEWER if weights else ())
