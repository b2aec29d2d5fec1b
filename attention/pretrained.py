"""A Hugging Face model folder read into the engine: ``config.json``, ``model.safetensors``, ``tokenizer.json``.

Only what the engine computes *exactly* is accepted: BERT-family encoders as transformers' ``BertModel``
computes them (absolute learned positions, token types, post-LN, exact-erf GELU). Any other setting is
refused, naming it, rather than computed approximately. Weights are read only from safetensors: a
pickled ``pytorch_model.bin`` runs code when loaded, so a folder that has only that is refused too.

The tokenizer is the folder's own ``tokenizer.json`` through Hugging Face ``tokenizers`` (what
transformers itself runs), with truncation and padding turned off: tokens and ids are exactly the text's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from safetensors import SafetensorError
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from .bert import Bert
from .checkpoint import BertConfig

# config.json setting -> the only value the engine computes (a missing setting takes transformers' default).
REQUIRED = {
    "model_type": "bert",
    "hidden_act": "gelu",                     # exact erf GELU; "gelu_new" and friends are the tanh approximation
    "position_embedding_type": "absolute",
    "is_decoder": False,
    "add_cross_attention": False,
    "chunk_size_feed_forward": 0,
}
DEFAULTS = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False,
            "chunk_size_feed_forward": 0, "type_vocab_size": 2, "layer_norm_eps": 1e-12}
SHAPE = {  # engine name -> config.json name
    "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "d_model": "hidden_size",
    "d_ff": "intermediate_size", "vocab_size": "vocab_size", "max_positions": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size", "layer_norm_eps": "layer_norm_eps",
}


class ModelFolderError(ValueError):
    """A model folder the engine will not serve; ``setting`` names the file or config setting at fault."""

    def __init__(self, folder: Path, setting: str, message: str) -> None:
        super().__init__(f"{folder}: {setting}: {message}")
        self.setting = setting


@dataclass(frozen=True)
class Encoded:
    """A text (or pair) as the model reads it: word pieces, their ids, their segment (0 or 1), and which
    are the tokenizer's own specials ([CLS], [SEP])."""

    tokens: list[str]
    ids: np.ndarray        # (n,) int64
    type_ids: np.ndarray   # (n,) int64
    special: np.ndarray    # (n,) bool


