"""The real-model mode's interventions in a real headless Chromium against the real gunicorn: the knockout table
under the model view and the occlusion bars under the word pieces hold the numbers of POST .../explain for the same
text, a knockout cell chooses its head in the model view, and a refused request shows the API's reason; for MiniLM
and for the decoder (a few heads, a short prompt)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.live.conftest import gunicorn_server
from tests.live.test_browser import (
    SHOWN_HEAD,
    browser,  # noqa: F401 (the module's headless Chromium, a fixture)
    choose,
    console_errors,
    open_real_mode,
    run_model,
    wait_for,
)

ENCODER, DECODER = "all-minilm-l6-v2", "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def live() -> Iterator[str]:
    """The real gunicorn serving both models, the encoder first (the real mode's default)."""
    with gunicorn_server(WEB_CONCURRENCY="1", ATTENTION_MODELS=f"{ENCODER},{DECODER}", LOG_REQUESTS="0") as url:
        yield url


@pytest.fixture
def page(browser: Any, live: str) -> Any:  # noqa: F811 (the imported fixture, asked for)
    """The playground opened on the server, switched to the real mode, its models listed."""
    open_real_mode(browser, live)
    return browser


def explain(url: str, model: str, text: str, method: str, **options: Any) -> dict[str, Any]:
    """The API's answer to what the page asks for the same text: one method, full precision."""
    response = requests.post(f"{url}/v1/models/{model}/explain", json={"text": text, "methods": [method], **options},
                             timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


# The knockout table as drawn: a row per layer, a cell per head, a button's exact value or null (not knocked out).
TABLE = """const t = document.querySelector('#knockout-out table[data-name=knockout]');
    return t && !document.querySelector('#knockout').hidden && !document.querySelector('#knockout[aria-busy]') &&
    [...t.querySelectorAll('tbody tr')].map(tr => [...tr.querySelectorAll('td')].map(td => {
        const b = td.querySelector('button.knock'); return b ? Number(b.dataset.value) : null; }));"""
BARS = """const o = document.querySelector('#occlusion-out ol.occlusion');
    return o && !document.querySelector('#occlusion').hidden && [...o.querySelectorAll('li')].map(li =>
        [Number(li.dataset.position), Number(li.dataset.value), li.querySelector('code').textContent,
         li.classList.contains('changed')]);"""
# Before the toggle is clicked: each status's text whenever it shows a progress bar (the busy state).
WATCH_BUSY = """window.busy = [];
for (const id of ['#knockout-status', '#occlusion-status']) new MutationObserver(() => {
    const s = document.querySelector(id); if (s.querySelector('progress')) window.busy.push(s.textContent);
}).observe(document.querySelector(id), {childList: true, subtree: true});"""


def intervene(driver: Any) -> None:
    driver.execute_script(WATCH_BUSY)
    driver.find_element("css selector", "#intervene").click()


def test_knockout_table_and_occlusion_bars_hold_the_api_s_numbers(page, live):
    text = "the cat sat on the mat"
    run_model(page, text)
    assert not page.find_element("css selector", "#knockout").is_displayed()  # asked for on demand only
    assert not page.find_element("css selector", "#occlusion").is_displayed()
    intervene(page)
    table = wait_for(page, TABLE)
    knockout = explain(live, ENCODER, text, "knockout")
    assert len(table) * len(table[0]) == 6 * 12
    assert table == knockout["knockout"]["cosine_distance"]  # exact: the same server, the same text
    bars = wait_for(page, BARS)
    occlusion = explain(live, ENCODER, text, "occlusion")
    tokens = occlusion["tokens"]
    assert [position for position, *_ in bars] == occlusion["occlusion"]["positions"] == list(range(1, len(tokens) - 1))
    assert [value for _, value, *_ in bars] == occlusion["occlusion"]["cosine_distance"]
    assert [label for _, _, label, _ in bars] == [tokens[p] for p in occlusion["occlusion"]["positions"]]
    busy = page.execute_script("return window.busy")
    assert any(said.startswith("Knocking out every head in turn") for said in busy), busy
    assert any(said.startswith("Occluding each word piece") for said in busy), busy
    title = page.find_element("css selector", "#knockout-out button[data-layer='5'][data-head='11']")\
        .get_attribute("title")
    assert f"cosine distance {knockout['knockout']['cosine_distance'][5][11]}" in title
    assert console_errors(page) == []


def test_a_knockout_cell_chooses_its_head_in_the_model_view_by_mouse_or_keyboard(page, live):
    from selenium.webdriver.common.keys import Keys

    run_model(page, "The dog ate.")
    intervene(page)
    wait_for(page, TABLE)
    page.find_element("css selector", "#knockout-out button[data-layer='4'][data-head='7']").click()
    wait_for(page, SHOWN_HEAD, "4", "7")
    assert page.find_element("css selector", "#layer").get_attribute("value") == "4"
    assert page.find_element("css selector", "#head").get_attribute("value") == "7"
    pressed = """return [...document.querySelectorAll(arguments[0] + ' [aria-pressed=true]')]
        .map(b => [b.dataset.layer, b.dataset.head])"""
    assert page.execute_script(pressed, "#model-view") == [["4", "7"]]
    assert page.execute_script(pressed, "#knockout-out") == [["4", "7"]]
    page.find_element("css selector", "#knockout-out button[data-layer='1'][data-head='2']").send_keys(Keys.ENTER)
    wait_for(page, SHOWN_HEAD, "1", "2")
    assert page.execute_script(pressed, "#knockout-out") == [["1", "2"]]
    page.find_element("css selector", "#intervene").click()           # off: nothing of them stays
    assert not page.find_element("css selector", "#knockout").is_displayed()
    assert not page.find_element("css selector", "#occlusion").is_displayed()
    assert page.execute_script("return document.querySelectorAll('#knockout-out *, #occlusion-out *').length") == 0
    assert console_errors(page) == []


def choose_value(driver: Any, selector: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("css selector", selector)).select_by_value(value)


def test_the_decoder_s_chosen_layer_knockout_and_occlusion_hold_the_api_s_numbers(page, live):
    text = "The dog ate"
    choose_value(page, "#model", DECODER)
    run_model(page, text)
    choose_value(page, "#knock-scope", "layer")
    choose(page, "#layer", 2)
    intervene(page)
    table = wait_for(page, TABLE)
    knockout = explain(live, DECODER, text, "knockout", knock=[[2, head] for head in range(9)])["knockout"]
    assert (len(table), len(table[0])) == (30, 9)
    assert table == knockout["kl"]  # null but in layer 2
    assert all(value is None for layer, row in enumerate(table) for value in row if layer != 2)
    caption = page.find_element("css selector", "#knockout-out caption").text
    assert "KL divergence" in caption and knockout["next_token"]["token"].replace(" ", "␣") in caption
    bars = wait_for(page, BARS)
    occlusion = explain(live, DECODER, text, "occlusion")
    assert [[p, v, t.replace("␣", " "), c] for p, v, t, c in bars] == [
        [p, v, occlusion["tokens"][p], c] for p, v, c in zip(occlusion["occlusion"]["positions"],
                                                           occlusion["occlusion"]["kl"],
                                                           occlusion["occlusion"]["top_changed"], strict=True)]
    page.find_element("css selector", "#model-view button[data-layer='7'][data-head='0']").click()
    # The chosen layer's heads follow the model view: layer 7's, asked for anew.
    table = wait_for(page, "const t = (() => {" + TABLE + "})(); return t && t[7][0] !== null && t;")
    assert table == explain(live, DECODER, text, "knockout", knock=[[7, head] for head in range(9)])["knockout"]["kl"]
    assert console_errors(page) == []


def test_a_refused_knockout_shows_the_api_s_reason_and_the_occlusion_still_draws(page, live):
    text = "the dog ate the food " * 10                     # 51 tokens: every head's knockout past max_rerun_tokens
    refused = requests.post(f"{live}/v1/models/{DECODER}/explain", json={"text": text, "methods": ["knockout"]},
                            timeout=30)
    assert refused.status_code == 422 and refused.headers["Content-Type"] == "application/problem+json"
    choose_value(page, "#model", DECODER)
    run_model(page, text)
    intervene(page)
    error = wait_for(page, "const e = document.querySelector('#knockout-out .error'); return e && e.textContent")
    for each in refused.json()["errors"]:                   # each of the API's reasons, where it points
        assert f"{each['pointer']}: {each['detail']}" in error
    assert "max_rerun_tokens" in error and "/knock" in error
    assert page.find_element("css selector", "#knockout-status").text == "No knockout for this input."
    bars = wait_for(page, BARS)
    assert len(bars) == 50                                  # every token but the last, which predicts
    assert [e for e in console_errors(page) if "422" not in e["message"]] == []  # the refused knockout only
