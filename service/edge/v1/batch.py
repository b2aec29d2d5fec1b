"""POST /v1/batch: many v1 requests in one call, computed vectorised, with a status per item.

Order of checks: the body (415/413/400, as every endpoint), then the item count (413, before the
items are looked at), the envelope (422 for the whole batch), each item's body with its v1
endpoint's schema (422 for that item alone), the total work (413), and only then compute
(service.operations.answers, as the batch jobs' workers). Pointers in item errors are from the root of the
batch request:
``/requests/3/body/query/0``, so they mean the same whether read alone or in the whole answer.
"""

from __future__ import annotations

from typing import Any

from schemas.batch import batch_schemas
from service.edge.context import current_limits
from service.edge.examples import Computed
from service.edge.jsonio import JSON
from service.edge.smorest import BODY_ERRORS, Blueprint
from service.edge.v1 import examples, negotiated
from service.operations import answers, sizes
from service.operations.registry import BATCH_OPERATIONS
from service.problems import LIMIT_EXCEEDED, Problem, pointer, problem_members
from service.runtime import metrics
from service.settings import Limits

BatchRequest, BatchResponse = batch_schemas({name: (op.batch_request, op.response)
                                             for name, op in BATCH_OPERATIONS.items()})


class BatchTooLarge(Problem):
    """413: more items, or more work in all, than one batch may hold (see GET /v1/limits)."""

    code = 413
    problem_type = LIMIT_EXCEEDED

    def __init__(self, name: str, value: int, maximum: int, errors: list[dict[str, str]] | None = None,
                 drawn: int = 0) -> None:
        what = {"max_batch_items": "items", "max_batch_new_tokens": "new tokens"}.get(name, "units of work")
        if drawn:
            what += f" ({drawn} of them the random weights its seeded layers draw)"
        super().__init__(f"The batch has {value} {what}; the limit {name} is {maximum} (see GET /v1/limits). "
                         "Split it.", limit={"name": name, "maximum": maximum, "value": value}, errors=errors)


HEAVIEST_NAMED = 5  # items a batch past its budget names, the costliest first: where to split it


def _heaviest(indexes: list[int], costs: list[int], unit: str = "units of work") -> list[dict[str, str]]:
    """The costliest items (pointer and cost in ``unit``), at most HEAVIEST_NAMED, the costliest first."""
    ranked = sorted(zip(costs, indexes, strict=True), key=lambda pair: (-pair[0], pair[1]))[:HEAVIEST_NAMED]
    return [{"pointer": pointer("requests", index), "detail": f"{cost} {unit}"} for cost, index in ranked if cost]


def _count_items(body: Any) -> None:
    """413 past ``max_batch_items``, before any item is validated."""
    requests = body.get("requests") if isinstance(body, dict) else None
    maximum = current_limits().max_batch_items
    if isinstance(requests, list) and len(requests) > maximum:
        raise BatchTooLarge("max_batch_items", len(requests), maximum)


blp = Blueprint("batch", __name__, url_prefix="/v1",
                description="Many requests in one call, computed vectorised, with a status per item.")


def answer(requests: list[dict[str, Any]], limits: Limits) -> list[dict[str, Any]]:
    """One ``{id, status, body | error}`` per item of a valid envelope, in order."""
    outcomes, sized = answers.size([(item["op"], item["body"]) for item in requests], limits, _root)
    costs = [item.cost for item in sized]
    drawn = sizes.draws(item.prepared.work for item in sized)
    if (total := sum(costs) + drawn) > limits.max_batch_elements:
        raise BatchTooLarge("max_batch_elements", total, limits.max_batch_elements,
                            _heaviest([item.index for item in sized], costs), drawn)
    tokens = [item.prepared.work.new_tokens for item in sized]
    if (generated := sum(tokens)) > limits.max_batch_new_tokens:  # generations: so that it answers within the timeout
        raise BatchTooLarge("max_batch_new_tokens", generated, limits.max_batch_new_tokens,
                            _heaviest([item.index for item in sized], tokens, "new tokens"))
    for index, outcome in answers.compute(sized, _root):
        outcomes[index] = outcome
    return [_response(item["id"], outcome) for item, outcome in zip(requests, outcomes, strict=True)]


def _root(index: int) -> tuple[str | int, ...]:
    return ("requests", index, "body")


def _response(item_id: str, outcome: Any) -> dict[str, Any]:
    if isinstance(outcome, Problem):
        error = problem_members(outcome)
        return {"id": item_id, "status": error["status"], "error": error}
    return {"id": item_id, "status": 200, "body": outcome}


EXAMPLE = examples.request("batch")
EXAMPLE_ANSWER = Computed(lambda: {"responses": answer(EXAMPLE["requests"], Limits())})


@blp.route("/batch", methods=["POST"])
@negotiated((JSON,))
@blp.arguments(BatchRequest, example=EXAMPLE, precheck=_count_items)
@blp.response(200, BatchResponse, dump=False, example=EXAMPLE_ANSWER)
@blp.documents(*BODY_ERRORS, 406)
def batch(envelope: dict[str, Any], media: str) -> dict[str, Any]:
    """Many requests in one call.

    Each item names an `op` (attention, self-attention, multi-head-attention, encoder, embed,
    positional-encoding, model-attention, generate) and carries the `body` that endpoint takes (model-attention,
    generate: POST /v1/models/{model}/attention's or /generate's body plus `"model"`, the model's name; a
    generation is not streamed). The answer has one
    `{id, status, body}` or `{id, status, error}` per item, in request order: a bad item gets its
    own 4xx problem (pointers from the root of this request) and every other item exactly what its
    single endpoint answers. Items sharing an op, shapes and options are stacked and computed in
    one vectorised engine call (a model's items: same model, length in tokens and options; trace items, embed
    and positional-encoding are computed one by one).
    Whole-batch errors: 422 for the envelope (not an object, no or empty `requests`, missing or
    duplicate ids, unknown op), 413 past `max_batch_items`, `max_batch_elements` or, for the generate items'
    tokens in all, `max_batch_new_tokens` (GET /v1/limits).
    """
    metrics.observe_batch(len(envelope["requests"]))
    return {"responses": answer(envelope["requests"], current_limits())}
