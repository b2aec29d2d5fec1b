"""GET /, /docs and /favicon.ico: the pages and every asset they link are served by the service itself."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from urllib.parse import urljoin

import pytest

from service.settings import Access
from tests.conftest import app_with

LINKS = re.compile(r'(?:src|href)="([^"#]+)"')


@pytest.mark.parametrize(("page", "needs"), [
    ("/", ["static/playground.js", "static/generate.js", "static/readings.js", "static/interventions.js",
           "static/playground.css", "static/favicon.svg", "docs", "openapi.yaml"]),
    ("/docs", ["docs/assets/swagger-ui-bundle.js", "docs/assets/swagger-ui.css", "static/docs.js",
               "static/favicon.svg"]),
])
def test_pages_link_only_local_assets_that_exist(client, page, needs):
    response = client.get(page)
    assert response.status_code == 200 and response.mimetype == "text/html"
    links = LINKS.findall(response.get_data(as_text=True))
    assert set(needs) <= set(links)
    for link in links:
        assert "//" not in link, f"{link} is not served by the service (offline)"
        assert client.get(urljoin(page, link)).status_code == 200, link


def test_docs_script_points_swagger_ui_at_the_relative_spec_and_no_validator(client):
    script = client.get("/static/docs.js").get_data(as_text=True)
    assert 'url: "openapi.json"' in script and "validatorUrl: null" in script


def test_favicon_is_an_svg_icon(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200 and response.mimetype == "image/svg+xml"
    assert ET.fromstring(response.data).get("viewBox") == "0 0 32 32"


def test_unknown_assets_are_problem_404s(client):
    for path in ("/docs/assets/nope.js", "/docs/assets/../__init__.py", "/static/nope.css"):
        response = client.get(path)
        assert response.status_code == 404 and response.mimetype == "application/problem+json"


@pytest.mark.parametrize(("keys", "says"), [((), "off"), (("k1", "k2"), "on")])
def test_the_docs_page_says_whether_the_server_asks_for_api_keys(keys, says):
    """static/docs.js shows the spec's key locks only when it says on (tests/live/test_browser.py)."""
    response = app_with(access=Access(api_keys=keys)).test_client().get("/docs")  # open, keys or not
    assert response.status_code == 200 and response.mimetype == "text/html"
    assert re.findall(r'<meta name="api-keys" content="(\w+)">', response.get_data(as_text=True)) == [says]
