"""The few places the service reaches past a library's documented extension points are still there, in the installed
version: each check fails with the library, its version and the name that went missing, and the module that relies
on it (docs/architecture.md, "Libraries, and where the service reaches past them", says why each is kept).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from typing import Any

import flask_smorest
import gunicorn.http.wsgi
import gunicorn.util
import marshmallow
import pytest
from marshmallow.error_store import ErrorStore
from prometheus_client import multiprocess
from prometheus_client.mmap_dict import MmapedDict

from service.runtime.metrics_dir import metrics_file


def missing(library: str, name: str, user: str) -> str:
    return (f"{library} {version(library)}: {name} is gone or changed, and {user} relies on it (see "
            "docs/architecture.md); adapt the module, or drop the override if the library now offers a public way")


def has(owner: Any, *names: str) -> bool:
    return all(hasattr(owner, name) for name in names)


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_flask_smorest_still_keeps_a_views_doc_in_its_apidoc():
    """service/edge/smorest.py: the lean request-time decorators hand flask-smorest the doc its own would add."""
    blp = flask_smorest.Blueprint("surface", __name__)
    documented = blp.doc(summary="x")(lambda: None)
    assert getattr(documented, "_apidoc", {}).get("manual_doc") == {"summary": "x"}, missing(
        "flask-smorest", "a view's _apidoc['manual_doc']", "service/edge/smorest.py")
    loaded = blp.arguments(marshmallow.Schema.from_dict({"x": marshmallow.fields.Integer()}))(lambda params: params)
    assert "responses" in loaded._apidoc.get("arguments", {}), missing(
        "flask-smorest", "a view's _apidoc['arguments']['responses']", "service/edge/smorest.py")


def test_marshmallow_still_loads_through_the_steps_the_lean_loop_takes():
    """schemas/base.py: the lean loop over one object's fields (it is compared with marshmallow's own loop in
    tests/unit/schemas/test_schemas_base.py)."""
    user = "schemas/base.py"
    assert has(marshmallow.Schema(), "_init_fields", "_deserialize", "load_fields", "dict_class"), missing(
        "marshmallow", "Schema._init_fields, _deserialize, load_fields or dict_class", user)
    steps = ["data", "error_store", "many", "partial", "unknown", "index"]
    assert parameters(marshmallow.Schema._deserialize)[1:] == steps, missing(
        "marshmallow", "Schema._deserialize's parameters", user)
    assert has(marshmallow.fields.Field, "_deserialize", "_validate", "_validate_missing", "_validate_all",
               "deserialize"), missing("marshmallow", "Field._validate and the steps of Field.deserialize", user)
    assert "store_error" in dir(ErrorStore) and parameters(ErrorStore.store_error)[1:] == [
        "messages", "field_name", "index"], missing("marshmallow", "ErrorStore.store_error", user)
    field = marshmallow.fields.Integer()
    assert has(field, "pre_load", "post_load", "validators", "load_default", "data_key", "attribute"), missing(
        "marshmallow", "a field's pre_load, post_load, validators, load_default, data_key or attribute", user)
    assert "unknown" in marshmallow.Schema().error_messages and hasattr(marshmallow.Schema().opts, "index_errors"), \
        missing("marshmallow", "Schema.error_messages['unknown'] or Schema.opts.index_errors", user)


def test_gunicorn_still_writes_errors_and_responses_where_the_patches_take_over():
    """service/runtime/gunicorn_patches.py: gunicorn's own answers as problem+json (util.write_error), and the
    headers sent with the first body chunk (Response.write and _emit_body)."""
    user = "service/runtime/gunicorn_patches.py"
    assert parameters(gunicorn.util.write_error) == ["sock", "status_int", "reason", "mesg"], missing(
        "gunicorn", "util.write_error(sock, status_int, reason, mesg)", user)
    assert has(gunicorn.util, "write_nonblock"), missing("gunicorn", "util.write_nonblock", user)
    built = "Response" in gunicorn.http.wsgi.create.__code__.co_names
    assert has(gunicorn.http.wsgi, "Response", "create") and built, missing(
        "gunicorn", "http.wsgi.create building its Response from the module's global", user)
    assert has(gunicorn.http.wsgi.Response, "write", "_emit_body", "send_headers"), missing(
        "gunicorn", "http.wsgi.Response.write, _emit_body or send_headers", user)
    assert parameters(gunicorn.http.wsgi.Response._emit_body) == ["self", "data"], missing(
        "gunicorn", "http.wsgi.Response._emit_body(self, data)", user)


@pytest.mark.parametrize("values", [{}, {'["x", "x_total", {}, "help"]': [2.0, 1.5]},
                                    {'["h", "h_sum", {"a": "b"}, "h"]': [0.25, 0.0], "k" * 37: [1.0, 2.0]}])
def test_prometheus_client_still_reads_the_files_the_master_folds(tmp_path, values):
    """service/runtime/metrics_dir.py folds exited workers' files into one per kind (client_python #568, open:
    files of dead workers stay and every scrape reads them all) in prometheus-client's own file layout."""
    path = tmp_path / "counter_1.db"
    path.write_bytes(metrics_file(values))
    read = {key: [value, timestamp] for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(str(path))}
    assert read == values, missing("prometheus-client", "MmapedDict's file layout", "service/runtime/metrics_dir.py")
    assert has(multiprocess.MultiProcessCollector, "merge"), missing(
        "prometheus-client", "MultiProcessCollector.merge", "service/runtime/metrics.py")
