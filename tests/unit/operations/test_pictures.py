"""service.operations.pictures: what a compute answer's or a demo's picture says, from the request itself: the cells
its mask and causal flag hid, its settings, one row of heads per layer."""

from __future__ import annotations

import numpy as np
import pytest

import attention as engine
from service.operations import pictures
from service.operations.registry import OPERATIONS
from service.settings import Limits
from tests.unit.operations.test_heatmap import SVG_NS, cells, parse, texts

SENTENCE = ["the", "cat", "ate", "food", "it"]


def picture(op: str, body: dict, color_scale: str = "fixed", **path: str):
    """The parsed ?format=svg picture of ``body`` sent to operation ``op`` (``path``: its path parameters), and the
    answer it draws."""
    operation = OPERATIONS[op]
    params = operation.resolved({**operation.request().load(body), **path, "format": "svg"})
    result = operation.compute(operation.prepare(params, Limits()))
    return parse(pictures.compute_heatmap(operation.drawing, params, result, Limits(), color_scale)), result


def masked(root) -> np.ndarray:
    return np.array([rect.get("class") == "cell masked" for rect in cells(root)])


def panel_titles(root) -> list[str]:
    return [next(g.iter(SVG_NS + "text")).text for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"]


def test_hidden_cells_are_the_masks_false_cells_and_with_causal_the_future():
    assert pictures.hidden_cells(None, False, (2, 3, 3)) is None
    np.testing.assert_array_equal(pictures.hidden_cells(None, True, (2, 3)), [[False, True, True],
                                                                             [False, False, True]])
    keys = np.array([True, True, False])  # (n_k,): the last key is padding
    np.testing.assert_array_equal(pictures.hidden_cells(keys, True, (2, 3, 3))[1], [[False, True, True],
                                                                                   [False, False, True],
                                                                                   [False, False, True]])


def test_causal_cells_are_masked_and_an_unmasked_zero_is_not():
    # "it" has no overlap with "cat": with a huge scale its weight underflows to exactly 0, yet it was not masked.
    embeddings = engine.embed(SENTENCE).tolist()
    root, result = picture("attention", {"query": embeddings[1:2], "key": embeddings, "value": embeddings,
                                         "scale": 2000.0})
    weights = np.ravel(result["weights"])
    assert (weights == 0).sum() == 4 and not masked(root).any()
    assert "masked: may not attend" not in " ".join(t.text for t in root.iter(SVG_NS + "text"))
    root, result = picture("self-attention", {"tokens": SENTENCE, "causal": True})
    np.testing.assert_array_equal(masked(root), ~np.tri(5, dtype=bool).ravel())


@pytest.mark.parametrize("per_head", [False, True])
def test_a_multi_head_mask_is_read_as_the_layer_reads_it(per_head):
    rng = np.random.default_rng(3)
    mask = rng.random((2, 5, 5) if per_head else (5, 5)) > 0.3
    mask[..., 0] = True  # every query sees a key
    root, result = picture("multi-head-attention", {"tokens": SENTENCE, "d_model": 4, "n_heads": 2,
                                                    "mask": mask.tolist()})
    expected = np.broadcast_to(~mask, (2, 5, 5)).ravel()
    np.testing.assert_array_equal(masked(root), expected)
    assert (np.ravel(result["weights"])[expected] == 0).all()


def test_an_encoder_is_drawn_one_row_of_heads_per_layer_and_batch_item():
    embeddings = np.random.default_rng(4).normal(size=(2, 3, 4)).tolist()  # B = 2
    root, _ = picture("encoder", {"embeddings": embeddings, "n_heads": 2, "n_layers": 2, "causal": True})
    assert texts(root, "row-title") == ["layer 0 · batch 0", "layer 0 · batch 1", "layer 1 · batch 0",
                                        "layer 1 · batch 1"]
    assert panel_titles(root) == ["head 0", "head 1"] * 4
    assert masked(root).sum() == 8 * 3  # 3 of each 3 x 3 causal panel's 9 cells
    assert " ".join(texts(root, "settings")) == ("d_model: 4 · layers: 2 · d_ff: 16 · heads: 2 · seed: 0 · "
                                                 "positional encoding: no · causal: yes · mask: none · dtype: float64")


@pytest.mark.parametrize(("op", "body", "settings"), [
    ("attention", {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [2.0]]},
     "scale: 1/√2 · causal: no · mask: none · dtype: float64"),
    ("attention", {"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], "scale": 0.25, "mask": [[True]],
                   "dtype": "float32"}, "scale: 0.25 · causal: no · mask: given · dtype: float32"),
    ("self-attention", {"tokens": ["cat", "ate"], "d_k": 3, "seed": 7, "positional_encoding": True},
     "d_model: 4 · d_k: 3 · seed: 7 · positional encoding: yes · causal: no · mask: none · dtype: float64"),
    ("multi-head-attention", {"tokens": ["cat", "ate"], "d_model": 8, "n_heads": 4, "causal": True},
     "d_model: 8 · heads: 4 · seed: 0 · positional encoding: no · causal: yes · mask: none · dtype: float64"),
])
def test_each_picture_states_the_runs_settings(op, body, settings):
    root, _ = picture(op, body)
    assert " ".join(texts(root, "settings")) == settings


