"""The reference the real-model tests compare the engine with: transformers' ``BertModel`` (eager attention, the one
implementation that returns its weights), run on numpy arrays (tests/unit/engine/conftest.py keeps it offline)."""

from __future__ import annotations

import numpy as np
import torch
import transformers


def run_reference(model: transformers.BertModel, ids: np.ndarray, types: np.ndarray,
                  attention_mask: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """ids, types (B, n) int64 -> transformers' hidden states (n_layers + 1 of (B, n, d)) and attention weights
    (n_layers of (B, h, n, n)), as numpy. ``attention_mask`` (B, n): 1 for real tokens, 0 for padding."""
    mask = None if attention_mask is None else torch.from_numpy(attention_mask)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(types), attention_mask=mask,
                    output_attentions=True, output_hidden_states=True)
    return [h.numpy() for h in out.hidden_states], [a.numpy() for a in out.attentions]


# The agreement the engine promises with transformers. Measured on MiniLM: float32 at most 5.1e-6 (hidden states
# of the 198-token text; 1.1e-6 to 2.9e-6 for short ones), float64 at most 8e-15.
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-10}


def max_difference(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """The largest absolute difference over paired arrays (of equal shapes)."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == b.shape, (a.shape, b.shape)
    return max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True))
