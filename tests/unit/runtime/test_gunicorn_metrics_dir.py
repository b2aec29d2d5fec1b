"""The gunicorn config gives each instance a fresh metrics directory, made when the config loads (no server)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness import (
    ROOT,
)


def test_each_instance_gets_a_fresh_metrics_directory(monkeypatch, tmp_path):
    import runpy

    for variable in ("PROMETHEUS_MULTIPROC_DIR", "ATTENTION_METRICS_MASTER"):
        monkeypatch.setenv(variable, "")  # recorded: restored after the test
        monkeypatch.delenv(variable)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    conf = runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))
    directory = Path(conf["_hooks"].metrics.path)
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(directory) and directory.parent == tmp_path
    assert directory.is_dir()                  # made when the config loads: before a preloaded app imports
    (directory / "counter_12345.db").write_bytes(b"a live worker's")
    conf = runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))   # a reload (SIGHUP) in the same master
    assert Path(conf["_hooks"].metrics.path) == directory and (directory / "counter_12345.db").exists()
    conf["on_exit"](None)
    assert not directory.exists()
