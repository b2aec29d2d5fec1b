"""Beyond raw weights: POST /v1/models/{model}/explain, its /v1/batch op ``model-explain``, and what /v1/encoder's
``methods`` share with it. Explain's interventions (knockout, occlusion) are service.operations.interventions'.

A trained model's text is prepared as for its attention (service.operations.pretrained: judged by length, tokenized
once, layers and heads chosen), then judged for what the methods cost before anything is computed: flow past
``max_flow_tokens`` tokens, the weights the analyses hold and the maps they return past ``max_weight_elements``, a
picture past ``max_heatmap_cells``: each a 422 naming the member and the limit. ``compute`` runs the model once with
every layer's weights (rollout and flow need every head of every layer) and the norms of the selected layers
computed in passing, then the engine's rollout and flow on those weights (attention/analyses.py); that pass only
when one of them is asked.

The picture (``?format=svg``): rollout after each selected layer and flow as token x token heatmaps on the weights'
scale, and the selected heads' raw weights beside their norms, each on its own colour scale (a norm is a length in
the model's space, not a share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import attention as engine
from service.operations import interventions, pretrained, sizes
from service.operations.heatmap import combined, render_heatmap
from service.operations.inputs import EngineCall, Prepared, Result
from service.operations.sizes import Along, Params, Work
from service.problems import LimitExceeded, pointer
from service.settings import Limits

FEWER = (pointer("layers"), pointer("heads"), pointer("methods"))
# Flow's share of a batch's budget, in multiply-adds: it visits the layered graph's L n^2 edges once per pair of
# tokens, L n^4 in all. MiniLM at 32 tokens: 184 ms for 6.3 M of them (29 ns each), where its forward pass does
# 340 M multiply-adds in 13.8 ms (0.04 ns each): one edge of one pair ~700 multiply-adds, rounded up. A /v1/batch
# then holds 4 MiniLM flows of 32 tokens (~0.8 s) within the default max_batch_elements, 45 of 16 tokens (~1 s).
FLOW_MACS_PER_EDGE = 1024
ANALYSES = frozenset(("rollout", "flow", "norms"))  # the methods read from one forward pass's weights


@dataclass(frozen=True)
class Explained:
    """What preparing an explain request found: the model's text (``text``), the interventions' runs (``runs``)
    and how many tokens those take through a layer (``rerun``)."""

    text: pretrained.ModelInput
    runs: interventions.Plan
    rerun: int


def maps(methods: Sequence[str], n: int, layers: int, heads: int, batch: int = 1) -> int:
    """The numbers of the (n, n) maps the methods return for ``layers`` selected layers and ``heads`` selected heads
    (B of each for a batch): rollout one a layer, flow one, norms a layer's h heads and the layer's own."""
    per_layer = ("rollout" in methods) + ("norms" in methods) * (heads + 1)
    return batch * n * n * (layers * per_layer + ("flow" in methods))


def cells(methods: Sequence[str], n: int, layers: int, heads: int, table: int = 0) -> int:
    """Cells of the picture: rollout one panel a layer, flow one, norms each head's weights beside its norms, and
    knockout the ``table``'s (the model's layers x heads)."""
    per_layer = ("rollout" in methods) + ("norms" in methods) * 2 * heads
    return n * n * (layers * per_layer + ("flow" in methods)) + ("knockout" in methods) * table


def admit_flow(methods: Sequence[str], n: int, where: str, limits: Limits) -> None:
    """Flow solves a maximum flow per pair of tokens (its cost ~ n^4): past ``max_flow_tokens`` tokens, a 422 naming
    the input and the method, before anything is computed."""
    if "flow" not in methods:
        return
    try:
        limits.check("max_flow_tokens", n, pointer=where)
    except LimitExceeded as exc:
        exc.members["errors"].append({"pointer": pointer("methods", list(methods).index("flow")),
                                      "detail": f"flow takes at most {limits.max_flow_tokens} tokens; this input "
                                                f"has {n}."})
        raise


def prepare(params: Params, limits: Limits) -> Prepared:
    """The request made ready: the text judged and tokenized once, the layers and heads chosen (as for the model's
    attention), the interventions' runs planned, then what the methods cost judged against the limits."""
    found = pretrained.model_input(params, limits)
    n = len(found.encoding.tokens)
    admit_flow(params["methods"], n, pointer(pretrained.input_member(params)), limits)
    runs = interventions.plan(params, found, limits)
    explained = Explained(found, runs, interventions.admit(params, found, runs, limits))
    size = work(params, explained)
    sizes.check(size, limits)
    if params.get("format") == "svg":  # the answer is the picture
        config = found.model.config
        limits.check("max_heatmap_cells", cells(params["methods"], n, len(found.layers), len(found.heads),
                                                config.n_layers * config.n_heads), parameter="format")
    return Prepared(params, size, explained)