def test_a_models_picture_names_its_layers_heads_and_model():
    root, _ = picture("model-attention", {"text": "the dog ate", "layers": [4, 2], "heads": [7, 1]},
                      model="all-minilm-l6-v2")
    assert texts(root, "row-title") == ["layer 2", "layer 4"] and panel_titles(root) == ["head 1", "head 7"] * 2
    assert " ".join(texts(root, "settings")) == (
        "model: all-minilm-l6-v2 · 6 layers × 12 heads, d_model 384 · trained weights (no seed) · positional "
        "encoding: learned · causal: no · input: text · dtype: float32")
    assert not masked(root).any()


def test_a_color_scale_reaches_the_picture():
    root, result = picture("self-attention", {"tokens": SENTENCE, "causal": True}, "row")
    weights = np.asarray(result["weights"])
    brightest = [rect for rect in cells(root) if rect.get("fill") == "#fde725"]  # viridis' top
    assert len(brightest) == 5  # one per row: its largest weight
    assert [int(rect.get("data-col")) for rect in brightest] == weights.argmax(-1).tolist()


def test_every_demo_with_weights_is_pictured_from_a_request_that_computes_them_exactly():
    with_weights = [name for name, demo in engine.DEMOS.items() if "weights" in demo.run()]
    assert pictures.demos_with_heatmaps() == with_weights == list(pictures.DEMO_REQUESTS)
    for name, (op, body) in pictures.DEMO_REQUESTS.items():
        operation = OPERATIONS[op]
        computed = operation.compute(operation.prepare(operation.request().load(body), Limits()))["weights"]
        np.testing.assert_array_equal(computed, engine.DEMOS[name].run()["weights"])  # bit for bit


def test_demo_pictures_carry_their_title_settings_and_causal_mask():
    root = parse(pictures.demo_heatmap("causal-mask"))
    assert texts(root, "title") == ["The causal mask stops a decoder from reading the future"]
    assert " ".join(texts(root, "settings")) == ("d_model: 4 · d_k: 4 · seed: 3 · positional encoding: yes · "
                                                 "causal: yes · mask: none · dtype: float64")
    np.testing.assert_array_equal(masked(root), ~np.tri(5, dtype=bool).ravel())
    lookup = parse(pictures.demo_heatmap("lookup"))
    assert [rect.find(SVG_NS + "title").text.split(":")[0] for rect in cells(lookup)] == [
        f"it → {token}" for token in SENTENCE]
    assert not masked(lookup).any()
    assert pictures.demo_heatmap("scaling") is None