class WordPieces:
    """The folder's tokenizer, untruncated and unpadded."""

    def __init__(self, path: Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_truncation()                # MiniLM's file truncates at 128 ...
        self._tokenizer.no_padding()                   # ... and pads to 128: neither is the text

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary ("[MASK]": what occlusion puts in a token's place), or None."""
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str, pair: str | None = None) -> Encoded:
        """``[CLS] text [SEP]`` or ``[CLS] text [SEP] pair [SEP]``, as the tokenizer's template says."""
        encoding = self._tokenizer.encode(text, pair)
        return Encoded(encoding.tokens, np.array(encoding.ids, dtype=np.int64),
                       np.array(encoding.type_ids, dtype=np.int64),
                       np.array(encoding.special_tokens_mask, dtype=bool))


@dataclass(frozen=True)
class Pretrained:
    """A served model: the encoder, its tokenizer, and what its model card says of its licence."""

    bert: Bert
    tokenizer: WordPieces
    license: str | None
    architecture: str

    @property
    def config(self) -> BertConfig:
        return self.bert.config

    @property
    def causal(self) -> bool:
        """An encoder: every token attends to every other (a decoder's ``causal`` is True)."""
        return False

    @property
    def quantization(self) -> None:
        """Not quantized: the checkpoint's float weights (a GGUF decoder's names its storage type, e.g. "Q4_1")."""
        return None


def load_folder(folder: str | Path) -> Pretrained:
    """Read a model folder; :class:`ModelFolderError` names what is missing or not supported."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(folder, "folder", "is not a directory")
    settings = _read_config(folder)
    config = _config(folder, settings)
    tensors = _read_weights(folder)
    tensors = {name.removeprefix("bert."): array for name, array in tensors.items()}
    expected = _expected_shapes(config)
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise ModelFolderError(folder, "model.safetensors", f"lacks {len(missing)} tensors, e.g. {missing[0]}")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise ModelFolderError(folder, "model.safetensors", f"{name} is {tensors[name].shape}, config.json "
                                                                f"says {shape}")
    if not (folder / "tokenizer.json").is_file():
        raise ModelFolderError(folder, "tokenizer.json", "is missing (the tokenizer the model was trained with)")
    architecture = (settings.get("architectures") or ["BertModel"])[0]
    return Pretrained(Bert(config, tensors), WordPieces(folder / "tokenizer.json"), _card_license(folder),
                      architecture)


def _read_config(folder: Path) -> dict:
    try:
        settings = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFolderError(folder, "config.json", "is missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelFolderError(folder, "config.json", f"is not JSON ({exc})") from None
    if not isinstance(settings, dict):
        raise ModelFolderError(folder, "config.json", "is not a JSON object")
    return settings


def _config(folder: Path, settings: dict) -> BertConfig:
    """The engine's shape of the model; a setting it would not compute exactly is refused, by name."""
    for name, wanted in REQUIRED.items():
        value = settings.get(name, DEFAULTS.get(name))
        if value != wanted:
            raise ModelFolderError(folder, name, f"is {value!r}; only {wanted!r} is computed exactly")
    values = {}
    for ours, theirs in SHAPE.items():
        value = settings.get(theirs, DEFAULTS.get(theirs))
        kind = float if ours == "layer_norm_eps" else int
        if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
            raise ModelFolderError(folder, theirs, f"must be a positive {kind.__name__}, got {value!r}")
        values[ours] = value
    if values["d_model"] % values["n_heads"]:
        raise ModelFolderError(folder, "num_attention_heads", "does not divide hidden_size")
    return BertConfig(**values)


def _read_weights(folder: Path) -> dict[str, np.ndarray]:
    path = folder / "model.safetensors"
    if not path.is_file():
        pickled = [name for name in ("pytorch_model.bin", "tf_model.h5") if (folder / name).exists()]
        why = (f"only {pickled[0]} is there, and unpickling a checkpoint runs code: convert it to safetensors"
               if pickled else "is missing")
        raise ModelFolderError(folder, "model.safetensors", why)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, TypeError) as exc:  # bfloat16 has no numpy dtype
        raise ModelFolderError(folder, "model.safetensors", f"cannot be read with numpy ({exc})") from None
    for name, array in tensors.items():
        if array.dtype.kind == "f" and array.dtype != np.float32:
            tensors[name] = array.astype(np.float32)   # float16 weights, computed in float32
    return tensors


def _expected_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the encoder reads (without the ``bert.`` prefix) and the shape config.json implies for it:
    checked all, since a wrong one would fail at the first request, or worse be broadcast (a (1,) norm scale)
    into wrong numbers."""
    d = config.d_model
    expected = {"embeddings.word_embeddings.weight": (config.vocab_size, d),
                "embeddings.position_embeddings.weight": (config.max_positions, d),
                "embeddings.token_type_embeddings.weight": (config.type_vocab_size, d),
                "embeddings.LayerNorm.weight": (d,), "embeddings.LayerNorm.bias": (d,)}
    dense = {"attention.self.query": (d, d), "attention.self.key": (d, d), "attention.self.value": (d, d),
             "attention.output.dense": (d, d), "intermediate.dense": (config.d_ff, d),
             "output.dense": (d, config.d_ff)}                  # torch's Linear: weight (d_out, d_in)
    for i in range(config.n_layers):
        for name, (d_out, d_in) in dense.items():
            expected[f"encoder.layer.{i}.{name}.weight"] = (d_out, d_in)
            expected[f"encoder.layer.{i}.{name}.bias"] = (d_out,)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            expected[f"encoder.layer.{i}.{name}.weight"] = expected[f"encoder.layer.{i}.{name}.bias"] = (d,)
    return expected


def _card_license(folder: Path) -> str | None:
    """``license:`` from the front matter of the folder's model card (README.md), else None."""
    try:
        text = (folder / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("---"):
        return None
    front, _, _ = text[3:].partition("\n---")
    try:
        card = yaml.safe_load(front)
    except yaml.YAMLError:
        return None
    value = card.get("license") if isinstance(card, dict) else None
    return value if isinstance(value, str) else None
