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


def imports_of(path: Path) -> set[str]:
    """Modules ``path`` imports: at module level and inside functions alike (an import inside a function closes a
    cycle just the same, only later), except those only a type checker reads (``if TYPE_CHECKING:``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for other in node.orelse:
                visit(other)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(_resolve(node.module, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


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
    config = imports_of(ROOT / "service" / "gunicorn.conf.py")
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


def test_the_gunicorn_config_is_settings_only():
    """Names bound to values: no function, class or loop of its own, nothing called for its effect, no attribute of
    anything set (nothing patched); the set-up that must come first is a module it imports."""
    tree = ast.parse((ROOT / "service" / "gunicorn.conf.py").read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.For, ast.While, ast.With)
    assert not [node for node in ast.walk(tree) if isinstance(node, kinds)]
    assert not [node for node in tree.body if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant)]
    targets = [target for node in ast.walk(tree) if isinstance(node, ast.Assign) for target in node.targets]
    assert all(isinstance(name, ast.Name) for target in targets
               for name in (target.elts if isinstance(target, ast.Tuple) else [target]))
