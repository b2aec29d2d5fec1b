"""attention/pretrained.py: the tokenizer against transformers' own, the packaged folder's settings, tiny random BERT
folders saved by transformers (bare, with the ``bert.`` prefix, in float16) computed as transformers computes them,
and every folder the loader refuses, by the setting it names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from attention import BertConfig, ModelFolderError, load_folder
from tests.unit.engine.reference import TOLERANCE, max_difference, run_reference

README_SENTENCE = "The animal didn't cross the street because it was too tired."
LONG = " ".join([README_SENTENCE] * 14)  # 14 * 14 = 196 word pieces, past the tokenizer file's 128
TEXTS = [
    ("Attention is all you need.", None),
    ("Where did the animal stop?", README_SENTENCE),
    ("Crème brûlée à Zürich, 東京タワー 🤖🎉 and \x00\x07 bells\ttabs\u200b", None),
    ("naïve café", "東京 🤖"),
    (README_SENTENCE, None),
    ("", None),
    (LONG, None),
    (LONG, LONG),
]
FILES = ("config.json", "model.safetensors", "tokenizer.json")
# A small BERT with the real vocabulary (so the real tokenizer.json fits): 2 layers, 2 heads, d_model 8.
TINY = {"vocab_size": 30522, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 64}


# --- the tokenizer ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "pair"), TEXTS)
def test_tokens_ids_and_types_equal_transformers_tokenizer(minilm, hf_tokenizer, text, pair):
    ours = minilm.tokenizer.encode(text, pair)
    theirs = hf_tokenizer(text, pair, return_special_tokens_mask=True)  # no padding, no truncation
    assert ours.tokens == theirs.tokens()
    assert ours.ids.tolist() == theirs["input_ids"] and ours.ids.dtype == np.int64
    assert ours.type_ids.tolist() == theirs["token_type_ids"] and ours.type_ids.dtype == np.int64
    assert ours.special.tolist() == [bool(s) for s in theirs["special_tokens_mask"]]
    assert ours.ids.shape == ours.type_ids.shape == ours.special.shape == (len(ours.tokens),)


def test_the_tokenizer_file_would_truncate_and_pad_at_128_and_ours_does_neither(minilm, minilm_folder):
    settings = json.loads((minilm_folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert settings["truncation"]["max_length"] == 128 and settings["padding"]["strategy"] == {"Fixed": 128}
    long = minilm.tokenizer.encode(LONG, LONG)
    assert len(long.tokens) == 2 * 196 + 3 and long.type_ids.sum() == 196 + 1   # both halves whole
    assert minilm.tokenizer.encode("hi").tokens == ["[CLS]", "hi", "[SEP]"]      # not padded to 128


# --- the packaged folder -------------------------------------------------------------------------------------------

def test_the_packaged_folder_is_all_minilm_l6_v2(minilm):
    assert minilm.config == BertConfig(n_layers=6, n_heads=12, d_model=384, d_ff=1536, vocab_size=30522,
                                       max_positions=512, type_vocab_size=2, layer_norm_eps=1e-12)
    assert minilm.config.d_k == 32
    assert minilm.license == "apache-2.0" and minilm.architecture == "BertModel"
    assert minilm.bert.word.dtype == np.float32 and not minilm.bert.word.flags.writeable


# --- tiny random folders, saved by transformers --------------------------------------------------------------------

def save_tiny(model_class: type, folder: Path, tokenizer_json: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A random ``model_class`` (BertModel or BertForMaskedLM) saved to ``folder`` as safetensors, with the real
    tokenizer. Every parameter is drawn anew: the initialisation leaves biases at 0 and norms at (1, 0)."""
    torch.manual_seed(0)
    model = model_class(transformers.BertConfig(**TINY))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    model.to(dtype).save_pretrained(folder, safe_serialization=True)
    shutil.copy(tokenizer_json, folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_folder) -> dict[str, Path]:
    """Folders by kind: "BertModel" (bare names), "BertForMaskedLM" ("bert." names and an MLM head), "float16"."""
    root = tmp_path_factory.mktemp("tiny")
    tokenizer = minilm_folder / "tokenizer.json"
    return {"BertModel": save_tiny(transformers.BertModel, root / "bare", tokenizer),
            "BertForMaskedLM": save_tiny(transformers.BertForMaskedLM, root / "mlm", tokenizer),
            "float16": save_tiny(transformers.BertModel, root / "half", tokenizer, torch.float16)}


