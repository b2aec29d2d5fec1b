"""pyproject.toml ships every package: `pip install .` (not only the editable install) must serve."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_python_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for top in ("attention", "schemas", "service") for init in (ROOT / top).rglob("__init__.py")}
    assert found == listed
