"""POST /v1/heatmap, GET /v1/demos/{name}/heatmap and ?format=svg on the compute endpoints."""

from __future__ import annotations

import re

import numpy as np
import pytest

from service.edge.v1.heatmap import EXAMPLE
from service.operations.palette import LUT
from service.settings import Limits
from tests.conftest import app_with, assert_problem
from tests.unit.operations.test_heatmap import SVG_NS, cells, parse

SENTENCE = ["the", "cat", "ate", "food", "it"]
DEMO_5 = {"tokens": SENTENCE, "d_model": 8, "n_heads": 4, "positional_encoding": True, "causal": True}


def svg_of(response):
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "image/svg+xml"
    return parse(response.get_data(as_text=True))


def values(root) -> np.ndarray:
    return np.array([float(rect.get("data-value")) for rect in cells(root)])


def hover_titles(root) -> list[str]:
    return [t.text for t in root.iter(SVG_NS + "title")]


def test_heatmap_draws_every_head_with_labels(client):
    root = svg_of(client.post("/v1/heatmap", json=EXAMPLE))
    np.testing.assert_array_equal(values(root), np.ravel(EXAMPLE["weights"]))
    assert hover_titles(root)[:3] == ["Two causal heads", "cat → cat: 1.0", "cat → ate: 0.0 (masked)"]
    assert [c.get("fill") for c in cells(root)][1] == "url(#masked)"


def test_heatmap_hatches_only_what_its_mask_hides_and_scales_its_colours_as_asked(client):
    weights = [[0.9, 0.1, 0.0], [0.4, 0.6, 0.0]]  # weights of 0 that only a mask can say are masked
    plain = svg_of(client.post("/v1/heatmap", json={"weights": weights}))
    assert [c.get("class") for c in cells(plain)] == ["cell"] * 6
    root = svg_of(client.post("/v1/heatmap", json={"weights": weights, "mask": [True, True, False],
                                                   "color_scale": "row"}))
    assert [c.get("class") for c in cells(root)] == ["cell", "cell", "cell masked"] * 2
    assert [c.get("fill") for c in cells(root)][:2] == [LUT[255], LUT[round(0.1 / 0.9 * 255)]]
    assert "row scale:" in " ".join(t.text for t in root.iter(SVG_NS + "text"))


def test_format_svg_takes_a_color_scale(client):
    body = {"tokens": SENTENCE, "causal": True}
    fills = {scale: [c.get("fill") for c in cells(svg_of(client.post(f"/v1/self-attention?format=svg{query}",
                                                                      json=body)))]
             for scale, query in (("fixed", ""), ("row", "&color_scale=row"))}
    assert fills["fixed"][0] == fills["row"][0] == LUT[255]  # the first row's one weight is 1 either way
    assert fills["row"].count(LUT[255]) == 5 > fills["fixed"].count(LUT[255])  # each row's largest is the top


@pytest.mark.parametrize("ask", [
    lambda client, body, query: client.post(f"/v1/self-attention/heatmap?{query}", json=body),
    lambda client, body, query: client.post(f"/v1/self-attention?{query}", json=body,
                                            headers={"Accept": "image/svg+xml"}),
], ids=["heatmap path", "Accept"])
def test_every_way_to_ask_for_the_picture_takes_a_color_scale(client, ask):
    body = {"tokens": SENTENCE, "causal": True}
    row = [c.get("fill") for c in cells(svg_of(ask(client, body, "color_scale=row")))]
    fixed = [c.get("fill") for c in cells(svg_of(ask(client, body, "")))]
    assert row.count(LUT[255]) == 5 > fixed.count(LUT[255])
    assert_problem(ask(client, body, "color_scale=log"), 422, "color_scale")


def test_heatmap_defaults_to_position_labels(client):
    root = svg_of(client.post("/v1/heatmap", json={"weights": [[0.25, 0.75]]}))
    assert hover_titles(root) == ["Attention weights", "0 → 0: 0.25", "0 → 1: 0.75"]