def tiny_reference(folder: Path, kind: str, dtype: type) -> transformers.BertModel:
    """transformers' encoder as read from the folder (the MLM's ``.bert``), in ``dtype``."""
    model_class = transformers.BertForMaskedLM if kind == "BertForMaskedLM" else transformers.BertModel
    model = model_class.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    model = model.bert if kind == "BertForMaskedLM" else model
    return model.double() if dtype == np.float64 else model


@pytest.mark.parametrize("kind", ["BertModel", "BertForMaskedLM", "float16"])
def test_a_tiny_random_folder_computes_as_transformers(tiny, kind):
    names = load_file(str(tiny[kind] / "model.safetensors"))
    assert any(name.startswith("bert.") for name in names) == (kind == "BertForMaskedLM")
    model = load_folder(tiny[kind])
    assert model.architecture == ("BertForMaskedLM" if kind == "BertForMaskedLM" else "BertModel")
    assert model.config.n_layers == 2 and model.config.n_heads == 2 and model.config.d_model == 8
    assert model.license is None                                        # no README.md, no model card
    assert model.bert.word.dtype == np.float32                          # float16 on disk, float32 in the engine
    encoded = model.tokenizer.encode("Where did the animal stop?", README_SENTENCE)
    ids, types = encoded.ids[None], encoded.type_ids[None]
    for dtype in (np.float32, np.float64):
        ours = model.bert(ids, types, dtype=dtype, hidden_states=True)
        states, weights = run_reference(tiny_reference(tiny[kind], kind, dtype), ids, types)
        assert max_difference(ours.weights, weights) <= TOLERANCE[dtype]
        assert max_difference(ours.hidden_states, states) <= TOLERANCE[dtype]


@pytest.mark.parametrize(("readme", "license"), [
    ("---\nlanguage: en\nlicense: mit\n---\n# A card\n", "mit"),
    ("# A card without front matter\nlicense: mit\n", None),
    ("---\nlicense: [mit, apache-2.0]\n---\n", None),
    ("---\n: not yaml: [\n---\n", None),
])
def test_license_comes_from_the_model_card_front_matter(tiny, tmp_path, readme, license):
    folder = folder_from(tiny["BertModel"], tmp_path / "m")
    (folder / "README.md").write_text(readme, encoding="utf-8")
    assert load_folder(folder).license == license


def test_settings_config_json_leaves_out_take_transformers_defaults(tiny, tmp_path):
    settings = json.loads((tiny["BertModel"] / "config.json").read_text(encoding="utf-8"))
    for name in ("position_embedding_type", "is_decoder", "add_cross_attention", "type_vocab_size",
                 "layer_norm_eps", "architectures"):
        settings.pop(name, None)
    model = load_folder(folder_from(tiny["BertModel"], tmp_path / "m", settings=settings))
    assert model.config.type_vocab_size == 2 and model.config.layer_norm_eps == 1e-12
    assert model.architecture == "BertModel"


# --- refusals ------------------------------------------------------------------------------------------------------

def folder_from(source: Path, folder: Path, *, settings: dict | None = None,
                tensors: dict[str, np.ndarray] | None = None, without: tuple[str, ...] = ()) -> Path:
    """A model folder like ``source``, its files linked, but with these config.json ``settings`` or ``tensors``
    (written anew, never through a link), and ``without`` some files."""
    folder.mkdir()
    for name in FILES:
        if name in without or (name == "config.json" and settings is not None) or \
                (name == "model.safetensors" and tensors is not None):
            continue
        (folder / name).symlink_to(source / name)
    if settings is not None:
        (folder / "config.json").write_text(json.dumps(settings), encoding="utf-8")
    if tensors is not None:
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


def refusal(folder: Path) -> ModelFolderError:
    with pytest.raises(ModelFolderError) as caught:
        load_folder(folder)
    assert str(caught.value).startswith(f"{folder}: {caught.value.setting}: ")
    return caught.value


def test_a_path_that_is_not_a_directory_is_refused(tiny, tmp_path):
    for path in (tmp_path / "absent", tiny["BertModel"] / "config.json"):
        error = refusal(path)
        assert error.setting == "folder" and "is not a directory" in str(error)


