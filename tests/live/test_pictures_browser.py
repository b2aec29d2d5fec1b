"""The SVG pictures in a real headless Chromium: every text measured where the browser draws it.

Each picture comes from the real gunicorn; Chromium lays out its texts with the fonts it has (Debian: DejaVu Sans
for sans-serif), and getBBox() / getCTM() give each text's box in the picture's viewBox, rotated labels included.
Every box must lie inside the picture and overlap no other; getComputedTextLength() must stay within the width the
renderer planned for it (service.operations.svgtext.text_width), which is what keeps it there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import requests

from service.operations.svgtext import text_width
from tests.live.test_browser import browser  # noqa: F401 (the module's headless Chromium, a fixture)

TIMEOUT = 20  # seconds per request
LONG_TITLE = ("The causal mask stops a decoder from reading the future: token i attends only to tokens 0..i, so "
              "the upper triangle of the weights is exactly zero, as this long title says at length")
WORD_TITLE = "Supercalifragilistic" * 10  # 200 characters, no space to break at
LABELS = ["WWWWWWWWWWWWWW", "東京大学東京大学東京大学", "😀 émoji 😀", "i"]
SENTENCE = ["the", "cat", "ate", "food", "it"]

# The picture's size and, for every text, its box (after its transform) in viewBox units, its drawn length, size,
# weight, class and content.
MEASURE = """
const svg = document.documentElement;
const box = svg.viewBox.baseVal;
return {width: box.width, height: box.height, texts: [...svg.querySelectorAll('text')].map(text => {
  const b = text.getBBox(), m = text.getCTM();
  const corners = [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height], [b.x + b.width, b.y + b.height]]
    .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
  const xs = corners.map(c => c[0]), ys = corners.map(c => c[1]);
  const style = getComputedStyle(text);
  return {box: [Math.min(...xs), Math.min(...ys), Math.max(...xs), Math.max(...ys)],
          length: text.getComputedTextLength(), size: parseFloat(style.fontSize),
          bold: Number(style.fontWeight) >= 600, cls: text.getAttribute('class'), content: text.textContent};
})};"""


def heatmap(url: str, body: dict) -> str:
    return _svg(requests.post(f"{url}/v1/heatmap", json=body, timeout=TIMEOUT))


def computed(url: str, path: str, body: dict, query: str = "") -> str:
    return _svg(requests.post(f"{url}{path}?format=svg{query}", json=body, timeout=TIMEOUT))


def _svg(response: requests.Response) -> str:
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("image/svg+xml")
    return response.text


PICTURES = {
    "causal-mask demo": lambda url: _svg(requests.get(f"{url}/v1/demos/causal-mask/heatmap", timeout=TIMEOUT)),
    "lookup demo": lambda url: _svg(requests.get(f"{url}/v1/demos/lookup/heatmap", timeout=TIMEOUT)),
    "long title, wide labels, mask, max scale": lambda url: heatmap(url, {
        "weights": (np.tri(4) / np.tri(4).sum(-1, keepdims=True)).tolist(), "mask": np.tri(4, dtype=bool).tolist(),
        "title": LONG_TITLE, "row_labels": LABELS, "col_labels": LABELS, "color_scale": "max", "annotate": True}),
    "a title of one 200-character word": lambda url: heatmap(url, {"weights": [[0.25, 0.75]], "title": WORD_TITLE}),
    "encoder: batch, layers, causal, mask": lambda url: computed(url, "/v1/encoder", {
        "embeddings": np.random.default_rng(0).normal(size=(2, 4, 8)).tolist(), "n_heads": 2, "n_layers": 2,
        "causal": True, "mask": [True, True, True, False], "positional_encoding": True, "seed": 12345}),
    "24 tokens, 2 heads, row scale": lambda url: computed(url, "/v1/multi-head-attention", {
        "tokens": (SENTENCE * 5)[:24], "d_model": 8, "n_heads": 2}, "&color_scale=row"),
    "model, a text pair, 2 layers x 2 heads": lambda url: computed(url, "/v1/models/all-minilm-l6-v2/attention", {
        "text": "The animal didn't cross the street because it was too tired.", "text_pair": "It was.",
        "layers": [0, 5], "heads": [0, 11]}),
}


def measure(driver: Any, svg: str, tmp_path) -> dict:
    """The picture opened as a document of its own in Chromium, its texts measured (MEASURE)."""
    path = tmp_path / "picture.svg"
    path.write_text(svg, encoding="utf-8")
    driver.get(path.as_uri())
    return driver.execute_script(MEASURE)


def overlapping(boxes: np.ndarray, slack: float = 0.5) -> list[tuple[int, int]]:
    """Pairs (i < j) of boxes (x0, y0, x1, y1) that overlap by more than ``slack`` px both ways."""
    wide = np.minimum(boxes[:, None, 2], boxes[None, :, 2]) - np.maximum(boxes[:, None, 0], boxes[None, :, 0])
    tall = np.minimum(boxes[:, None, 3], boxes[None, :, 3]) - np.maximum(boxes[:, None, 1], boxes[None, :, 1])
    return [(i, j) for i, j in zip(*np.nonzero((wide > slack) & (tall > slack)), strict=True) if i < j]


@pytest.fixture(scope="module")
def pictures(live_server) -> dict[str, str]:
    return {name: fetch(live_server) for name, fetch in PICTURES.items()}


@pytest.mark.parametrize("name", list(PICTURES))
def test_every_text_is_inside_the_picture_where_chromium_draws_it(browser, pictures, name, tmp_path):  # noqa: F811
    found = measure(browser, pictures[name], tmp_path)
    width, height, texts = found["width"], found["height"], found["texts"]
    assert len(texts) > 10
    boxes = np.array([text["box"] for text in texts])
    outside = [(text["content"], text["box"]) for text, (x0, y0, x1, y1) in zip(texts, boxes, strict=True)
               if x0 < -0.01 or y0 < -0.01 or x1 > width + 0.01 or y1 > height + 0.01]
    assert outside == [], f"texts outside the {width} x {height} picture"
    clashes = [(texts[i]["content"], texts[j]["content"]) for i, j in overlapping(boxes)]
    assert clashes == [], "texts drawn over each other"


@pytest.mark.parametrize("name", list(PICTURES))
def test_chromium_draws_no_text_longer_than_the_renderer_planned(browser, pictures, name, tmp_path):  # noqa: F811
    texts = measure(browser, pictures[name], tmp_path)["texts"]
    planned = [text_width(text["content"], text["size"], bold=text["bold"]) for text in texts]
    longer = [(text["content"], text["length"], plan) for text, plan in zip(texts, planned, strict=True)
              if text["length"] > plan + 0.01]
    assert longer == []
    assert sum(text["length"] for text in texts) > 0.7 * sum(planned)  # and no wild overestimate either


def test_long_titles_wrap_whole_within_the_width(browser, pictures, tmp_path):  # noqa: F811
    for name, title, joiner in (("long title, wide labels, mask, max scale", LONG_TITLE, " "),
                                ("a title of one 200-character word", WORD_TITLE, "")):
        found = measure(browser, pictures[name], tmp_path)
        lines = [text for text in found["texts"] if text["cls"] == "title"]
        assert len(lines) > 1 and joiner.join(line["content"] for line in lines) == title  # every letter shown
        assert max(line["box"][2] for line in lines) <= found["width"] - 12  # inside the right margin
    demo = measure(browser, pictures["causal-mask demo"], tmp_path)
    assert [t["content"] for t in demo["texts"] if t["cls"] == "title"] == [
        "The causal mask stops a decoder from reading the future"]