def work(params: Params, explained: Explained) -> Work:
    """One text of n tokens through L layers of h heads: every layer's L * h * n * n weights held for the analyses
    plus the maps returned (:func:`maps`, with return_weights the selected heads' weights too), against
    max_weight_elements; the forward pass's numbers along the positions as for the model's attention (computed, not
    returned) and, with norms, each selected layer's h * n * d_model transformed values. The maps count once more
    as returned in a batch's budget, and flow its L n^4 edge visits (FLOW_MACS_PER_EDGE). Without those methods,
    no weights: the interventions' runs, their tokens through a layer and what they hold before measuring."""
    found = explained.text
    model, config = found.model, found.model.config
    methods = params["methods"]
    analysed_too = bool(ANALYSES & set(methods))
    n, layers, heads = len(found.encoding.tokens), len(found.layers), len(found.heads)
    where = pointer(pretrained.input_member(params))
    returned = maps(methods, n, layers, heads) + params["return_weights"] * layers * heads * n * n
    held = config.n_layers * config.n_heads * n * n * analysed_too
    along = [Along(n * pretrained.hidden_width(model), 1, where, returned=False, repeat=config.n_layers),
             Along(n * config.d_model, 1, where, returned=False),
             Along(returned, 1, pointer("methods"), checked=False), *interventions.along(found, explained.runs)]
    if "norms" in methods:
        along.append(Along(config.n_heads * n * config.d_model, 1, pointer("layers"), returned=False, repeat=layers))
    forward = n * config.n_layers * analysed_too + explained.rerun  # tokens through a layer
    return Work((("max_sequence_length", n, where),), weights=held + returned, weights_where=pointer("methods"),
                along=tuple(along), fewer=FEWER, macs=forward * pretrained.macs_per_token(model)
                + ("flow" in methods) * FLOW_MACS_PER_EDGE * config.n_layers * n**4)


def compute(prepared: Prepared) -> Result:
    """{tokens, token_ids, rollout? [{layer, values (n, n)}], flow? (n, n), norms? [{layer, heads, head_norms
    (h_sel, n, n), layer_norms (n, n), weights? (h_sel, n, n)}], knockout?, occlusion?}: for the analyses the model
    once on the text, every weight kept; the interventions' runs (service.operations.interventions)."""
    params, explained = prepared.params, prepared.found
    found = explained.text
    model, encoding, methods = found.model, found.encoding, params["methods"]
    norms_of = found.layers if "norms" in methods else ()
    result: Result = {"tokens": encoding.tokens, "token_ids": encoding.ids.tolist()}
    with EngineCall((), list, params, prepared.work.weights):
        if ANALYSES & set(methods):
            if model.causal:
                out = model.pretrained.llama(encoding.ids[None], dtype=params["dtype"], logits=None, norms_of=norms_of)
            else:
                out = model.pretrained.bert(encoding.ids[None], encoding.type_ids[None], dtype=params["dtype"],
                                            norms_of=norms_of)
            result.update({name: _first(value) for name, value in analysed(
                methods, out.weights, out.norms, found.layers, found.heads, params["return_weights"]).items()})
        result.update(interventions.compute(params, found, explained.runs))
    return result


