"""What the heatmaps show: a request's weights, a compute answer's weights, a demo's weights.

Pure functions (no Flask) returning SVG text; each checks ``max_heatmap_cells`` before drawing. A compute answer is
drawn with what its operation's ``drawing`` (service.operations.registry) says of the run: the settings written
under the title and the cells its request hid (its mask, causal), so a picture never guesses them from the values.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

import attention as engine
from service.operations.heatmap import render_heatmap
from service.operations.inputs import Result
from service.operations.registry import OPERATIONS, Drawing
from service.operations.sizes import Params
from service.settings import Limits


def draw(weights: np.ndarray, limits: Limits, *, where: dict[str, str], **options: Any) -> str:
    """SVG of ``weights`` (n_q, n_k), (p, n_q, n_k) or (r, c, n_q, n_k), refused (422) past ``max_heatmap_cells``.

    ``where`` locates the culprit in the request for the error: ``{"pointer": ...}`` or
    ``{"parameter": ...}``. ``options`` go to :func:`render_heatmap`.
    """
    limits.check("max_heatmap_cells", int(weights.size), **where)
    return render_heatmap(weights, **options)


def heatmap(params: dict[str, Any], limits: Limits) -> str:
    """POST /v1/heatmap: validated params (schemas.heatmap.HeatmapRequest) -> SVG. Its ``mask`` (true = may
    attend) says which cells are masked."""
    mask = params.get("mask")
    return draw(params["weights"], limits, where={"pointer": "/weights"},
                **{key: params.get(key) for key in ("row_labels", "col_labels", "title", "annotate")},
                hidden=None if mask is None else ~mask, color_scale=params["color_scale"],
                decimals=params["decimals"])


def hidden_cells(mask: np.ndarray | None, causal: bool, shape: tuple[int, ...], offset: int = 0) -> np.ndarray | None:
    """True where the engine hid a cell of weights of ``shape`` (..., n_q, n_k): where ``mask`` (broadcast from the
    right, true = may attend) is false or, with ``causal``, a key comes after its query (query i stands at
    position i + ``offset``). None: nothing is hidden."""
    if mask is None and not causal:
        return None
    allowed = np.ones(shape[-2:], dtype=bool) if mask is None else mask
    if causal:
        allowed = allowed & np.tri(*shape[-2:], k=offset, dtype=bool)  # key j is visible to query i iff j <= i + offset
    return ~np.broadcast_to(allowed, shape)


def panel_titles(leading: tuple[int, ...], axes: tuple[str, ...], values: dict[str, list[int]]) -> list[str]:
    """"layer 0 · batch 1"-style titles for every index of the leading axes (C order); ``values`` names an axis's
    indices when they are not 0, 1, ... (a model's selected layers)."""
    return [" · ".join(f"{axis} {values.get(axis, range(size))[i]}" for axis, i, size in zip(axes, index, leading,
                                                                                           strict=True))
            for index in np.ndindex(*leading)]


def _drawn(drawing: Drawing, params: Params, result: Result) -> tuple[np.ndarray, dict[str, Any]]:
    """The weights of a compute answer as they are drawn, and how (render_heatmap's options). Heads go along a row,
    one row per layer and batch item; without a head axis the batch items wrap as they fit."""
    settings = drawing.settings(params, result)
    if drawing.arranged is not None:
        result = drawing.arranged(params, result)
    if "layers" in result:
        weights = np.stack([layer["weights"] for layer in result["layers"]])  # (L, B?, h, n, n)
    else:
        weights = np.asarray(result["weights"])  # (B?, h?, n_q, n_k)
    named = len(drawing.before_batch) + len(drawing.after_batch)
    axes = (*drawing.before_batch, *(("batch",) if weights.ndim - 2 > named else ()), *drawing.after_batch)
    values = {}
    if result.get("layers") and "heads" in result["layers"][0]:  # a model's selected layers and heads
        values = {"layer": [layer["layer"] for layer in result["layers"]], "head": result["layers"][0]["heads"]}
    tokens = result.get("tokens") or params.get("tokens")
    rows = result.get("row_tokens", tokens)  # a generation's rows: its new tokens, the last of the tokens
    offset = len(tokens) - len(rows) if rows is not tokens else 0
    hidden = hidden_cells(drawing.mask(params), drawing.causal(params), weights.shape, offset)
    options = {"row_labels": rows, "col_labels": tokens, "title": drawing.title,
               "settings": settings}
    if axes[-1:] == ("head",):
        drawn = weights.reshape(-1, *weights.shape[-3:])  # (rows, h, n, n)
        options["panel_titles"] = panel_titles(weights.shape[-3:-2], ("head",), values)
        options["row_titles"] = panel_titles(weights.shape[:-3], axes[:-1], values) if weights.ndim > 3 else None
    else:
        drawn = weights.reshape(-1, *weights.shape[-2:])  # (p, n_q, n_k)
        options["panel_titles"] = panel_titles(weights.shape[:-2], axes, values)
    options["hidden"] = None if hidden is None else hidden.reshape(drawn.shape)
    return drawn, options


def compute_heatmap(drawing: Drawing, params: Params, result: Result, limits: Limits,
                    color_scale: str = "fixed") -> str:
    """SVG of the weights in an operation's ``result`` (its ``layers``' for a stack), labelled with the tokens if
    given, on ``color_scale`` (schemas.heatmap.COLOR_SCALES); or the operation's own picture of it."""
    if drawing.picture is not None:
        return drawing.picture(params, result, color_scale)
    weights, options = _drawn(drawing, params, result)
    return draw(weights, limits, where={"parameter": "format"}, color_scale=color_scale, **options)


# Each demo that shows weights, as the request to an operation that computes exactly its weights (a unit test
# checks they are equal bit for bit), so its picture states the settings and the mask as that answer's would.
_EMBEDDINGS = [engine.EMBEDDINGS[word].tolist() for word in engine.demos.SENTENCE]
DEMO_REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "lookup": ("attention", {"query": _EMBEDDINGS[-1:], "key": _EMBEDDINGS, "value": _EMBEDDINGS}),
    "causal-mask": ("self-attention", {"tokens": engine.demos.SENTENCE, "seed": 3, "positional_encoding": True,
                                       "causal": True}),
    "multi-head": ("multi-head-attention", {"tokens": engine.demos.SENTENCE, "d_model": 8, "n_heads": 4,
                                            "positional_encoding": True, "causal": True}),
}


@cache
def demo_heatmap(name: str) -> str | None:
    """SVG of demo ``name``'s weights (tokens as labels); None for a demo without weights. The weights are the
    demo's own (no request is computed: the API's work metrics count only requests)."""
    if name not in DEMO_REQUESTS:
        return None
    demo, (op_name, body) = engine.DEMOS[name], DEMO_REQUESTS[name]
    drawing = OPERATIONS[op_name].drawing
    params = OPERATIONS[op_name].request().load(body)
    weights, options = _drawn(drawing, params, {"weights": demo.run()["weights"]})
    tokens = list(engine.demos.SENTENCE)
    rows = tokens if "tokens" in body else tokens[-1:]  # lookup: the one query, "it"
    return render_heatmap(weights, **{**options, "title": demo.title, "row_labels": rows, "col_labels": tokens})


def demos_with_heatmaps() -> list[str]:
    """Names of the demos that show attention weights."""
    return [name for name in engine.DEMOS if name in DEMO_REQUESTS]
