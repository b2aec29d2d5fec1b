"""The house rules of the code, checked from its source: folders by role, a layered import graph, small modules.
(What loading the runtime actually imports: tests/unit/runtime/test_runtime_imports.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("attention", "schemas", "service")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for top in PACKAGES for path in (ROOT / top).rglob("*.py")}


def _resolve(name: str, imported: str | None) -> str:
    """``from name import imported``: the submodule if there is one, else the module itself."""
    return f"{name}.{imported}" if imported and f"{name}.{imported}" in MODULES else name


def top_level_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` is imported: module-level statements, not imports inside functions."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.update(_resolve(node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
            elif isinstance(node, ast.For | ast.With):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return found


GRAPH = {name: top_level_imports(path) for name, path in MODULES.items()}


def _tops(imports: set[str]) -> set[str]:
    return {name.split(".")[0] for name in imports}


def _under(prefix: str) -> dict[str, set[str]]:
    return {name: imports for name, imports in GRAPH.items() if name == prefix or name.startswith(prefix + ".")}


def test_the_engine_and_the_schemas_import_nothing_above_them():
    for name, imports in _under("attention").items():
        assert not _tops(imports) & {"service", "schemas", "flask", "marshmallow", "werkzeug"}, name
    for name, imports in _under("schemas").items():
        assert not _tops(imports) & {"service", "flask", "werkzeug"}, name


def test_the_operations_know_no_flask_nor_the_edge():
    for name, imports in _under("service.operations").items():
        assert not _tops(imports) & {"flask", "werkzeug", "flask_smorest"}, name
        assert not any(i.startswith("service.edge") for i in imports), name


def test_the_edge_knows_the_engine_only_by_its_errors():
    for name, imports in _under("service.edge").items():
        engine = {i for i in imports if i.split(".")[0] == "attention"}
        assert engine <= {"attention.errors"}, (name, engine)


def test_the_jobs_know_no_flask_nor_the_edge():
    for name, imports in _under("service.jobs").items():
        assert not _tops(imports) & {"flask", "werkzeug", "flask_smorest"}, name
        assert not any(i.startswith("service.edge") for i in imports), name


def test_the_runtime_and_the_gunicorn_config_import_neither_flask_nor_numpy_nor_the_layers_above():
    config = top_level_imports(ROOT / "service" / "gunicorn.conf.py")
    for name, imports in {**_under("service.runtime"), "gunicorn.conf": config}.items():
        assert not _tops(imports) & {"flask", "werkzeug", "numpy", "attention", "schemas"}, name
        assert not any(i.startswith(("service.edge", "service.operations", "service.jobs")) for i in imports), name


def test_service_itself_imports_nothing():
    assert GRAPH["service"] == set()


def test_the_import_graph_has_no_cycles():
    ours = {name: {i for i in imports if i in GRAPH} for name, imports in GRAPH.items()}
    done: set[str] = set()

    def walk(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            pytest.fail(f"import cycle: {' -> '.join((*path[path.index(name):], name))}")
        if name in done:
            return
        for imported in ours[name]:
            if not imported.startswith(name + "."):  # a package importing its own modules is no cycle
                walk(imported, (*path, name))
        done.add(name)

    for name in ours:
        walk(name, ())


def test_service_holds_four_packages_and_few_files_of_its_own():
    own = {path.name for path in (ROOT / "service").glob("*.py")} - {"__init__.py"}
    assert {"wsgi.py", "gunicorn.conf.py"} <= own and len(own) <= 6, own
    for package in ("edge", "operations", "runtime", "jobs"):
        doc = ast.get_docstring(ast.parse((ROOT / "service" / package / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), package  # says what lives there and what it may import


@pytest.mark.parametrize("path", sorted((ROOT / "service").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_of_the_service_is_over_250_lines(path):
    assert len(path.read_text().splitlines()) <= 250


def test_the_gunicorn_config_is_settings_only():
    lines = [line for line in (ROOT / "service" / "gunicorn.conf.py").read_text().splitlines() if line.strip()]
    assert len(lines) <= 60
    assert not [node for node in ast.parse("\n".join(lines)).body if isinstance(node, ast.ClassDef)]