def analysed(methods: Sequence[str], weights: list[np.ndarray], norms: list[engine.AttentionNorms | None] | None,
             layers: list[int], heads: list[int], return_weights: bool = False) -> Result:
    """The methods' members from a forward pass: ``weights`` every layer's (..., h, n, n), ``norms`` those of
    ``layers`` (None where not computed). Rollout and norms for ``layers``; norms' ``heads`` only (all: no copy)."""
    result: Result = {}
    if "rollout" in methods:
        rolled = engine.rollout(weights, layers=layers)
        result["rollout"] = [{"layer": layer, "values": rolled[layer]} for layer in layers]
    if "flow" in methods:
        result["flow"] = engine.flow(weights)
    if "norms" in methods:
        every = list(range(weights[0].shape[-3])) == heads
        result["norms"] = []
        for layer in layers:
            entry = {"layer": layer, "heads": heads,
                     "head_norms": norms[layer].heads if every else norms[layer].heads[..., heads, :, :],
                     "layer_norms": norms[layer].layer}
            if return_weights:
                entry["weights"] = weights[layer] if every else weights[layer][..., heads, :, :]
            result["norms"].append(entry)
    return result


def _first(value: Any) -> Any:
    """A member of a one-item batch's answer without its batch axis: arrays [0], lists and dicts through."""
    if isinstance(value, np.ndarray):
        return value[0]
    if isinstance(value, list):
        return [_first(item) for item in value]
    if isinstance(value, dict):
        return {name: _first(item) for name, item in value.items()}
    return value


def picture(params: Params, result: Result, color_scale: str) -> str:
    """The SVG of an answer (its cells checked when the request was prepared): rollout's layers and flow on
    ``color_scale``, then each selected layer's heads, raw weights beside their norms (norms on a scale of their
    own: ``max`` for ``fixed``), then the interventions' knockout table and occlusion bars. A decoder's cells after
    the query are hatched: nothing can reach them."""
    tokens, causal = result["tokens"], params["model"].causal
    n = len(tokens)
    hidden = ~np.tri(n, dtype=bool) if causal else None  # key j after query i: the causal mask hid it
    settings = pretrained.settings(params, result)
    labels = {"row_labels": tokens, "col_labels": tokens, "settings": settings, "hidden": hidden}
    parts = []
    if "rollout" in result:
        values = np.stack([entry["values"] for entry in result["rollout"]])              # (L_sel, n, n)
        parts.append(render_heatmap(values, title="Attention rollout (rows sum to 1)", color_scale=color_scale,
                                    panel_titles=[f"after layer {entry['layer']}" for entry in result["rollout"]],
                                    **labels))
    if "flow" in result:
        parts.append(render_heatmap(result["flow"], title="Attention flow to the last layer",
                                    color_scale=color_scale, panel_titles=["flow"], quantity="flow", **labels))
    if "norms" in result:
        entries = result["norms"]
        rows = {"row_titles": [f"layer {entry['layer']}" for entry in entries],
                "panel_titles": [f"head {head}" for head in entries[0]["heads"]]}
        weights = np.stack([entry["weights"] for entry in entries])                     # (L_sel, h_sel, n, n)
        norms = np.stack([entry["head_norms"] for entry in entries])                    # (L_sel, h_sel, n, n)
        parts.append(combined([
            render_heatmap(weights, title="Raw weights", color_scale=color_scale, **rows, **labels),
            render_heatmap(norms, title="Norms ‖α f(x)‖", color_scale="max" if color_scale == "fixed" else color_scale,
                           quantity="norm", **rows, **labels)], across=True))
    parts += interventions.pictures(params, result, tokens, settings, color_scale)
    return combined(parts, across=False)
