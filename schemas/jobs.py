"""Batch jobs: OpenAI's Files and Batch API objects, field for field (the official ``openai`` client reads them),
and the requests that create and list them."""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate, validates

from schemas.base import Schema
from schemas.fields import QueryInteger

COMPLETION_WINDOWS = ("24h",)
STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")
MAX_METADATA = 16  # OpenAI's limits on metadata: pairs, key and value lengths
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512


def _timestamp(description: str, nullable: bool = True) -> fields.Integer:
    return fields.Integer(required=True, allow_none=nullable, metadata={"description": description + " (Unix s)."})


class FileObject(Schema):
    """An uploaded file, or a batch's output or error file (purpose ``batch_output``)."""

    id = fields.String(required=True)
    object = fields.String(required=True, validate=validate.Equal("file"))
    bytes = fields.Integer(required=True)
    created_at = _timestamp("When it was stored", nullable=False)
    expires_at = _timestamp("When it is deleted (file_retention_seconds later), unless a batch still needs it",
                            nullable=False)
    filename = fields.String(required=True)
    purpose = fields.String(required=True, validate=validate.OneOf(("batch", "batch_output")))
    status = fields.String(required=True, metadata={"description": "Always processed: stored whole, or not at all."})


class FileDeleted(Schema):
    """The answer to DELETE /v1/files/{file_id}."""

    id = fields.String(required=True)
    object = fields.String(required=True, validate=validate.Equal("file"))
    deleted = fields.Boolean(required=True)


class UploadQuery(Schema):
    """For a raw upload (Content-Type application/x-ndjson): the form's fields as query parameters."""

    purpose = fields.String(validate=validate.Equal("batch"), metadata={
        "description": "batch (required with a raw body; a form gives it as its purpose field)."})
    filename = fields.String(validate=validate.Length(1, 255), metadata={
        "description": "The name kept with a raw body (default input.jsonl)."})


class ListQuery(Schema):
    """A page of a list, newest first: ``after`` the last id of the previous page."""

    limit = QueryInteger(load_default=20, validate=validate.Range(1, 10_000), metadata={
        "description": "At most this many (1-10000)."})
    after = fields.String(validate=validate.Length(1, 200), metadata={"description": "The last id of the previous "
                                                                                     "page."})


class FileListQuery(ListQuery):
    """GET /v1/files: all of them, or of one purpose."""

    limit = QueryInteger(load_default=10_000, validate=validate.Range(1, 10_000), metadata={
        "description": "At most this many (1-10000)."})
    purpose = fields.String(validate=validate.OneOf(("batch", "batch_output")))


class BatchListQuery(ListQuery):
    """GET /v1/batches."""

    limit = QueryInteger(load_default=20, validate=validate.Range(1, 100), metadata={
        "description": "At most this many (1-100)."})


class CreateBatchRequest(Schema):
    """POST /v1/batches: a file of requests to one endpoint, run within the window."""

    input_file_id = fields.String(required=True, validate=validate.Length(1, 200), metadata={
        "description": "A file uploaded with purpose batch: one {custom_id, method, url, body} per line."})
    endpoint = fields.String(required=True, validate=validate.Length(1, 200), metadata={
        "description": "The v1 endpoint every line's url names, e.g. /v1/multi-head-attention or "
                       "/v1/models/{model}/attention."})
    completion_window = fields.String(required=True, validate=validate.OneOf(COMPLETION_WINDOWS), metadata={
        "description": "24h: the batch expires if not done by then (ATTENTION_BATCH_WINDOW_SECONDS)."})
    metadata = fields.Dict(keys=fields.String(validate=validate.Length(1, MAX_METADATA_KEY)),
                           values=fields.String(validate=validate.Length(max=MAX_METADATA_VALUE)),
                           allow_none=True, metadata={"description": "Up to 16 pairs of strings, kept as they are."})

    @validates("metadata")
    def _few_pairs(self, value: dict[str, Any] | None, **kwargs: Any) -> None:
        if value is not None and len(value) > MAX_METADATA:
            raise ValidationError(f"At most {MAX_METADATA} pairs.")


