"""Request limits, read from the environment once per app, served at GET /v1/limits.

Defaults allow the paper's base model (d_model 512, d_ff 2048, 6 layers; up to 16 heads), and
keep one request well inside a worker's memory and timeout: at most 2**21 attention weights
(16 MiB as float64, ~40 MiB as JSON: every layer and head of MiniLM, 6 x 12, at 128 tokens is 1.18 M)
and a 16 MiB body (~850k numbers, ~30 MiB once parsed). A model's text is at most 10,000 code points:
the tokenizer takes ~2 s a megabyte, so length is judged before tokenizing.
A batch holds at most 256 items, each within the limits above, and a budget of 2**25 in all: each
number computed counts 1 and each number returned 3 more, so an answer holds at most ~8 M numbers
(~64 MiB of arrays, ~180 MB of JSON); 256 items of (n=128, d_model=64, h=4) without weights fit.
A batch job (POST /v1/batches) reads a file of at most 50,000 requests, 200 MiB and 1 MiB a line; files are kept
30 days, or as long as a batch still needs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from service.problems import LimitExceeded


def _positive(variable: str, raw: str) -> int:
    """The value of environment ``variable``, a positive integer in ASCII digits, or a ValueError naming the
    variable (int() would also take "1_000" or other scripts' digits)."""
    digits = raw.strip()
    value = int(digits) if digits.isascii() and digits.isdigit() else 0
    if value < 1:
        raise ValueError(f"{variable} must be a positive integer, got {raw!r}")
    return value


@dataclass(frozen=True)
class Limits:
    """Every limit a request is checked against before any compute."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_sequence_length: int = 1024
    max_d_model: int = 512
    max_d_ff: int = 2048
    max_heads: int = 16
    max_layers: int = 6
    max_weight_elements: int = 2**21
    max_output_elements: int = 2**21
    max_json_depth: int = 32
    max_text_chars: int = 10_000
    max_heatmap_cells: int = 16384
    max_batch_items: int = 256
    max_batch_elements: int = 2**25
    max_job_requests: int = 50_000
    max_file_bytes: int = 200 * 1024 * 1024
    max_line_bytes: int = 1024 * 1024
    file_retention_seconds: int = 30 * 24 * 3600

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Limits:
        """Read ``ATTENTION_MAX_*`` variables (e.g. ATTENTION_MAX_D_MODEL); unset ones keep the default."""
        # Not environs 15: its env.int takes "1_000" and "١٢٣" (marshmallow Integer), so _positive would stay anyway.
        values = {}
        for field in fields(cls):
            raw = environ.get(env_name(field.name))
            if raw is not None:
                values[field.name] = _positive(env_name(field.name), raw)
        return cls(**values)

    def check(self, name: str, value: int, *, pointer: str | None = None, parameter: str | None = None) -> None:
        """Raise :class:`LimitExceeded` (422) when ``value`` is above the limit ``name``."""
        maximum = getattr(self, name)
        if value > maximum:
            raise LimitExceeded(name, value, maximum, pointer=pointer, parameter=parameter)

    def as_dict(self) -> dict[str, int]:
        """Every limit by name."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


def env_name(limit: str) -> str:
    """Environment variable setting a limit: ``max_d_model`` -> ``ATTENTION_MAX_D_MODEL``."""
    return f"ATTENTION_{limit.upper()}"
