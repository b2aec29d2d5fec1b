"""What a head or a token matters: explain's methods ``knockout`` and ``occlusion`` (attention/interventions.py).

Prepared with the rest of explain's methods (service.operations.analyses): the heads of ``knock`` checked against
the model (a 422 at ``/knock/<i>``) and counted against ``max_knockouts``, the positions an occlusion removes found
(an encoder's every non-special token, a decoder's every one but the last, of a chat the user's text), and the
work of every run counted in tokens through a layer against ``max_rerun_tokens``, all before anything runs.

The answer: for knockout, (L, H) tables of how far each knocked head moved the model's answer (null where a head
was not knocked out); for occlusion, one number per occluded position. The picture: knockout as a layers x heads
heatmap, occlusion as bars over the tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import attention as engine
from attention import interventions
from service.operations import pretrained
from service.operations.bars import render_bars
from service.operations.catalogue import ServedModel
from service.operations.heatmap import render_heatmap
from service.operations.inputs import Result
from service.operations.sizes import Along, Params
from service.problems import LimitExceeded, ValidationProblem, pointer
from service.settings import Limits

# What each kind of model's runs are compared by, as the answer names it, and what the picture draws (the first).
MEASURES = {False: ("cosine_distance", "largest_change"), True: ("kl", "top_changed")}
PICTURED = {"cosine_distance": "1 − cos of the sentence embeddings", "kl": "KL(p_full ‖ p_run), nats"}


@dataclass(frozen=True)
class Plan:
    """The runs explain's interventions will make: ``knock`` the heads (None: knockout not asked), ``positions``
    (P,) the tokens to occlude (None: occlusion not asked), ``mask_id`` what an encoder reads in their place."""

    knock: list[tuple[int, int]] | None
    positions: np.ndarray | None
    mask_id: int | None = None


def plan(params: Params, found: pretrained.ModelInput, limits: Limits) -> Plan:
    """The runs the request asks for, each judged: heads in the model and at most ``max_knockouts`` of them; an
    occlusion the model can make (an encoder needs a [MASK] token)."""
    methods, model = params["methods"], found.model
    knock = positions = mask_id = None
    if "knockout" in methods:
        knock = _heads(params, model, limits)
    if "occlusion" in methods:
        positions, mask_id = _occluded(params, found)
    return Plan(knock, positions, mask_id)


def _heads(params: Params, model: ServedModel, limits: Limits) -> list[tuple[int, int]]:
    """``knock`` checked against the model (default every head), at most ``max_knockouts``."""
    config = model.config
    try:
        heads = interventions.chosen_heads(params.get("knock"), config.n_layers, config.n_heads)
    except engine.AttentionError as exc:
        raise ValidationProblem.at(pointer(*exc.argument.split("/")), exc.detail) from None
    where = pointer("knock") if "knock" in params else pointer("methods", params["methods"].index("knockout"))
    try:
        limits.check("max_knockouts", len(heads), pointer=where)
    except LimitExceeded as exc:
        if "knock" not in params:
            exc.members["errors"].append({"pointer": pointer("knock"), "detail": (
                f"Without knock, every head of {model.name}: {len(heads)}; list fewer.")})
        raise
    return heads


def _occluded(params: Params, found: pretrained.ModelInput) -> tuple[np.ndarray, int | None]:
    """The positions an occlusion removes, in increasing order, and an encoder's [MASK] id."""
    model, encoding = found.model, found.encoding
    tokenizer = model.pretrained.tokenizer
    if not model.causal:
        mask_id = tokenizer.token_id("[MASK]")
        if mask_id is None:
            raise ValidationProblem.at(pointer("methods", params["methods"].index("occlusion")),
                                       f"{model.name}'s vocabulary has no [MASK] token to occlude a token with.")
        return interventions.occludable(encoding.special), mask_id
    last = len(encoding.tokens) - 1  # the token that predicts: never removed
    if "messages" not in params:
        positions = np.arange(last)
    else:
        try:
            inside = tokenizer.chat_positions(params["messages"])
        except engine.AttentionError as exc:
            raise ValidationProblem.at(pointer(*exc.argument.split("/")), exc.detail) from None
        positions = inside[inside < last]
    if not len(positions):  # one token: it predicts, nothing before it to remove
        raise ValidationProblem.at(pointer("methods", params["methods"].index("occlusion")),
                                   "occlusion removes a token before the last; this prompt has none.")
    return positions, None


def rerun_tokens(model: ServedModel, n: int, runs: Plan) -> int:
    """Tokens that the plan's runs take through a layer, each run's full run included: a knockout of a head of
    layer l re-runs layers l..L-1 for the n tokens, an occlusion the whole model for n (a decoder's n - 1) tokens;
    a decoder's next-token logits at the last position count as d_model * vocab / (a token's multiply-adds in a
    layer) tokens more, per run."""
    layers = model.config.n_layers
    logits = math.ceil(model.config.d_model * model.config.vocab_size / pretrained.macs_per_token(model)) \
        if model.causal else 0
    total = 0
    if runs.knock is not None:
        total += n * layers + logits + sum(n * (layers - layer) + logits for layer, _ in runs.knock)
    if runs.positions is not None:
        kept = n - 1 if model.causal else n
        total += n * layers + logits + len(runs.positions) * (kept * layers + logits)
    return total


