"""gunicorn's master loads service/gunicorn.conf.py and the runtime: with GUNICORN_PRELOAD=0 it must not import
the app (a SIGHUP would no longer reload it), so none of them may import Flask, numpy or the other layers.
(marshmallow may come: environs, which reads the settings, is built on it.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CODE = """
import importlib, pkgutil, runpy, socket, sys
import service.runtime
modules = [info.name for info in pkgutil.iter_modules(service.runtime.__path__, "service.runtime.")]
for name in modules:
    importlib.import_module(name)
conf = runpy.run_path("service/gunicorn.conf.py")
conf["post_fork"](None, None)
conf["on_starting"](None)
ours, theirs = socket.socketpair()
from gunicorn import util
util.write_error(ours, 400, "Bad Request", "Invalid request line")  # what a worker runs on a refused request
print(len(modules), theirs.recv(65536).split(None, 2)[1].decode())
heavy = sorted(name for name in sys.modules
               if name.split(".")[0] in ("flask", "werkzeug", "numpy")
               or name.startswith(("service.edge", "service.operations", "attention", "schemas")))
print(heavy)
"""


def test_the_runtime_and_the_gunicorn_config_import_neither_flask_nor_numpy(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "GUNICORN_PRELOAD": "0"}
    result = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60, check=True)
    counted, heavy = result.stdout.splitlines()
    modules, status = counted.split()
    assert int(modules) >= 7 and status == "400"  # every runtime module imported, write_error patched
    assert heavy == "[]"
