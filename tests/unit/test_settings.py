"""service.settings: every variable declared once, typed and validated; a bad value stops a process in one line."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service import settings
from service.settings import VARIABLES, Settings, from_env
from tests.conftest import ROOT

BAD = {  # a kind -> values it refuses
    settings.POSITIVE: ["0", "-3", "abc", "1.5", "", "1_000", "\u0663", "²"],
    settings.COUNT: ["-1", "two", "1.5", "", "²"],
    settings.SECONDS: ["0", "-1", "nan", "inf", "soon"],
    settings.INTERVAL: ["nan", "inf", "-inf", "soon"],
    settings.FLAG: ["yes", "2", ""],
    settings.PORT: ["0", "65536", "http"],
    settings.LEVEL: ["loud", ""],
    settings.KEYS: [" , ", ","],
    settings.QUEUE_URL: ["http://redis:6379", "redis"],
}


def field_of(name: str) -> dataclasses.Field:
    return VARIABLES[name]


def test_unset_every_variable_keeps_its_default(environ):
    for name in VARIABLES:
        environ.delenv(name, raising=False)
    assert from_env() == Settings()
    assert Settings().limits.max_batch_items == 256 and Settings().server.port == 8000
    assert Settings().jobs.data_dir == Path("data") and Settings().models is None


@pytest.mark.parametrize("name", sorted(VARIABLES))
def test_each_variable_refuses_what_its_kind_does_not_take_naming_it(environ, name):
    kind = field_of(name).metadata["kind"]
    for value in BAD.get(kind, []):
        environ.setenv(name, value)
        with pytest.raises(settings.SettingsError, match=f"^{name} must be {kind.takes}, got {value!r}$".replace(
                "(", r"\(").replace(")", r"\)")):
            from_env()


@pytest.mark.parametrize(("name", "value", "read"), [
    ("ATTENTION_EMBEDDED_WORKERS", " 2 ", 2), ("ATTENTION_EMBEDDED_WORKERS", "0", 0), ("PORT", "9123", 9123),
    ("GUNICORN_PRELOAD", "0", False), ("GUNICORN_PRELOAD", "true", True), ("LOG_FLUSH_SECONDS", "-1", -1.0),
    ("API_KEYS", "k-one, k-two ,", ("k-one", "k-two")), ("API_KEYS", "", ()), ("CORS_ORIGINS", "*", ("*",)),
    ("ATTENTION_QUEUE_URL", "rediss://:pw@host:6380/0", "rediss://:pw@host:6380/0"), ("ATTENTION_QUEUE_URL", "", None),
    ("ATTENTION_DATA_DIR", "/data", Path("/data")), ("GUNICORN_LOGLEVEL", "WARNING", "warning"),
    ("ATTENTION_MODELS", "", ""), ("ATTENTION_BATCH_LEASE_SECONDS", "2.5", 2.5), ("WEB_CONCURRENCY", "3", 3),
])
def test_each_variable_is_read_into_its_type(environ, name, value, read):
    environ.setenv(name, value)
    area = next((f.name for f in settings.AREAS if field_of(name) in dataclasses.fields(f.default_factory)), None)
    found = from_env() if area is None else getattr(from_env(), area)
    assert getattr(found, field_of(name).name) == read


def test_every_variable_says_what_it_takes_and_what_it_means():
    for name, field in VARIABLES.items():
        assert field.metadata["kind"].takes and field.metadata["meaning"].endswith(".") and name.isupper(), name
        assert settings.shown_default(field), name


def _start(command: list[str], **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in VARIABLES}
    return subprocess.run(command, cwd=ROOT, env={**environment, **env}, capture_output=True, text=True, timeout=60)


LINE = ("attention-service: ATTENTION_MAX_LAYERS must be a positive integer, got 'x'; PORT must be a TCP port, 1 to "
        "65535, got '70000'\n")


@pytest.mark.parametrize("command", [
    [sys.executable, "-m", "gunicorn", "-c", "service/gunicorn.conf.py", "--check-config", "service.wsgi:app"],
    [sys.executable, "-m", "service.jobs.worker"],
    [sys.executable, "-c", "import service.wsgi"],
], ids=["gunicorn", "attention-worker", "the app"])
def test_a_bad_value_stops_the_start_up_in_one_line(command):
    result = _start(command, ATTENTION_MAX_LAYERS="x", PORT="70000", ATTENTION_MODELS="")
    assert result.returncode == 2 and result.stderr == LINE, result.stderr


def test_a_model_refused_at_start_up_is_one_line_too(tmp_path):
    result = _start([sys.executable, "-c", "import service.wsgi"], ATTENTION_MODELS=f"mini={tmp_path / 'none'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    folder = tmp_path / "none"
    assert result.stderr == (f"attention-service: ATTENTION_MODELS: {folder} is neither a model folder nor a .gguf "
                             "file (no such directory or file)\n")
