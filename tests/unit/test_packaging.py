"""The repository's bookkeeping: a non-editable `pip install .` ships every package and the static files (the
editable install reads the tree, so only a built wheel shows it); the tests clear every environment variable the
service reads."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests import conftest
from tests.conftest import ROOT

TOP_LEVEL = ("attention", "schemas", "service")


def test_the_wheel_ships_every_package_and_the_static_files_and_nothing_else(tmp_path):
    """Built as `pip install .` builds it (setuptools' PEP 517 backend, offline with the venv's setuptools), from a
    copy of the tree so the build leaves no build/ or egg-info behind in it; ~2 s."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.egg-info", "build", ".*_cache", ".hypothesis", "*.db"))
    build = ("import sys; from setuptools import build_meta; "
             "print(build_meta.build_wheel(sys.argv[1]))")
    result = subprocess.run([sys.executable, "-c", build, str(tmp_path)], cwd=source, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "absent from the" not in result.stderr, result.stderr[-3000:]  # setuptools' package-data warning
    wheel = tmp_path / result.stdout.split()[-1]
    shipped = set(zipfile.ZipFile(wheel).namelist())
    found = {init.relative_to(ROOT).as_posix() for top in TOP_LEVEL for init in (ROOT / top).rglob("__init__.py")}
    sources = {path.relative_to(ROOT).as_posix() for top in TOP_LEVEL for path in (ROOT / top).rglob("*.py")}
    static = {path.relative_to(ROOT).as_posix() for path in (ROOT / "service" / "edge" / "static").iterdir()}
    assert {"service/edge/__init__.py", "service/edge/static/index.html"} <= found | static  # the globs find them
    assert found | sources | static <= shipped
    code = {Path(name).parts[0] for name in shipped if not name.split("/")[0].endswith(".dist-info")}
    assert code == set(TOP_LEVEL)  # no tests/, benchmarks/ or deploy/


def test_the_tests_clear_every_variable_the_service_reads():
    """Each os.environ name read in service/ (its limits are ATTENTION_*) is cleared by conftest before the tests."""
    read = {name for source in (ROOT / "service").rglob("*.py")
            for name in re.findall(r"""os\.environ(?:\.get|\.setdefault)?[(\[]["']([A-Z_0-9]+)["']""",
                                   source.read_text())}
    assert {"API_KEYS", "PROMETHEUS_MULTIPROC_DIR", "GUNICORN_TIMEOUT", "HOST"} <= read  # the pattern finds them
    missed = {name for name in read
              if name not in conftest.SERVICE_VARIABLES and not name.startswith(conftest.SERVICE_PREFIXES)}
    assert not missed