def admit(params: Params, found: pretrained.ModelInput, runs: Plan, limits: Limits) -> int:
    """The runs' tokens through a layer (:func:`rerun_tokens`), past ``max_rerun_tokens`` a 422 naming the input and
    what asks for the runs."""
    total = rerun_tokens(found.model, len(found.encoding.tokens), runs)
    try:
        limits.check("max_rerun_tokens", total, pointer=pointer(pretrained.input_member(params)))
    except LimitExceeded as exc:
        if runs.knock is not None:
            exc.members["errors"].append({"pointer": pointer("knock"), "detail": (
                f"{len(runs.knock)} knockouts re-run their layers for {len(found.encoding.tokens)} tokens: knock "
                "fewer heads (or those of later layers), or send a shorter text.")})
        if runs.positions is not None:
            where = pointer("methods", params["methods"].index("occlusion"))
            exc.members["errors"].append({"pointer": where, "detail": (
                f"occlusion runs the model once per token, {len(runs.positions)} times: send a shorter text.")})
        raise
    return total


def along(found: pretrained.ModelInput, runs: Plan) -> list[Along]:
    """The arrays the runs hold before they are measured, computed only: an encoder's last hidden states of every
    run (runs, n, d_model), a decoder's next-token logits (runs, vocab). Bounded by the limits on their count."""
    config, n = found.model.config, len(found.encoding.tokens)
    per_run = config.vocab_size if found.model.causal else n * config.d_model
    count = (0 if runs.knock is None else 1 + len(runs.knock)) + (0 if runs.positions is None else
                                                                   1 + len(runs.positions))
    return [Along(per_run * count, 1, pointer("methods"), returned=False, checked=False)] if count else []


def compute(params: Params, found: pretrained.ModelInput, runs: Plan) -> Result:
    """The answer's ``knockout`` and ``occlusion`` members, as the plan asks."""
    model, encoding, dtype = found.model, found.encoding, params["dtype"]
    result: Result = {}
    if runs.knock is not None:
        if model.causal:
            shift = engine.decoder_knockout(model.pretrained.llama, encoding.ids, runs.knock, dtype=dtype)
        else:
            shift = engine.encoder_knockout(model.pretrained.bert, encoding.ids, encoding.type_ids, runs.knock,
                                            dtype=dtype)
        result["knockout"] = {"heads": [list(pair) for pair in runs.knock],
                              **_measured(model, shift, lambda values: _table(model, runs.knock, values))}
    if runs.positions is not None:
        if model.causal:
            shift = engine.decoder_occlusion(model.pretrained.llama, encoding.ids, runs.positions, dtype=dtype)
        else:
            shift = engine.encoder_occlusion(model.pretrained.bert, encoding.ids, runs.positions, runs.mask_id,
                                             encoding.type_ids, dtype=dtype)
        result["occlusion"] = {"positions": runs.positions.tolist(), **_measured(model, shift, lambda values: values)}
    return result


def _measured(model: ServedModel, shift: engine.EncoderShift | engine.NextTokenShift,
              shaped: Callable[[np.ndarray], Any]) -> Result:
    """The measures of ``shift`` (engine.EncoderShift or NextTokenShift), each ``shaped`` (a table, or as is)."""
    if not model.causal:
        return {"cosine_distance": shaped(shift.cosine_distance), "largest_change": shaped(shift.largest_change)}
    return {"kl": shaped(shift.kl), "top_changed": shaped(shift.top_changed),
            "next_token": {"id": shift.full_top, "token": model.pretrained.tokenizer.decode([shift.full_top])}}


def _table(model: ServedModel, heads: list[tuple[int, int]],
           values: np.ndarray) -> np.ndarray | list[list[bool | None]]:
    """(K,) values of the knocked heads -> the model's (L, H) table: floats in their dtype with NaN (JSON null)
    where not knocked, booleans as lists with None."""
    config = model.config
    if values.dtype == bool:
        table: list[list[bool | None]] = [[None] * config.n_heads for _ in range(config.n_layers)]
        for (layer, head), value in zip(heads, values.tolist(), strict=True):
            table[layer][head] = value
        return table
    return interventions.head_table(heads, values, config.n_layers, config.n_heads).astype(values.dtype)


def pictures(params: Params, result: Result, tokens: list[str], settings: list[str], color_scale: str) -> list[str]:
    """The SVG parts of the interventions' answer: knockout's table as a layers x heads heatmap (heads not knocked
    out hatched), occlusion's first measure as bars over the tokens it removed."""
    measure = MEASURES[params["model"].causal][0]
    parts = []
    if "knockout" in result:
        table = np.asarray(result["knockout"][measure])                        # (L, H), NaN: not knocked out
        layers, heads = table.shape
        parts.append(render_heatmap(
            np.nan_to_num(table), title=f"Head knockout: {PICTURED[measure]}", settings=settings,
            row_labels=[f"layer {i}" for i in range(layers)], col_labels=[f"head {j}" for j in range(heads)],
            hidden=np.isnan(table), color_scale="max" if color_scale == "fixed" else color_scale,
            quantity=measure.replace("_", " "), axes=("layers ↓", "heads →"),
            hidden_labels=("not knocked out", "≈ 0: knocked out, changed nothing")))
    if "occlusion" in result:
        occlusion = result["occlusion"]
        parts.append(render_bars(np.asarray(occlusion[measure]), [tokens[p] for p in occlusion["positions"]],
                                 title=f"Token occlusion: {PICTURED[measure]}", settings=settings,
                                 quantity=measure.replace("_", " ")))
    return parts
