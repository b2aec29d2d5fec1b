"""What the batch jobs' blueprints (files, batches) share: a 501 where batch jobs are not served here
(ATTENTION_BATCH_JOBS=0: a KServe predictor, which runs no job worker), and a 503 with ``Retry-After`` when their
queue and records do not answer (service.jobs.queue.Unavailable), instead of a 500 or a request that hangs."""

from __future__ import annotations

from flask import Response, current_app

from service.edge.errors import handle_http_exception, handle_unexpected
from service.edge.smorest import Blueprint
from service.jobs import queue
from service.problems import TYPE_BASE, Problem

NOT_SERVED = TYPE_BASE + "jobs-not-served"


class NotServed(Problem):
    """501: this deployment runs no batch jobs; the detail says where they run."""

    code = 501
    problem_type = NOT_SERVED


def guard(blp: Blueprint) -> None:
    """Give the batch jobs' blueprint ``blp`` its 501 and its 503."""
    blp.before_request(_served)
    blp.register_error_handler(Exception, _unavailable_or_unexpected)


def _served() -> None:
    if not current_app.extensions["jobs"].settings.served:
        raise NotServed("Batch jobs are not served by this deployment (ATTENTION_BATCH_JOBS=0: a KServe predictor "
                        "runs no job worker). They run where the API shares a queue and a data volume with job "
                        "workers: deploy/k8s (the attention and attention-worker Deployments) or docker compose; "
                        "see docs/kubernetes.md#batch-job-workers.")


def _unavailable_or_unexpected(error: Exception) -> Response:
    """A queue that did not answer is a 503 (logged as a warning); any other error is answered as the app's own
    handlers answer it (this handler, the blueprint's, is asked first for every error of its views)."""
    if isinstance(error, queue.unreachable()):
        current_app.logger.warning("the batch jobs' queue did not answer: %r", error)
        timeout = current_app.extensions["jobs"].settings.queue_timeout_seconds
        return handle_http_exception(queue.Unavailable(timeout))
    return handle_unexpected(error)