@pytest.mark.parametrize(("body", "pointer"), [
    ({"weights": [[0.5, 1.5]]}, "/weights/0/1"),
    ({"weights": [[[0.5], [-0.1]]]}, "/weights/0/1/0"),
    ({"weights": [0.5]}, "/weights"),
    ({"weights": [[[[0.5]]]]}, "/weights"),
    ({"weights": [[True]]}, "/weights/0/0"),
    ({"weights": [[0.5, 0.5]], "row_labels": ["a", "b"]}, "/row_labels"),
    ({"weights": [[0.5, 0.5]], "col_labels": ["a"]}, "/col_labels"),
    ({"weights": [[0.5]], "col_labels": [1]}, "/col_labels/0"),
    ({"weights": [[0.5, 0.5]], "col_labels": ["a", "x" * 201]}, "/col_labels/1"),
    ({"weights": [[0.5]], "title": "x" * 201}, "/title"),
    ({"weights": [[0.5]], "decimals": 7}, "/decimals"),
    ({"weights": [[0.5]], "annotate": "yes"}, "/annotate"),
    ({"row_labels": ["a"]}, "/weights"),
    ({"weights": [[0.5, 0.5]], "mask": [True, False, True]}, "/mask"),
    ({"weights": [[0.5, 0.5]], "mask": [[True, "no"]]}, "/mask/0/1"),
    ({"weights": [[1.0, 0.0], [0.3, 0.7]], "mask": [True, False]}, "/weights/1/1"),  # a masked cell weighs 0
    ({"weights": [[0.5]], "color_scale": "log"}, "/color_scale"),
])
def test_heatmap_refuses_invalid_requests(client, body, pointer):
    assert_problem(client.post("/v1/heatmap", json=body), 422, pointer)


def test_heatmap_names_only_the_first_bad_label(client):
    body = assert_problem(client.post("/v1/heatmap", json={"weights": [[0.5]], "row_labels": ["a", 1, None, 2.5]}),
                          422, "/row_labels/1")
    assert [error["pointer"] for error in body["errors"]] == ["/row_labels/1"]


def test_heatmap_refuses_bodies_that_are_not_json(client):
    assert_problem(client.post("/v1/heatmap", data=b"{", content_type="application/json"), 400)
    assert_problem(client.post("/v1/heatmap", data=b"{}", content_type="text/plain"), 415)


def client_with(**limits):
    return app_with(limits=Limits(**limits)).test_client()


def test_max_heatmap_cells_at_and_just_past_the_boundary():
    client = client_with(max_heatmap_cells=50)
    assert client.post("/v1/heatmap", json={"weights": np.full((2, 5, 5), 0.2).tolist()}).status_code == 200
    body = assert_problem(client.post("/v1/heatmap", json={"weights": np.full((2, 5, 6), 0.2).tolist()}), 422,
                          "/weights")
    assert body["limit"] == {"name": "max_heatmap_cells", "maximum": 50, "value": 60}
    assert client.post("/v1/multi-head-attention?format=svg", json={**DEMO_5, "n_heads": 2}).status_code == 200
    body = assert_problem(client.post("/v1/multi-head-attention?format=svg", json=DEMO_5), 422, "format")
    assert body["limit"]["value"] == 100
    assert client.post("/v1/multi-head-attention", json=DEMO_5).status_code == 200  # JSON is not limited by it


