"""Access to the seed script, the numeric reference every test compares against.

The seed lives outside the repository, in ``../shared/seed/`` next to the clone (on a
developer's machine and in CI alike). Tests that need it are skipped, saying so, when
it is absent.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path
from types import ModuleType

import pytest

SEED_PATH = Path(__file__).resolve().parents[1].parent / "shared" / "seed" / "attention_from_scratch.py"


def load_seed() -> ModuleType:
    """Import the seed script as a module (its demos do not run on import)."""
    if not SEED_PATH.exists():
        pytest.skip(f"seed script not found at {SEED_PATH}")
    spec = importlib.util.spec_from_file_location("attention_seed", SEED_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def printed(function) -> str:
    """What ``function()`` prints to stdout."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        function()
    return buffer.getvalue()
