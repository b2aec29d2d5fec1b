"""A BERT checkpoint's weights, rearranged once into the layout the forward pass (``attention/bert.py``) wants.

The tensors arrive by their Hugging Face names (``attention/pretrained.py`` reads them from a folder). A
Hugging Face ``Linear`` keeps its weight as (d_out, d_in) and computes ``x W^T``; here every weight is stored
transposed, (d_in, d_out), so the forward pass computes ``x @ W`` on contiguous memory, and Q, K and V sit
side by side in one (d_model, 3 d_model) matrix: one projection for all three. Everything is kept read-only in
the checkpoint's float32, shared by every request (and, loaded before gunicorn forks, by every worker); a
float64 call casts one layer at a time (:meth:`LayerWeights.cast`), never keeping the copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

import numpy as np

Norm = tuple[np.ndarray, np.ndarray]  # a LayerNorm's (scale, shift), each (d_model,)


@dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder (the names are the engine's; config.json's are in ``pretrained``)."""

    n_layers: int
    n_heads: int
    d_model: int
    d_ff: int
    vocab_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads


class CastableWeights:
    """A frozen dataclass of one layer's weight arrays (or tuples of them), cast per call: the encoder's layers
    (:class:`LayerWeights`) and the decoder's (``attention/llama.py``)."""

    def arrays(self) -> list[np.ndarray]:
        """Every array, the norms' included."""
        values = (getattr(self, field.name) for field in dataclasses.fields(self))
        return [array for value in values for array in (value if isinstance(value, tuple) else (value,))]

    def cast(self, dtype: np.dtype) -> Self:
        """These weights in ``dtype``: the layer itself for float32 (its own), a per-call copy otherwise."""
        if dtype == self.arrays()[0].dtype:
            return self
        return type(self)(**{field.name: _astype(getattr(self, field.name), dtype)
                             for field in dataclasses.fields(self)})


@dataclass(frozen=True)
class LayerWeights(CastableWeights):
    """One encoder layer's weights in the forward pass's layout."""

    w_qkv: np.ndarray   # (d_model, 3 d_model): W_q, W_k, W_v side by side
    b_qkv: np.ndarray   # (3 d_model,)
    w_o: np.ndarray     # (d_model, d_model)
    b_o: np.ndarray     # (d_model,)
    norm_1: Norm        # after attention
    w_1: np.ndarray     # (d_model, d_ff)
    b_1: np.ndarray     # (d_ff,)
    w_2: np.ndarray     # (d_ff, d_model)
    b_2: np.ndarray     # (d_model,)
    norm_2: Norm        # after the feed-forward

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, np.ndarray], prefix: str) -> LayerWeights:
        """Layer ``prefix`` (``encoder.layer.3.``) of a checkpoint's tensors."""
        def dense(name: str) -> tuple[np.ndarray, np.ndarray]:
            return frozen(tensors[f"{prefix}{name}.weight"].T), frozen(tensors[f"{prefix}{name}.bias"])

        parts = [dense(f"attention.self.{p}") for p in ("query", "key", "value")]
        return cls(frozen(np.concatenate([w for w, _ in parts], axis=1)), frozen(np.concatenate([b for _, b in parts])),
                   *dense("attention.output.dense"), norm(tensors, f"{prefix}attention.output.LayerNorm"),
                   *dense("intermediate.dense"), *dense("output.dense"), norm(tensors, f"{prefix}output.LayerNorm"))


def _astype(value: np.ndarray | Norm, dtype: np.dtype) -> np.ndarray | Norm:
    return tuple(a.astype(dtype) for a in value) if isinstance(value, tuple) else value.astype(dtype)


def frozen(array: np.ndarray) -> np.ndarray:
    """A contiguous float32 copy that nobody may change: shared by every request (and every worker)."""
    out = np.ascontiguousarray(array, dtype=np.float32)
    out = out.copy() if out is array else out
    out.setflags(write=False)
    return out


def norm(tensors: Mapping[str, np.ndarray], name: str) -> Norm:
    """A LayerNorm's (scale, shift)."""
    return frozen(tensors[f"{name}.weight"]), frozen(tensors[f"{name}.bias"])
