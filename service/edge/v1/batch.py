"""POST /v1/batch: many v1 requests in one call, computed vectorised, with a status per item.

Order of checks: the body (415/413/400, as every endpoint), then the item count (413, before the
items are looked at), the envelope (422 for the whole batch), each item's body with its v1
endpoint's schema (422 for that item alone), the total work (413), and only then compute
(service.batching). Pointers in item errors are from the root of the batch request:
``/requests/3/body/query/0``, so they mean the same whether read alone or in the whole answer.
"""

from __future__ import annotations

import logging
from typing import Any

from marshmallow import Schema, ValidationError
from werkzeug.exceptions import HTTPException, InternalServerError

from attention.errors import AttentionError
from schemas.batch import batch_schemas
from service.edge.context import current_limits
from service.edge.errors import HTTPError, attention_problem, problem_body
from service.edge.jsonio import JSON, round_arrays
from service.edge.smorest import BODY_ERRORS, Blueprint
from service.edge.v1 import examples, negotiated
from service.operations import batching, sizes
from service.operations.limits import Limits
from service.operations.registry import BATCH_OPERATIONS
from service.problems import LIMIT_EXCEEDED, Problem, ValidationProblem, invalid, pointer
from service.runtime import metrics

log = logging.getLogger(__name__)
BatchRequest, BatchResponse = batch_schemas({name: (op.batch_request, op.response)
                                             for name, op in BATCH_OPERATIONS.items()})
# One instance per op, reused: loading keeps no state between calls.
REQUESTS: dict[str, Schema] = {name: op.batch_request() for name, op in BATCH_OPERATIONS.items()}


class BatchTooLarge(Problem):
    """413: more items, or more work in all, than one batch may hold (see GET /v1/limits)."""

    code = 413
    problem_type = LIMIT_EXCEEDED

    def __init__(self, name: str, value: int, maximum: int, errors: list[dict[str, str]] | None = None,
                 drawn: int = 0) -> None:
        what = "items" if name == "max_batch_items" else "units of work"
        if drawn:
            what += f" ({drawn} of them the random weights its seeded layers draw)"
        super().__init__(f"The batch has {value} {what}; the limit {name} is {maximum} (see GET /v1/limits). "
                         "Split it.", limit={"name": name, "maximum": maximum, "value": value}, errors=errors)


HEAVIEST_NAMED = 5  # items a batch past its budget names, the costliest first: where to split it


def _heaviest(indexes: list[int], costs: list[int]) -> list[dict[str, str]]:
    """The costliest items (pointer and units of work), at most HEAVIEST_NAMED, the costliest first."""
    ranked = sorted(zip(costs, indexes, strict=True), key=lambda pair: (-pair[0], pair[1]))[:HEAVIEST_NAMED]
    return [{"pointer": pointer("requests", index), "detail": f"{cost} units of work"} for cost, index in ranked]


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
    outcomes: list[Any] = [_load(index, item) for index, item in enumerate(requests)]
    sized = []  # (index, (op, params), work) of the items within their own limits
    for index, outcome in enumerate(outcomes):
        if not isinstance(outcome, Exception):
            try:
                operation = BATCH_OPERATIONS[outcome[0]]
                if operation.admit is not None:
                    operation.admit(outcome[1], limits)
                work = operation.work(outcome[1])
                sizes.check(work, limits)  # as its single endpoint would: a 422 of its own, counting nothing
            except Problem as error:
                outcomes[index] = _rooted(index, error)
            else:
                sized.append((index, outcome, work))
    costs = [sizes.cost(work) for _, _, work in sized]
    drawn = sizes.draws(work for _, _, work in sized)
    if (total := sum(costs) + drawn) > limits.max_batch_elements:
        raise BatchTooLarge("max_batch_elements", total, limits.max_batch_elements,
                            _heaviest([index for index, _, _ in sized], costs), drawn)
    results = batching.run([item for _, item, _ in sized], limits)
    for (index, (_, params), _), result in zip(sized, results, strict=True):
        if isinstance(result, Exception):
            outcomes[index] = _rooted(index, result)
        else:  # rounded, exactly as the single endpoint does
            outcomes[index] = round_arrays(result, params.get("decimals"))
    return [_response(item["id"], outcome) for item, outcome in zip(requests, outcomes, strict=True)]


def _load(index: int, item: dict[str, Any]) -> tuple[str, sizes.Params] | ValidationProblem:
    """(op, params) validated with the op's v1 schema, or a 422 pointing into this item's body."""
    try:
        return item["op"], REQUESTS[item["op"]].load(item["body"])
    except ValidationError as error:
        return invalid(error.messages, ("requests", index, "body"))


def _rooted(index: int, error: Exception) -> HTTPError:
    """A compute error as the problem its single endpoint would answer, pointers from the batch root.

    A query parameter (positional-encoding's limits) is a body member here, so it gets a pointer.
    """
    if isinstance(error, AttentionError):
        error = attention_problem(error)
    elif not isinstance(error, HTTPException | Problem):
        log.error("unhandled error in batch item %d", index, exc_info=error)
        return InternalServerError("The server failed to answer this item; this is a bug.")
    root = pointer("requests", index, "body")
    if isinstance(error, Problem) and "errors" in error.members:
        error.members["errors"] = [
            {"pointer": root + (e["pointer"] if "pointer" in e else pointer(e["parameter"])), "detail": e["detail"]}
            for e in error.members["errors"]]
    return error


def _response(item_id: str, outcome: Any) -> dict[str, Any]:
    if isinstance(outcome, HTTPException | Problem):
        error = problem_body(outcome)
        return {"id": item_id, "status": error["status"], "error": error}
    return {"id": item_id, "status": 200, "body": outcome}


EXAMPLE = examples.request("batch")
with metrics.unrecorded():  # the documented answer is computed at import: nobody's work
    EXAMPLE_ANSWER = examples.as_json({"responses": answer(EXAMPLE["requests"], Limits())})


@blp.route("/batch", methods=["POST"])
@negotiated((JSON,))
@blp.arguments(BatchRequest, example=EXAMPLE, precheck=_count_items)
@blp.response(200, BatchResponse, dump=False, example=EXAMPLE_ANSWER)
@blp.documents(*BODY_ERRORS, 406)
def batch(envelope: dict[str, Any], media: str) -> dict[str, Any]:
    """Many requests in one call.

    Each item names an `op` (attention, self-attention, multi-head-attention, encoder, embed,
    positional-encoding, model-attention) and carries the `body` that endpoint takes (model-attention:
    POST /v1/models/{model}/attention's body plus `"model"`, the model's name). The answer has one
    `{id, status, body}` or `{id, status, error}` per item, in request order: a bad item gets its
    own 4xx problem (pointers from the root of this request) and every other item exactly what its
    single endpoint answers. Items sharing an op, shapes and options are stacked and computed in
    one vectorised engine call (a model's items: same model, length in tokens and options; trace items, embed
    and positional-encoding are computed one by one).
    Whole-batch errors: 422 for the envelope (not an object, no or empty `requests`, missing or
    duplicate ids, unknown op), 413 past `max_batch_items` or `max_batch_elements` (GET /v1/limits).
    """
    metrics.observe_batch(len(envelope["requests"]))
    return {"responses": answer(envelope["requests"], current_limits())}
