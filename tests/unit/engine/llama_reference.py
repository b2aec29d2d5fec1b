"""The references the decoder is proven against.

* :func:`run_transformers`: transformers' ``LlamaForCausalLM`` (eager attention, the one implementation that returns
  its weights) on the same GGUF file, float32.
* :func:`float64_reference`: Llama written out the plain way in numpy, every step in float64, from transformers'
  weights (its own reading of the file). transformers' float64 mode (``.double()``) is not that: its RMSNorm,
  softmax and rotary angles stay float32, so a float64 engine would be compared with float32 rounding.
  Nothing here shares code with the engine: heads in a loop, K and V copied to every query head of their group
  (``np.repeat``, the copy the engine avoids), transformers' ``rotate_half``, a causal mask of -inf.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers


def run_transformers(model: transformers.LlamaForCausalLM, ids: np.ndarray, attention_mask: np.ndarray | None = None
                     ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """ids (B, n) -> transformers' logits (B, n, vocab), hidden states (n_layers + 1 of (B, n, d_model), the last
    after the final norm) and attention weights (n_layers of (B, h, n, n)), as numpy. ``attention_mask`` (B, n):
    1 for real tokens, 0 for padding."""
    mask = None if attention_mask is None else torch.from_numpy(attention_mask)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=mask, output_attentions=True,
                    output_hidden_states=True)
    return out.logits.numpy(), [h.numpy() for h in out.hidden_states], [a.numpy() for a in out.attentions]


def float64_reference(model: transformers.LlamaForCausalLM, ids: np.ndarray
                      ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """One sequence ids (n,) -> logits (n, vocab), hidden states (n_layers + 1 of (n, d_model), the last after the
    final norm, as transformers orders them) and attention weights (n_layers of (h, n, n)), all in float64."""
    config = model.config
    h, h_kv = config.num_attention_heads, config.num_key_value_heads
    d_k, eps, n = config.head_dim, config.rms_norm_eps, len(ids)

    def weight(name: str) -> np.ndarray:                      # a float32 parameter, exactly, in float64
        return model.get_parameter(name).detach().numpy().astype(np.float64)

    def rms_norm(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * scale

    theta = 1.0 / config.rope_parameters["rope_theta"] ** (np.arange(0, d_k, 2) / d_k)
    angles = np.arange(n)[:, None] * theta                     # (n, d_k/2)
    cos, sin = np.cos(np.concatenate([angles] * 2, axis=1)), np.sin(np.concatenate([angles] * 2, axis=1))

    def rotate(x: np.ndarray) -> np.ndarray:                   # (heads, n, d_k): x cos + rotate_half(x) sin
        half = np.concatenate([-x[..., d_k // 2:], x[..., :d_k // 2]], axis=-1)
        return x * cos + half * sin

    embedding = weight("model.embed_tokens.weight")
    x = embedding[ids]
    states, weights = [x], []
    hidden = np.triu(np.ones((n, n), dtype=bool), k=1)        # key after query
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        normed = rms_norm(x, weight(prefix + "input_layernorm.weight"))
        q, k, v = (normed @ weight(f"{prefix}self_attn.{name}_proj.weight").T for name in "qkv")
        q = rotate(q.reshape(n, h, d_k).transpose(1, 0, 2))
        k = np.repeat(rotate(k.reshape(n, h_kv, d_k).transpose(1, 0, 2)), h // h_kv, axis=0)
        v = np.repeat(v.reshape(n, h_kv, d_k).transpose(1, 0, 2), h // h_kv, axis=0)
        heads, layer_weights = [], []
        for head in range(h):
            scores = q[head] @ k[head].T / np.sqrt(d_k)
            scores[hidden] = -np.inf
            w = np.exp(scores - scores.max(axis=-1, keepdims=True))
            w /= w.sum(axis=-1, keepdims=True)
            layer_weights.append(w)
            heads.append(w @ v[head])
        x = x + np.concatenate(heads, axis=-1) @ weight(prefix + "self_attn.o_proj.weight").T
        normed = rms_norm(x, weight(prefix + "post_attention_layernorm.weight"))
        gate = normed @ weight(prefix + "mlp.gate_proj.weight").T
        up = normed @ weight(prefix + "mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ weight(prefix + "mlp.down_proj.weight").T
        states.append(x)
        weights.append(np.stack(layer_weights))
    states[-1] = rms_norm(x, weight("model.norm.weight"))
    return states[-1] @ embedding.T, states, weights


def max_relative(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """The largest difference over paired arrays, each relative to the largest magnitude of the reference array
    (hidden states grow to ~25,000 from layer 12 on: their last digits are not comparable absolutely)."""
    assert len(ours) == len(theirs)
    return max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(ours, theirs, strict=True))
