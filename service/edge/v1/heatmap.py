"""POST /v1/heatmap and GET /v1/demos/{name}/heatmap: attention weights as SVG pictures."""

from __future__ import annotations

from typing import Any

from flask import Response
from werkzeug.exceptions import NotFound

from schemas.heatmap import HeatmapRequest
from service.edge.context import current_limits
from service.edge.examples import Computed
from service.edge.smorest import BODY_ERRORS, Blueprint
from service.edge.v1 import SVG, negotiated, svg_doc, svg_response
from service.operations import pictures
from service.operations.reference import DEMOS
from service.settings import Limits

blp = Blueprint("heatmap", __name__, url_prefix="/v1",
                description="Attention weights as SVG heatmaps (also `Accept: image/svg+xml` on the compute "
                            "endpoints, and their /heatmap paths).")

EXAMPLE = {"weights": [[[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [0.2, 0.3, 0.5]],
                       [[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.1, 0.1, 0.8]]],
           "mask": [[True, False, False], [True, True, False], [True, True, True]],
           "row_labels": ["cat", "ate", "food"], "col_labels": ["cat", "ate", "food"],
           "title": "Two causal heads", "annotate": True, "decimals": 2}
EXAMPLE_SVG = Computed(lambda: pictures.heatmap(HeatmapRequest().load(EXAMPLE), Limits()))  # the real answer


@blp.route("/heatmap", methods=["POST"])
@negotiated((SVG,))
@blp.arguments(HeatmapRequest, example=EXAMPLE)
@blp.doc(**svg_doc("A standalone SVG document: one heatmap per head, a 0..1 colour legend.", EXAMPLE_SVG))
@blp.documents(*BODY_ERRORS, 406)
def heatmap(params: dict[str, Any], media: str) -> Response:
    """Draw attention weights.

    One heatmap per head (query tokens as rows, key tokens as columns), coloured on a 0..1 scale (or per
    row, or up to the largest weight: color_scale) with its legend; the cells the mask hides are hatched.
    Each cell carries its value in `data-value` and a hover `<title>`. At most max_heatmap_cells cells
    (see GET /v1/limits).
    """
    return svg_response(pictures.heatmap(params, current_limits()))


@blp.route("/demos/<string:name>/heatmap", methods=["GET"])
@negotiated((SVG,))
@blp.doc(**svg_doc("The demo's attention weights as an SVG heatmap (the example: lookup).",
                   Computed(lambda: pictures.demo_heatmap("lookup"))))
@blp.documents(404, 406)
def demo_heatmap(name: str, media: str) -> Response:
    """Draw a demo's weights.

    For the demos that show attention weights: lookup, causal-mask, multi-head (404 for the others).
    """
    if name not in DEMOS:
        raise NotFound(f"No demo {name!r}; the demos are {', '.join(DEMOS)}.")
    svg = pictures.demo_heatmap(name)
    if svg is None:
        raise NotFound(f"The demo {name!r} shows no attention weights; the demos with a heatmap are "
                       f"{', '.join(pictures.demos_with_heatmaps())}.")
    return svg_response(svg)