def test_a_folder_with_only_a_pickled_checkpoint_is_refused_unread(tiny, tmp_path):
    folder = folder_from(tiny["BertModel"], tmp_path / "m", without=("model.safetensors",))
    (folder / "pytorch_model.bin").write_bytes(b"never unpickled")
    error = refusal(folder)
    assert error.setting == "model.safetensors"
    assert "only pytorch_model.bin is there" in str(error) and "unpickling a checkpoint runs code" in str(error)


@pytest.mark.parametrize(("content", "message"), [
    (None, "is missing"),
    (b'{"model_type": "bert",', "is not JSON"),
    (b"\xff\xfe{}", "is not JSON"),
    (b"[1, 2]", "is not a JSON object"),
    (b'"bert"', "is not a JSON object"),
])
def test_a_config_json_that_is_missing_or_not_an_object_is_refused(tiny, tmp_path, content, message):
    folder = folder_from(tiny["BertModel"], tmp_path / "m", without=("config.json",))
    if content is not None:
        (folder / "config.json").write_bytes(content)
    error = refusal(folder)
    assert error.setting == "config.json" and message in str(error)


@pytest.mark.parametrize(("changes", "setting", "message"), [
    ({"hidden_act": "gelu_new"}, "hidden_act", "is 'gelu_new'; only 'gelu' is computed exactly"),
    ({"hidden_act": "relu"}, "hidden_act", "is 'relu'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type", "is 'relative_key'"),
    ({"model_type": "roberta"}, "model_type", "is 'roberta'; only 'bert'"),
    ({"is_decoder": True}, "is_decoder", "is True; only False"),
    ({"add_cross_attention": True}, "add_cross_attention", "is True"),
    ({"num_attention_heads": 3}, "num_attention_heads", "does not divide hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers", "must be a positive int, got 0"),
    ({"hidden_size": True}, "hidden_size", "must be a positive int, got True"),
    ({"layer_norm_eps": "1e-12"}, "layer_norm_eps", "must be a positive float"),
])
def test_a_setting_not_computed_exactly_is_refused_by_name(tiny, tmp_path, changes, setting, message):
    settings = {**json.loads((tiny["BertModel"] / "config.json").read_text(encoding="utf-8")), **changes}
    error = refusal(folder_from(tiny["BertModel"], tmp_path / "m", settings=settings))
    assert error.setting == setting and message in str(error)


@pytest.mark.parametrize("content", [None, b"not a safetensors file"])
def test_weights_missing_or_unreadable_are_refused(tiny, tmp_path, content):
    folder = folder_from(tiny["BertModel"], tmp_path / "m", without=("model.safetensors",))
    if content is not None:
        (folder / "model.safetensors").write_bytes(content)
    error = refusal(folder)
    assert error.setting == "model.safetensors"
    assert ("is missing" if content is None else "cannot be read") in str(error)


def test_a_tensor_missing_from_the_weights_is_refused_by_name(tiny, tmp_path):
    tensors = load_file(str(tiny["BertModel"] / "model.safetensors"))
    del tensors["encoder.layer.1.output.dense.bias"]
    error = refusal(folder_from(tiny["BertModel"], tmp_path / "m", tensors=tensors))
    assert error.setting == "model.safetensors"
    assert "lacks 1 tensors, e.g. encoder.layer.1.output.dense.bias" in str(error)


@pytest.mark.parametrize(("name", "shape"), [
    ("embeddings.word_embeddings.weight", (30000, 8)),
    ("embeddings.position_embeddings.weight", (32, 8)),
    ("encoder.layer.1.intermediate.dense.weight", (32, 8)),
    ("encoder.layer.0.attention.self.key.weight", (6, 8)),
    ("encoder.layer.0.attention.self.value.bias", (1,)),
    ("encoder.layer.1.output.LayerNorm.weight", (1,)),
    ("embeddings.LayerNorm.bias", (16,)),
])
def test_a_tensor_of_the_wrong_shape_is_refused_by_name(tiny, tmp_path, name, shape):
    tensors = load_file(str(tiny["BertModel"] / "model.safetensors"))
    tensors[name] = np.ones(shape, np.float32)
    error = refusal(folder_from(tiny["BertModel"], tmp_path / "m", tensors=tensors))
    assert error.setting == "model.safetensors" and name in str(error) and str(shape) in str(error)


def test_a_folder_without_its_tokenizer_is_refused(tiny, tmp_path):
    error = refusal(folder_from(tiny["BertModel"], tmp_path / "m", without=("tokenizer.json",)))
    assert error.setting == "tokenizer.json" and "is missing" in str(error)
