"""service.heatmap: the SVG is well-formed, complete, escaped, and carries the exact values."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from service.operations.heatmap import LUT, TEXT_LUT, render_heatmap

SVG_NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on anything that is not well-formed XML
    assert root.tag == SVG_NS + "svg"
    return root


def cells(root: ET.Element) -> list[ET.Element]:
    return [rect for rect in root.iter(SVG_NS + "rect") if rect.get("class") == "cell"]


def causal_weights(heads: int, n: int, seed: int = 0) -> np.ndarray:
    """(heads, n, n) rows summing to 1 with the upper triangle exactly 0."""
    raw = np.random.default_rng(seed).random((heads, n, n)) * np.tril(np.ones((n, n)))
    return raw / raw.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", [(2, 2), (1, 5), (3, 4, 5), (4, 5, 5), (1, 64, 64)])
def test_one_cell_per_weight_with_its_exact_value(shape):
    weights = np.random.default_rng(1).random(shape)
    root = parse(render_heatmap(weights))
    found = cells(root)
    assert len(found) == weights.size  # h * n_q * n_k
    panels = [g for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"]
    assert len(panels) == (shape[0] if len(shape) == 3 else 1)
    values = np.array([float(rect.get("data-value")) for rect in found]).reshape(weights.shape)
    assert (values == weights).all()  # repr round-trips exactly
    rows = [int(rect.get("data-row")) for rect in found]
    assert rows[:shape[-1]] == [0] * shape[-1]


def test_standalone_svg_with_view_box_title_and_legend():
    root = parse(render_heatmap(causal_weights(2, 3), title="Two heads"))
    assert len(root.get("viewBox").split()) == 4 and root.get("width") and root.get("height")
    assert root.find(SVG_NS + "title").text == "Two heads"
    legend = next(g for g in root.iter(SVG_NS + "g") if g.get("class") == "legend")
    texts = [t.text for t in legend.iter(SVG_NS + "text")]
    assert {"0", "0.5", "1", "0 / masked"} <= set(texts)
    stops = list(root.iter(SVG_NS + "stop"))
    assert stops[0].get("stop-color") == LUT[0] and stops[-1].get("stop-color") == LUT[255]
    titles = [t.text for t in root.iter(SVG_NS + "text") if t.get("font-weight")]
    assert titles == ["Two heads", "head 0", "head 1"]


def test_zero_cells_are_hatched_and_others_coloured_on_the_scale():
    weights = np.array([[1.0, 0.0], [0.5, 0.5]])
    fills = [rect.get("fill") for rect in cells(parse(render_heatmap(weights)))]
    assert fills == [LUT[255], "url(#masked)", LUT[128], LUT[128]]
    assert LUT[0] != LUT[255] and TEXT_LUT[0] != TEXT_LUT[255]  # text stays readable at both ends


def test_hostile_labels_are_escaped_and_control_characters_replaced():
    hostile = ['<script>alert("x")</script>', "a&b'c", "ctl\x00\x01\x1b\x7f\ud800\uffff", "tab\tnew\nline"]
    svg = render_heatmap(np.full((4, 4), 0.25), row_labels=hostile, col_labels=hostile, title="</svg><script>")
    root = parse(svg)
    assert not [el for el in root.iter() if el.tag.lower().endswith("script")]
    assert not [name for el in root.iter() for name in el.attrib if name.lower().startswith("on")]
    hover = [t.text for t in root.iter(SVG_NS + "title")]
    assert hover[0] == "</svg><script>"
    assert hover[1] == '<script>alert("x")</script> → <script>alert("x")</script>: 0.25'
    assert "ctl\ufffd\ufffd\ufffd\ufffd\ufffd\ufffd → " in "".join(hover) and "tab new line" in "".join(hover)
    assert "<script" not in svg and "\x00" not in svg


def test_long_labels_are_shortened_on_screen_but_kept_in_the_hover_title():
    label = "a" * 40
    root = parse(render_heatmap(np.full((1, 2), 0.5), row_labels=[label], col_labels=["x", "y"]))
    shown = [t.text for t in root.iter(SVG_NS + "text")]
    assert "a" * 13 + "…" in shown and label not in shown
    assert any(label in t.text for t in root.iter(SVG_NS + "title"))


@pytest.mark.parametrize(("annotate", "n", "expected"), [(None, 5, True), (None, 40, False), (True, 40, True),
                                                         (False, 5, False)])
def test_values_written_in_cells_when_asked_or_when_large_enough(annotate, n, expected):
    weights = np.full((n, n), 1 / n)
    root = parse(render_heatmap(weights, annotate=annotate, decimals=3))
    written = [t for t in root.iter(SVG_NS + "text") if t.text == f"{1 / n:.3f}"]
    assert len(written) == (n * n if expected else 0)


@pytest.mark.parametrize("n", [2, 64])
def test_readable_sizes_from_2_to_64_tokens(n):
    root = parse(render_heatmap(np.full((n, n), 1 / n)))
    cell = float(cells(root)[0].get("width"))
    fonts = {float(t.get("font-size")) for t in root.iter(SVG_NS + "text")}
    assert 14 <= cell <= 44 and min(fonts) >= 9
    assert float(root.get("width")) <= 1400  # 64 tokens still fit a screen at 1:1


def test_any_memory_layout_is_drawn():
    weights = causal_weights(2, 4)
    assert parse(render_heatmap(weights.transpose(0, 2, 1))) is not None  # a non-contiguous view
