"""/v1/files: OpenAI's Files API, for batch jobs' input and output (service.jobs.files holds the records)."""

from __future__ import annotations

from typing import Any

from flask import current_app, request
from werkzeug.wsgi import FileWrapper

from schemas.jobs import FILE_EXAMPLE, FileDeleted, FileList, FileListQuery, FileObject, UploadQuery, list_example
from schemas.problem import Problem
from service.edge.context import current_jobs
from service.edge.security import owner
from service.edge.smorest import Blueprint
from service.edge.v1 import jobsgate
from service.edge.v1.uploads import Upload
from service.jobs import files
from service.jobs.bodies import BLOCK
from service.problems import PROBLEM_JSON, ValidationProblem

NDJSON = "application/x-ndjson"
blp = Blueprint("files", __name__, url_prefix="/v1", description="Files for batch jobs (OpenAI's Files API).")
jobsgate.guard(blp)

FORM = {"required": True, "content": {"multipart/form-data": {
    "schema": {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary",
                 "description": "The requests, one JSON object per line: {custom_id, method, url, body}."},
        "purpose": {"type": "string", "enum": ["batch"]}}}}}}


@blp.route("/files", methods=["POST"])
@blp.arguments(UploadQuery, location="query")
@blp.doc(requestBody=FORM)
@blp.response(200, FileObject, dump=False, example=FILE_EXAMPLE)
@blp.alt_response(413, schema=Problem, content_type=PROBLEM_JSON,
                  description="The file is larger than max_file_bytes (see GET /v1/limits); nothing was kept.")
@blp.documents(400, 415, 422, jobs=True)
def upload(query: dict[str, Any]) -> dict[str, Any]:
    """Upload a file of requests.

    A multipart form with `file` and `purpose=batch` (what the openai client sends), or, for curl, the raw
    lines as the body (`Content-Type: application/x-ndjson`, `?purpose=batch`, optionally `&filename=`). The
    file streams to disk; past max_file_bytes (GET /v1/limits) it is a 413 and nothing is kept.
    """
    if request.mimetype not in ("multipart/form-data", NDJSON):
        raise ValidationProblem(f"Send a multipart/form-data form or an {NDJSON} body, not "
                                f"{request.mimetype or 'nothing'}.", errors=[{"header": "Content-Type", "detail":
                                                                              "multipart/form-data or " + NDJSON}])
    jobs = current_jobs()
    upload = Upload(request._get_current_object(), jobs.limits.max_file_bytes)
    if not upload.form and query.get("purpose") != "batch":  # before the body is read
        raise ValidationProblem("A raw upload needs ?purpose=batch.",
                                errors=[{"parameter": "purpose", "detail": "Required with a raw body: batch."}])
    file_id, size = files.save(jobs, upload.blocks())
    if upload.form and (upload.filename is None or upload.fields.get("purpose") != "batch"):
        jobs.bodies.remove(file_id)
        part = "file" if upload.filename is None else "purpose"
        detail = "Required: the file of requests." if part == "file" else "Required: batch."
        raise ValidationProblem(f"The form's {part}: {detail}", errors=[{"pointer": "/" + part, "detail": detail}])
    try:
        return files.record(jobs, owner(), file_id, size, upload.filename or query.get("filename", "input.jsonl"),
                            "batch")
    except BaseException:  # its record not written (the queue silent: a 503): no body left behind without one
        jobs.bodies.remove(file_id)
        raise


@blp.route("/files", methods=["GET"])
@blp.arguments(FileListQuery, location="query")
@blp.response(200, FileList, dump=False, example=list_example(FILE_EXAMPLE))
@blp.documents(404, 422, jobs=True)
def list_files(query: dict[str, Any]) -> dict[str, Any]:
    """Your files, newest first.

    Paged as OpenAI's lists: `after` the `last_id` of the previous page while `has_more`.
    """
    return files.listing(current_jobs(), owner(), query["limit"], query.get("after"), query.get("purpose"))


@blp.route("/files/<file_id>", methods=["GET"])
@blp.response(200, FileObject, dump=False, example=FILE_EXAMPLE)
@blp.documents(404, jobs=True)
def get_file(file_id: str) -> dict[str, Any]:
    """A file's record."""
    return files.public(files.get(current_jobs(), owner(), file_id))


@blp.route("/files/<file_id>", methods=["DELETE"])
@blp.response(200, FileDeleted, dump=False, example={"id": FILE_EXAMPLE["id"], "object": "file", "deleted": True})
@blp.documents(404, 409, jobs=True)
def delete_file(file_id: str) -> dict[str, Any]:
    """Delete a file (409 while an unfinished batch reads it)."""
    return files.delete(current_jobs(), owner(), file_id)


@blp.route("/files/<file_id>/content", methods=["GET"])
@blp.doc(responses={"200": {"description": "The file as it was stored (ranges allowed).",
                             "content": {NDJSON: {"schema": {"type": "string"}}}}})
@blp.documents(404, jobs=True)
def file_content(file_id: str) -> Any:
    """A file's content.

    Answered whatever the Accept header says (the openai client sends application/binary).
    """
    file, body = files.content(current_jobs(), owner(), file_id)
    # Not send_file: a batch's output is its chunks' results read one after another (service.jobs.bodies).
    response = current_app.response_class(FileWrapper(body, BLOCK), mimetype=NDJSON, direct_passthrough=True)
    response.content_length = file["bytes"]
    response.headers.set("Content-Disposition", "inline", filename=file["filename"])
    response.last_modified = file["created_at"]
    response.set_etag(f"{file['id']}-{file['bytes']}")  # a file never changes once it exists
    response.cache_control.no_cache, response.cache_control.max_age = True, 0
    return response.make_conditional(request, accept_ranges=True, complete_length=file["bytes"])
