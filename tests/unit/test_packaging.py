"""The repository's bookkeeping: pyproject.toml ships every package (`pip install .`, not only the editable
install, must serve); the tests clear every environment variable the service reads."""

from __future__ import annotations

import re
import tomllib

from tests import conftest
from tests.conftest import ROOT


def test_every_python_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for top in ("attention", "schemas", "service") for init in (ROOT / top).rglob("__init__.py")}
    assert found == listed


def test_the_tests_clear_every_variable_the_service_reads():
    """Each os.environ name read in service/ (its limits are ATTENTION_*) is cleared by conftest before the tests."""
    read = {name for source in (ROOT / "service").rglob("*.py")
            for name in re.findall(r"""os\.environ(?:\.get|\.setdefault)?[(\[]["']([A-Z_0-9]+)["']""",
                                   source.read_text())}
    assert {"API_KEYS", "PROMETHEUS_MULTIPROC_DIR", "GUNICORN_TIMEOUT", "HOST"} <= read  # the pattern finds them
    missed = {name for name in read
              if name not in conftest.SERVICE_VARIABLES and not name.startswith(conftest.SERVICE_PREFIXES)}
    assert not missed
