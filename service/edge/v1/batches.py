"""/v1/batches: OpenAI's Batch API, work that outlives a request (service.jobs.batches holds the records; the
workers compute)."""

from __future__ import annotations

from typing import Any

from schemas.jobs import BATCH_EXAMPLE, BatchList, BatchListQuery, BatchObject, CreateBatchRequest, list_example
from service.edge.context import current_jobs
from service.edge.security import owner
from service.edge.smorest import BODY_ERRORS, Blueprint
from service.edge.v1 import jobsgate
from service.jobs import batches

CREATED = {"status": "validating", "output_file_id": None, "error_file_id": None, "in_progress_at": None,
           "finalizing_at": None, "completed_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0}}
blp = Blueprint("batches", __name__, url_prefix="/v1",
                description="Batch jobs: a file of requests computed by workers (OpenAI's Batch API).")
jobsgate.guard(blp)


@blp.route("/batches", methods=["POST"])
@blp.arguments(CreateBatchRequest, example={"input_file_id": "file-0123456789abcdef01234567",
                                      "endpoint": "/v1/multi-head-attention", "completion_window": "24h"})
@blp.response(200, BatchObject, dump=False, example={**BATCH_EXAMPLE, **CREATED})
@blp.documents(*BODY_ERRORS, jobs=True)
def create_batch(body: dict[str, Any]) -> dict[str, Any]:
    """Create a batch.

    Answers at once, `validating`: a worker checks every line of the file (JSON, a unique `custom_id`, `method`
    POST, `url` equal to `endpoint`, max_job_requests and max_line_bytes), then computes it in chunks
    (`in_progress`, `request_counts` moving), then writes the output and error files (`finalizing`, `completed`).
    A bad line fails the batch (`errors`); a body its endpoint refuses is that request's line in the error file,
    with the problem and status the endpoint would answer.
    """
    return batches.create(current_jobs(), owner(), body)


@blp.route("/batches", methods=["GET"])
@blp.arguments(BatchListQuery, location="query")
@blp.response(200, BatchList, dump=False, example=list_example(BATCH_EXAMPLE))
@blp.documents(404, 422, jobs=True)
def list_batches(query: dict[str, Any]) -> dict[str, Any]:
    """Your batches, newest first (paged by `after`)."""
    return batches.listing(current_jobs(), owner(), query["limit"], query.get("after"))


@blp.route("/batches/<batch_id>", methods=["GET"])
@blp.response(200, BatchObject, dump=False, example=BATCH_EXAMPLE)
@blp.documents(404, jobs=True)
def get_batch(batch_id: str) -> dict[str, Any]:
    """A batch's state."""
    return batches.get(current_jobs(), owner(), batch_id)


@blp.route("/batches/<batch_id>/cancel", methods=["POST"])
@blp.response(200, BatchObject, dump=False, example=BATCH_EXAMPLE)
@blp.documents(404, 409, jobs=True)
def cancel_batch(batch_id: str) -> dict[str, Any]:
    """Cancel a batch.

    `cancelling` until the chunks in workers' hands finish (their results are kept), then `cancelled`; every
    request not run gets a `batch_cancelled` line in the error file. 409 once the batch has ended.
    """
    return batches.cancel(current_jobs(), owner(), batch_id)