class BatchError(Schema):
    """One reason a batch failed validation."""

    code = fields.String(required=True)
    line = fields.Integer(required=True, allow_none=True, metadata={"description": "From 1."})
    message = fields.String(required=True)
    param = fields.String(required=True, allow_none=True)


class BatchErrors(Schema):
    object = fields.String(required=True, validate=validate.Equal("list"))
    data = fields.List(fields.Nested(BatchError), required=True)


class RequestCounts(Schema):
    total = fields.Integer(required=True)
    completed = fields.Integer(required=True)
    failed = fields.Integer(required=True)


class BatchObject(Schema):
    """A batch: its state and, once done, its output and error files (one line per request, in any order)."""

    id = fields.String(required=True)
    object = fields.String(required=True, validate=validate.Equal("batch"))
    endpoint = fields.String(required=True)
    errors = fields.Nested(BatchErrors, required=True, allow_none=True)
    input_file_id = fields.String(required=True)
    completion_window = fields.String(required=True)
    status = fields.String(required=True, validate=validate.OneOf(STATUSES))
    output_file_id = fields.String(required=True, allow_none=True)
    error_file_id = fields.String(required=True, allow_none=True)
    created_at = _timestamp("When it was created", nullable=False)
    in_progress_at = _timestamp("When its file was validated")
    expires_at = _timestamp("When it expires unless done", nullable=False)
    finalizing_at = _timestamp("When its last chunk was done")
    completed_at = _timestamp("When its files were ready")
    failed_at = _timestamp("When its file failed validation")
    expired_at = _timestamp("When it expired")
    cancelling_at = _timestamp("When its cancellation was asked")
    cancelled_at = _timestamp("When it was cancelled")
    request_counts = fields.Nested(RequestCounts, required=True, metadata={
        "description": "Moves as chunks are done; failed counts every error line."})
    metadata = fields.Dict(keys=fields.String(), values=fields.String(), required=True, allow_none=True)


def page_of(item: type[Schema], name: str) -> type[Schema]:
    """OpenAI's list object of ``item``s."""
    return Schema.from_dict({
        "object": fields.String(required=True, validate=validate.Equal("list")),
        "data": fields.List(fields.Nested(item), required=True),
        "first_id": fields.String(required=True, allow_none=True),
        "last_id": fields.String(required=True, allow_none=True),
        "has_more": fields.Boolean(required=True)}, name=name)


FileList = page_of(FileObject, "FileList")
BatchList = page_of(BatchObject, "BatchList")


# Documented examples (the shapes are the schemas'; the service's real answers are checked against both).
FILE_EXAMPLE = {"id": "file-0123456789abcdef01234567", "object": "file", "bytes": 1840, "created_at": 1764662400,
                "expires_at": 1767254400, "filename": "requests.jsonl", "purpose": "batch", "status": "processed"}
BATCH_EXAMPLE = {
    "id": "batch_89abcdef0123456789abcdef", "object": "batch", "endpoint": "/v1/multi-head-attention", "errors": None,
    "input_file_id": FILE_EXAMPLE["id"], "completion_window": "24h", "status": "completed",
    "output_file_id": "file-89abcdef0123456789abcdefout", "error_file_id": "file-89abcdef0123456789abcdeferr",
    "created_at": 1764662410, "in_progress_at": 1764662410, "expires_at": 1764748810, "finalizing_at": 1764662412,
    "completed_at": 1764662412, "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
    "request_counts": {"total": 10, "completed": 9, "failed": 1}, "metadata": {"corpus": "lesson-3"}}


def list_example(item: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's list object of one ``item``."""
    return {"object": "list", "data": [item], "first_id": item["id"], "last_id": item["id"], "has_more": False}
