"""What the heatmaps show: a request's weights, a compute answer's weights, a demo's weights.

Pure functions (no Flask) returning SVG text; each checks ``max_heatmap_cells`` before drawing.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

import numpy as np

import attention as engine
from service.operations.heatmap import render_heatmap
from service.operations.limits import Limits


class Drawing(NamedTuple):
    """How an operation's weights are titled and how their leading axes are named (the registry's ``drawing``)."""

    title: str
    before_batch: tuple[str, ...]  # leading axes before the optional batch axis
    after_batch: tuple[str, ...]   # ... and after it


def draw(weights: np.ndarray, limits: Limits, *, where: dict[str, str], **options: Any) -> str:
    """SVG of ``weights`` (n_q, n_k) or (p, n_q, n_k), refused (422) past ``max_heatmap_cells``.

    ``where`` locates the culprit in the request for the error: ``{"pointer": ...}`` or
    ``{"parameter": ...}``. ``options`` go to :func:`render_heatmap`.
    """
    limits.check("max_heatmap_cells", int(weights.size), **where)
    return render_heatmap(weights, **options)


def heatmap(params: dict[str, Any], limits: Limits) -> str:
    """POST /v1/heatmap: validated params (schemas.heatmap.HeatmapRequest) -> SVG."""
    return draw(params["weights"], limits, where={"pointer": "/weights"},
                **{key: params.get(key) for key in ("row_labels", "col_labels", "title", "annotate")},
                decimals=params["decimals"])


def panel_titles(leading: tuple[int, ...], axes: tuple[str, ...]) -> list[str]:
    """"layer 0 · head 1"-style titles for every index of the leading axes (C order)."""
    return [" · ".join(f"{axis} {i}" for axis, i in zip(axes, index, strict=True)) for index in np.ndindex(*leading)]


def compute_heatmap(drawing: Drawing, params: dict[str, Any], result: dict[str, Any], limits: Limits) -> str:
    """SVG of the weights in an operation's ``result`` (its ``layers``' for a stack), labelled with the tokens if
    given. A model's layers say which layer and heads they are: one row of panels per layer, titled by them."""
    layout = {}
    if "layers" in result:
        weights = np.stack([layer["weights"] for layer in result["layers"]])  # (L, B?, h, n, n)
    else:
        weights = np.asarray(result["weights"])  # (B?, h?, n_q, n_k)
    if result.get("layers") and "heads" in result["layers"][0]:
        layers = result["layers"]
        titles = [f"layer {layer['layer']} · head {head}" for layer in layers for head in layer["heads"]]
        layout["columns"] = len(layers[0]["heads"])
    else:
        named = len(drawing.before_batch) + len(drawing.after_batch)
        batch = ("batch",) if weights.ndim - 2 > named else ()
        titles = panel_titles(weights.shape[:-2], (*drawing.before_batch, *batch, *drawing.after_batch))
    tokens = result.get("tokens") or params.get("tokens")
    return draw(weights.reshape(-1, *weights.shape[-2:]), limits, where={"parameter": "format"},
                row_labels=tokens, col_labels=tokens, title=drawing.title, panel_titles=titles, **layout)


@cache
def demo_heatmap(name: str) -> str | None:
    """SVG of demo ``name``'s weights (tokens as labels); None for a demo without weights."""
    demo = engine.DEMOS[name]
    result = demo.run()
    if "weights" not in result:
        return None
    tokens = list(result["tokens"])
    rows = [result["query_token"]] if "query_token" in result else tokens  # lookup: one query row
    return render_heatmap(np.asarray(result["weights"]), row_labels=rows, col_labels=tokens, title=demo.title)


def demos_with_heatmaps() -> list[str]:
    """Names of the demos that show attention weights."""
    return [name for name in engine.DEMOS if demo_heatmap(name) is not None]