@pytest.mark.parametrize(("path", "body", "rows", "titles"), [
    ("/v1/attention", {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [2.0]]}, [], []),
    ("/v1/attention", {"query": [[[1.0]], [[2.0]]], "key": [[[1.0]], [[1.0]]], "value": [[[1.0]], [[1.0]]]},
     [], ["batch 0", "batch 1"]),
    ("/v1/self-attention", {"tokens": ["cat", "ate", "food"], "causal": True}, [], []),
    ("/v1/multi-head-attention", DEMO_5, [], ["head 0", "head 1", "head 2", "head 3"]),
    ("/v1/multi-head-attention", {"embeddings": np.eye(4)[None].repeat(2, 0).tolist(), "n_heads": 2},
     ["batch 0", "batch 1"], ["head 0", "head 1"] * 2),
    ("/v1/encoder", {"tokens": ["cat", "ate"], "d_model": 4, "n_heads": 2, "n_layers": 2},
     ["layer 0", "layer 1"], ["head 0", "head 1"] * 2),
])
def test_format_svg_draws_the_weights_of_the_json_answer(client, path, body, rows, titles):
    answer = client.post(path, json=body).get_json()
    weights = np.stack([layer["weights"] for layer in answer["layers"]]) if "layers" in answer else answer["weights"]
    ignored = {"return_weights": False} if "layers" in answer else {"return_weights": False, "trace": True}
    root = svg_of(client.post(f"{path}?format=svg", json={**body, **ignored}))
    np.testing.assert_array_equal(values(root), np.ravel(weights))
    panel_titles = [t.text for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"
                    for t in g.iter(SVG_NS + "text") if t.get("font-weight")]
    assert panel_titles == titles  # heads along a row, one row per layer and batch item
    assert [t.text for t in root.iter(SVG_NS + "text") if t.get("class") == "row-title"] == rows
    tokens = body.get("tokens")
    if tokens:
        assert hover_titles(root)[1] == f"{tokens[0]} → {tokens[0]}: {float(np.ravel(weights)[0])!r}"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_data_values_are_the_text_of_the_json_answer(client, dtype):
    """float32 answers are written with float32's own shortest digits: so are the cells' data-value."""
    body = {"query": [[1.0, 2.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [3.0]], "dtype": dtype}
    text = client.post("/v1/attention", json=body).get_data(as_text=True)
    written = re.search(r'"weights":\[\[([^\]]*)\]\]', text).group(1).split(",")
    root = svg_of(client.post("/v1/attention?format=svg", json=body))
    assert [cell.get("data-value") for cell in cells(root)] == written


def test_format_json_is_the_default_and_other_formats_are_refused(client):
    body = {"tokens": ["cat", "it"]}
    assert client.post("/v1/self-attention?format=json", json=body).get_json() == \
        client.post("/v1/self-attention", json=body).get_json()
    assert_problem(client.post("/v1/self-attention?format=png", json=body), 422, "format")
    assert_problem(client.post("/v1/self-attention?format=svg&color_scale=log", json=body), 422, "color_scale")
    assert_problem(client.post("/v1/self-attention?format=svg", json={"tokens": ["dog"]}), 422, "/tokens/0")


@pytest.mark.parametrize("name", ["lookup", "causal-mask", "multi-head"])
def test_demo_heatmaps_show_the_demo_weights(client, name):
    result = client.get(f"/v1/demos/{name}").get_json()["result"]
    root = svg_of(client.get(f"/v1/demos/{name}/heatmap"))
    np.testing.assert_array_equal(values(root), np.ravel(result["weights"]))
    assert result["tokens"][-1] in hover_titles(root)[-1]


@pytest.mark.parametrize(("name", "says"), [("scaling", "lookup, causal-mask, multi-head"),
                                            ("positional-encoding", "lookup, causal-mask, multi-head"),
                                            ("nope", "the demos are lookup, scaling")])
def test_demos_without_weights_have_no_heatmap(client, name, says):
    assert says in assert_problem(client.get(f"/v1/demos/{name}/heatmap"), 404)["detail"]


@pytest.mark.parametrize("path", ["/v1/attention", "/v1/self-attention", "/v1/multi-head-attention", "/v1/encoder"])
def test_the_picture_is_documented_as_a_second_answer_and_as_its_own_operation(client, path):
    """Not as ``format``: a generated client reads one media type per answer (JSON here), and would fail on SVG."""
    spec = client.get("/openapi.json").get_json()["paths"]
    operation = spec[path]["post"]
    assert "format" not in [p["name"] for p in operation.get("parameters", [])]
    assert list(operation["responses"]["200"]["content"]) == ["application/json", "image/svg+xml"]
    assert list(spec[path + "/heatmap"]["post"]["responses"]["200"]["content"]) == ["image/svg+xml"]
