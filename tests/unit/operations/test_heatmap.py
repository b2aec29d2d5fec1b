"""service.operations.heatmap: the SVG is well-formed, complete, escaped, carries the exact values, masks what it
is told to, lays stacks out one row per layer and scales the colours as asked. (Where its texts land in a real
browser: tests/live/test_pictures_browser.py.)"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from service.operations.heatmap import MARGIN, render_heatmap
from service.operations.palette import LUT, MASKED_LABEL, TEXT_LUT, ZERO_LABEL
from service.operations.svgtext import text_width

SVG_NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on anything that is not well-formed XML
    assert root.tag == SVG_NS + "svg"
    return root


def cells(root: ET.Element) -> list[ET.Element]:
    return [rect for rect in root.iter(SVG_NS + "rect") if "cell" in rect.get("class", "").split()]


def texts(root: ET.Element, cls: str) -> list[str]:
    return [t.text for t in root.iter(SVG_NS + "text") if t.get("class") == cls]


def legend_texts(root: ET.Element) -> list[str]:
    legend = next(g for g in root.iter(SVG_NS + "g") if g.get("class") == "legend")
    return [t.text for t in legend.iter(SVG_NS + "text")]


def causal_weights(heads: int, n: int, seed: int = 0) -> np.ndarray:
    """(heads, n, n) rows summing to 1 with the upper triangle exactly 0."""
    raw = np.random.default_rng(seed).random((heads, n, n)) * np.tril(np.ones((n, n)))
    return raw / raw.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", [(2, 2), (1, 5), (3, 4, 5), (4, 5, 5), (1, 64, 64), (2, 3, 4, 4)])
def test_one_cell_per_weight_with_its_exact_value(shape):
    weights = np.random.default_rng(1).random(shape)
    root = parse(render_heatmap(weights))
    found = cells(root)
    assert len(found) == weights.size  # h * n_q * n_k
    panels = [g for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"]
    assert len(panels) == int(np.prod(shape[:-2]))
    values = np.array([float(rect.get("data-value")) for rect in found]).reshape(weights.shape)
    assert (values == weights).all()  # repr round-trips exactly
    rows = [int(rect.get("data-row")) for rect in found]
    assert rows[:shape[-1]] == [0] * shape[-1]


def test_standalone_svg_with_view_box_title_axes_and_legend():
    root = parse(render_heatmap(causal_weights(2, 3), title="Two heads"))
    assert len(root.get("viewBox").split()) == 4 and root.get("width") and root.get("height")
    assert root.find(SVG_NS + "title").text == "Two heads"
    shown = legend_texts(root)
    assert " ".join(shown[:-5]) == "weight, fixed scale 0 to 1" and shown[-5:] == ["0", "0.25", "0.5", "0.75", "1"]
    stops = list(root.iter(SVG_NS + "stop"))
    assert stops[0].get("stop-color") == LUT[0] and stops[-1].get("stop-color") == LUT[255]
    titles = [t.text for t in root.iter(SVG_NS + "text") if t.get("font-weight")]
    assert titles == ["Two heads", "head 0", "head 1"]
    assert texts(root, "axis") == ["keys →", "queries ↓"] * 2  # each panel says which axis is which


def test_a_zero_is_coloured_as_0_and_only_hidden_cells_are_hatched():
    weights = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    plain = parse(render_heatmap(weights, annotate=True))
    assert [rect.get("fill") for rect in cells(plain)][:3] == [LUT[255], LUT[0], LUT[0]]  # zeros, not masked
    assert MASKED_LABEL not in legend_texts(plain) and not plain.findall(f".//{SVG_NS}rect[@class='swatch']")
    hidden = ~np.tri(3, dtype=bool)
    root = parse(render_heatmap(weights, hidden=hidden, annotate=True))
    found = cells(root)
    assert [rect.get("class") == "cell masked" for rect in found] == hidden.ravel().tolist()
    assert [rect.get("fill") for rect in found][:3] == [LUT[255], "url(#masked)", "url(#masked)"]
    assert [rect.find(SVG_NS + "title").text for rect in found][1:3] == ["0 → 1: 0.0 (masked)", "0 → 2: 0.0 (masked)"]
    swatches = [rect.get("fill") for rect in root.iter(SVG_NS + "rect") if rect.get("class") == "swatch"]
    assert swatches == ["url(#masked)", LUT[0]]  # the legend tells a masked cell from a weight of 0
    assert " ".join(legend_texts(root)).endswith(f"{MASKED_LABEL} {ZERO_LABEL}")
    written = [t.text for t in root.iter(SVG_NS + "text") if t.get("text-anchor") == "middle"]
    assert written == ["1.00", "0.50", "0.50", "0.20", "0.30", "0.50"]  # masked cells carry no number
    norms = parse(render_heatmap(weights, hidden=hidden, quantity="norm"))
    assert " ".join(legend_texts(norms)).endswith(f"{MASKED_LABEL} norm ≈ 0, not masked")  # what is drawn
    table = parse(render_heatmap(weights, hidden=hidden, axes=("layers ↓", "heads →"),
                                 hidden_labels=("not knocked out", "≈ 0: knocked out, changed nothing")))
    assert " ".join(legend_texts(table)).endswith("not knocked out ≈ 0: knocked out, changed nothing")
    assert [rect.find(SVG_NS + "title").text for rect in cells(table)][1] == "0 → 1: 0.0 (not knocked out)"
    axes = [t.text for t in table.iter(SVG_NS + "text") if t.get("class") == "axis"]
    assert axes == ["heads →", "layers ↓"]


def test_hidden_broadcasts_over_the_panels():
    root = parse(render_heatmap(np.full((2, 1, 3), 0.0), hidden=np.array([False, True, True])))
    assert [rect.get("class") for rect in cells(root)] == ["cell", "cell masked", "cell masked"] * 2


def test_a_stack_is_drawn_one_row_of_panels_per_layer():
    weights = np.random.default_rng(2).random((2, 3, 4, 4))  # 2 layers of 3 heads
    root = parse(render_heatmap(weights, row_titles=["layer 0", "layer 1"], panel_titles=["head 0", "head 1",
                                                                                            "head 2"]))
    assert texts(root, "row-title") == ["layer 0", "layer 1"]
    panels = [g for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"]
    corners = [(float(cells_of[0].get("x")), float(cells_of[0].get("y")))
               for cells_of in ([r for r in g.iter(SVG_NS + "rect")] for g in panels)]
    xs, ys = zip(*corners, strict=True)
    assert ys[0] == ys[1] == ys[2] < ys[3] == ys[4] == ys[5]  # heads along a row, a row per layer
    assert xs[:3] == xs[3:] and xs[0] < xs[1] < xs[2]
    titles = [next(g.iter(SVG_NS + "text")).text for g in panels]
    assert titles == ["head 0", "head 1", "head 2"] * 2
    row_titles = [float(t.get("y")) for t in root.iter(SVG_NS + "text") if t.get("class") == "row-title"]
    assert row_titles[0] < ys[0] and ys[2] < row_titles[1] < ys[3]  # each row's title above it


def test_the_settings_are_written_under_the_title_and_long_texts_wrap_inside_the_picture():
    title = "The causal mask stops a decoder from reading the future " * 4
    settings = ["causal: yes", "positional encoding: yes", "seed: 3", "d_model: 4"] * 6
    root = parse(render_heatmap(np.full((2, 2), 0.5), title=title, settings=settings))
    width = float(root.get("width"))
    lines, written = texts(root, "title"), texts(root, "settings")
    assert len(lines) > 1 and " ".join(lines) == " ".join(title.split())  # wrapped, nothing cut
    assert len(written) > 1 and " ".join(written) == " · ".join(settings)
    assert max(text_width(line, 17, bold=True) for line in lines) <= width - 2 * MARGIN
    assert max(text_width(line, 12) for line in written) <= width - 2 * MARGIN
    line_ys = [float(t.get("y")) for t in root.iter(SVG_NS + "text") if t.get("class") in ("title", "settings")]
    first_panel_y = min(float(rect.get("y")) for rect in cells(root))
    assert line_ys == sorted(line_ys) and line_ys[-1] < first_panel_y


def test_row_and_max_colour_scales_put_the_brightest_colour_where_they_say():
    weights = np.array([[[0.1, 0.2, 0.7], [0.02, 0.03, 0.05]]])  # a second row 14 times fainter
    fills = {scale: [rect.get("fill") for rect in cells(parse(render_heatmap(weights, color_scale=scale)))]
             for scale in ("fixed", "row", "max")}
    assert fills["fixed"] == [LUT[round(v * 255)] for v in weights.ravel()]
    assert fills["row"] == [LUT[round(v * 255)] for v in (1 / 7, 2 / 7, 1.0, 0.4, 0.6, 1.0)]
    assert fills["max"] == [LUT[round(v / 0.7 * 255)] for v in weights.ravel()]
    shown = legend_texts(parse(render_heatmap(weights, color_scale="row")))
    assert " ".join(shown[:-5]) == "row scale: weight ÷ its row's largest"
    assert shown[-5:] == ["0%", "25%", "50%", "75%", "100%"]
    heading = legend_texts(parse(render_heatmap(weights, color_scale="max")))
    assert " ".join(heading[:-5]) == "scale 0 to the picture's largest weight, 0.7"
    assert heading[-5:] == ["0", "0.175", "0.35", "0.525", "0.7"]  # the ticks in weights


def test_a_row_of_zeros_stays_at_the_bottom_of_the_row_scale():
    fills = [rect.get("fill") for rect in cells(parse(render_heatmap(np.zeros((2, 2)), color_scale="row")))]
    assert fills == [LUT[0]] * 4


def test_hostile_labels_are_escaped_and_control_characters_replaced():
    hostile = ['<script>alert("x")</script>', "a&b'c", "ctl\x00\x01\x1b\x7f\ud800\uffff", "tab\tnew\nline"]
    svg = render_heatmap(np.full((4, 4), 0.25), row_labels=hostile, col_labels=hostile, title="</svg><script>",
                         settings=["<b>&"], row_titles=None)
    root = parse(svg)
    assert not [el for el in root.iter() if el.tag.lower().endswith("script")]
    assert not [name for el in root.iter() for name in el.attrib if name.lower().startswith("on")]
    hover = [t.text for t in root.iter(SVG_NS + "title")]
    assert hover[0] == "</svg><script>"
    assert hover[1] == '<script>alert("x")</script> → <script>alert("x")</script>: 0.25'
    assert "ctl\ufffd\ufffd\ufffd\ufffd\ufffd\ufffd → " in "".join(hover) and "tab new line" in "".join(hover)
    assert "<script" not in svg and "\x00" not in svg and texts(root, "settings") == ["<b>&"]


def test_long_labels_are_shortened_on_screen_but_kept_in_the_hover_title():
    label = "a" * 40
    root = parse(render_heatmap(np.full((1, 2), 0.5), row_labels=[label], col_labels=["x", "y"]))
    shown = [t.text for t in root.iter(SVG_NS + "text")]
    assert "a" * 13 + "…" in shown and label not in shown
    assert any(label in t.text for t in root.iter(SVG_NS + "title"))


def test_margins_grow_with_the_labels_widths():
    narrow = parse(render_heatmap(np.full((1, 2), 0.5), row_labels=["iii"]))
    wide = parse(render_heatmap(np.full((1, 2), 0.5), row_labels=["WWWWWWWWWWWW"]))
    cjk = parse(render_heatmap(np.full((1, 2), 0.5), row_labels=["東京大学東京大学東京"]))
    grid_x = [min(float(rect.get("x")) for rect in cells(root)) for root in (narrow, wide, cjk)]
    assert grid_x[1] - grid_x[0] == pytest.approx(text_width("W" * 12, 13) - text_width("queries ↓", 11), abs=0.1)
    assert grid_x[2] >= text_width("東" * 10, 13)  # wide characters are counted a full em and more


@pytest.mark.parametrize(("annotate", "n", "expected"), [(None, 5, True), (None, 40, False), (True, 40, True),
                                                         (False, 5, False)])
def test_values_written_in_cells_when_asked_or_when_large_enough(annotate, n, expected):
    weights = np.full((n, n), 1 / n)
    root = parse(render_heatmap(weights, annotate=annotate, decimals=3))
    written = [t for t in root.iter(SVG_NS + "text") if t.text == f"{1 / n:.3f}"]
    assert len(written) == (n * n if expected else 0)
    assert TEXT_LUT[0] != TEXT_LUT[255]  # text stays readable at both ends of the scale


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
