"""GET /v1/demos and /v1/demos/{name}: the seed script's five demos as data."""

from __future__ import annotations

from typing import Any

from werkzeug.exceptions import NotFound

from schemas.demos import DemoList, DemoResult
from service.edge.examples import Computed
from service.edge.smorest import Blueprint
from service.operations.reference import DEMOS, Demo
from service.operations.reference import run_demo as run

blp = Blueprint("demos", __name__, url_prefix="/v1", description="The seed script's demos, as data.")


def _summary(demo: Demo) -> dict[str, str]:
    return {"name": demo.name, "title": demo.title, "summary": demo.summary}


def _causal_mask_example(tokens: int = 2, decimals: int = 4) -> dict[str, Any]:
    """The causal-mask demo's real answer, cut to its first ``tokens`` tokens (its rows sum to 1 still: a
    causal row has nothing past its own token), rounded: the last digits of the full answer depend on the BLAS
    kernel of the machine, and the checked-in spec must not."""
    result = run("causal-mask")
    return {**_summary(DEMOS["causal-mask"]),
            "result": {"tokens": result["tokens"][:tokens], "mask": result["mask"][:tokens, :tokens].tolist(),
                       "weights": result["weights"][:tokens, :tokens].round(decimals).tolist()}}


@blp.route("/demos", methods=["GET"])
@blp.response(200, DemoList, example={"demos": [_summary(DEMOS["lookup"])]})
def list_demos() -> dict[str, Any]:
    """List the demos.

    Names, titles and summaries of the seed script's demos, in its order.
    """
    return {"demos": [_summary(demo) for demo in DEMOS.values()]}


@blp.route("/demos/<string:name>", methods=["GET"])
@blp.response(200, DemoResult, example=Computed(_causal_mask_example))
@blp.documents(404)
def run_demo(name: str) -> dict[str, Any]:
    """Run one demo.

    The numbers the seed script prints for this demo (the example: causal-mask's, cut to two tokens,
    rounded). Names: lookup, scaling, positional-encoding, causal-mask, multi-head.
    """
    demo = DEMOS.get(name)
    if demo is None:
        raise NotFound(f"No demo {name!r}; the demos are {', '.join(DEMOS)}.")
    return {**_summary(demo), "result": run(name)}
