"""Content negotiation on every compute operation: the Accept header (or ``?format``) chooses JSON or the heatmap,
406 lists what an operation answers, and ``<path>/heatmap`` answers the picture alone."""

from __future__ import annotations

import pytest

from service.edge.v1 import examples
from service.operations.registry import OPERATIONS
from tests.close import assert_text_close
from tests.conftest import assert_problem
from tests.unit.edge.test_openapi import SPEC, validator

JSON, SVG = "application/json", "image/svg+xml"
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"  # Chromium's for a navigation
DRAWN = [name for name, operation in OPERATIONS.items() if operation.drawing is not None]


def url(name: str, suffix: str = "") -> str:
    """The operation's path, its model the documented example's."""
    return "/v1" + OPERATIONS[name].route.replace("<model>", "{model}").format(**OPERATIONS[name].path_example) + suffix


def call(client, name: str, suffix: str = "", accept: str | None = None, query: str = "", body=None):
    """``name``'s documented request, with this Accept header (None: none) and query string."""
    headers = {} if accept is None else {"Accept": accept}
    if OPERATIONS[name].method == "GET":
        return client.get(url(name, suffix), query_string={**examples.request(name)}, headers=headers)
    return client.post(url(name, suffix) + query, json=examples.request(name) if body is None else body,
                       headers=headers)


@pytest.mark.parametrize(("accept", "answered"), [
    (None, JSON), ("", JSON), ("*/*", JSON), (JSON, JSON), ("application/*", JSON), (BROWSER, JSON),
    (SVG, SVG), ("image/*", SVG), (f"{SVG};q=0.9, {JSON};q=0.5", SVG), (f"{JSON};q=0, */*", SVG),
    (f"{SVG}, {JSON}", JSON),  # equal quality: the server's preference, JSON (a generator may send every type)
    (f"*/*, {SVG};q=0", JSON),  # the most specific range decides: SVG refused, JSON by the wildcard
    (f"{JSON};q=oops", JSON),  # unreadable: as if absent
    (f"{JSON}; charset=utf-8", JSON), (f"{JSON};charset=UTF-8", JSON),  # parameters do not rule an answer out
    (f"{SVG}; charset=utf-8", SVG), (f"{JSON}; charset=utf-8; q=0.4, {SVG};q=0.5", SVG),
])
def test_accept_chooses_json_or_the_heatmap(client, accept, answered):
    response = call(client, "multi-head-attention", accept=accept)
    assert response.status_code == 200 and response.mimetype == answered
    assert response.vary.as_set() == {"accept"}
    same = call(client, "multi-head-attention", query="?format=svg" if answered == SVG else "")
    assert response.get_data() == same.get_data()  # the very answer of ?format=svg, or of no Accept at all


@pytest.mark.parametrize("accept", ["text/html", "application/problem+json", "image/png", "*/*;q=0",
                                    f"{JSON};q=0, {SVG};q=0", f"{SVG}; charset=latin-1"])
@pytest.mark.parametrize("name", list(OPERATIONS))
def test_an_accept_an_operation_cannot_answer_is_a_406_listing_what_it_can(client, name, accept):
    body = assert_problem(call(client, name, accept=accept), 406)
    acceptable = [JSON, SVG] if OPERATIONS[name].drawing is not None else [JSON]
    assert body["acceptable"] == acceptable
    assert body["errors"] == [{"header": "Accept", "detail": body["detail"]}]
    assert repr(accept) in body["detail"] and ", ".join(acceptable) in body["detail"]
    path = SPEC["paths"]["/v1" + OPERATIONS[name].route.replace("<", "{").replace(">", "}")]
    documented = path[OPERATIONS[name].method.lower()]
    assert documented["responses"]["406"] == {"$ref": "#/components/responses/NotAcceptable"}
    problem = SPEC["components"]["responses"]["NotAcceptable"]["content"]["application/problem+json"]["schema"]
    validator(problem).validate(body)  # acceptable and the header item are declared members


def test_the_406_comes_before_the_body_is_read_and_varies_by_accept(client):
    invalid = {"query": [[True]], "key": [[1.0]], "value": [[1.0]]}
    response = call(client, "attention", accept="text/html", body=invalid)
    assert_problem(response, 406)
    assert response.headers["Vary"] == "Accept"
    assert_problem(call(client, "attention", accept="image/*", body=invalid), 422, "/query/0/0")


@pytest.mark.parametrize(("query", "accept", "answered"), [
    ("?format=svg", None, SVG), ("?format=svg", "*/*", SVG), ("?format=svg", "image/*", SVG),
    ("?format=json", SVG, None), ("?format=svg", JSON, None), ("?format=json", BROWSER, JSON),
])
def test_format_narrows_the_offers_to_the_one_it_names(client, query, accept, answered):
    response = call(client, "attention", query=query, accept=accept)
    if answered is None:
        format_type = SVG if "svg" in query else JSON
        assert assert_problem(response, 406)["acceptable"] == [format_type]
    else:
        assert response.status_code == 200 and response.mimetype == answered


@pytest.mark.parametrize("name", DRAWN)
def test_every_drawing_operation_answers_its_heatmap_at_its_own_path(client, name):
    negotiated = call(client, name, accept=SVG)
    picture = call(client, name, "/heatmap")
    assert picture.status_code == 200 and picture.mimetype == SVG and picture.vary.as_set() == {"accept"}
    assert picture.get_data() == negotiated.get_data()
    documented = SPEC["paths"]["/v1" + OPERATIONS[name].route.replace("<model>", "{model}") + "/heatmap"]["post"]
    assert_text_close(picture.get_data(as_text=True), documented["responses"]["200"]["content"][SVG]["example"])
    assert assert_problem(call(client, name, "/heatmap", accept=JSON), 406)["acceptable"] == [SVG]
    assert_problem(call(client, name, "/heatmap", body={"tokens": 5}), 422)


def test_non_drawing_operations_have_no_heatmap_path(client):
    assert client.post("/v1/embed/heatmap", json=examples.request("embed")).status_code == 404


@pytest.mark.parametrize(("method", "path", "body", "acceptable"), [
    ("POST", "/v1/batch", examples.request("batch"), [JSON]),
    ("POST", "/v1/heatmap", {"weights": [[1.0]]}, [SVG]),
    ("GET", "/v1/demos/lookup/heatmap", None, [SVG]),
])
def test_the_batch_and_picture_routes_answer_their_one_type_or_406(client, method, path, body, acceptable):
    ask = client.post if method == "POST" else client.get
    [media] = acceptable
    answered = ask(path, json=body, headers={"Accept": f"{media}; charset=utf-8"})
    assert answered.status_code == 200 and answered.mimetype == media and answered.vary.as_set() == {"accept"}
    refused = assert_problem(ask(path, json=body, headers={"Accept": "text/html"}), 406)
    assert refused["acceptable"] == acceptable
