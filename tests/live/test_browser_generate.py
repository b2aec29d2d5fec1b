"""The playground's generate mode in a real headless Chromium against the real gunicorn serving the decoder: the
tokens appear as they stream, a clicked token shows its attention row in every layer and head (grouped by key/value
head) with the API's numbers, its candidates and its logit lens; a refused request says why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests

from tests.live.conftest import gunicorn_server
from tests.live.test_browser import (
    browser,  # noqa: F401 (the module's headless Chromium, a fixture)
    console_errors,
    open_playground,
    set_checkbox,
    set_field,
    wait_for,
)

MODEL = "smollm2-135m-instruct"
LAYERS, HEADS, KV_HEADS = 30, 9, 3
PROMPT = "The animal didn't cross the street because it"
GENERATION = 120  # seconds for a whole generation (30 layers x 9 heads of rows each step, one shared worker)


@pytest.fixture(scope="module")
def live() -> Iterator[str]:
    """The real gunicorn serving the decoder (the live servers serve MiniLM alone by default)."""
    with gunicorn_server(WEB_CONCURRENCY="1", ATTENTION_MODELS=MODEL, LOG_REQUESTS="0") as url:
        yield url


@pytest.fixture
def page(browser: Any, live: str) -> Any:  # noqa: F811 (the imported fixture, asked for)
    """The playground opened on the server, switched to the generate mode, its decoder listed."""
    open_playground(browser, live)
    browser.find_element("css selector", "#mode-generate").click()
    wait_for(browser, "return document.querySelector('#gen-model').value === arguments[0] && "
                      "document.querySelector('#gen-model-info').textContent", MODEL)
    return browser


# Before Generate is clicked: the count of generated tokens at each change of the token list, with its time, the
# time the prompt's tokens (their own first event) appeared, and the time the status said Done (the done event).
WATCH = """window.seen = []; window.promptAt = null; window.doneAt = null;
new MutationObserver(() => window.seen.push([document.querySelectorAll('#gen-new-tokens button').length,
    performance.now()])).observe(document.querySelector('#gen-new-tokens'), {childList: true});
new MutationObserver(() => { window.promptAt = window.promptAt ?? performance.now(); })
    .observe(document.querySelector('#gen-prompt-tokens'), {childList: true});
new MutationObserver(() => { if (document.querySelector('#gen-status').textContent.startsWith('Done'))
    window.doneAt = window.doneAt ?? performance.now(); })
    .observe(document.querySelector('#gen-status'), {childList: true, characterData: true, subtree: true});"""
DONE = "return document.querySelector('#gen-status').textContent.startsWith('Done') && window.doneAt !== null"


def generate(driver: Any, *, tokens: int, lens: bool = False, chat: bool = False, text: str = PROMPT) -> None:
    """Generate from the form (greedy, as the page opens) and wait for the done event."""
    driver.find_element("css selector", "#gen-as-chat" if chat else "#gen-as-prompt").click()
    set_field(driver, "#gen-text", text)
    set_field(driver, "#gen-max-new-tokens", str(tokens))
    set_checkbox(driver, "#gen-lens", lens)
    driver.execute_script(WATCH)
    driver.find_element("css selector", "#run-generate").click()
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, GENERATION).until(lambda d: d.execute_script(DONE))


def api_generation(url: str, tokens: int, **extra: Any) -> dict[str, Any]:
    """The same generation through the JSON API: every layer's rows, greedy."""
    body = {"prompt": PROMPT, "max_new_tokens": tokens, "layers": list(range(LAYERS)), **extra}
    response = requests.post(f"{url}/v1/models/{MODEL}/generate", json=body, timeout=GENERATION)
    assert response.status_code == 200, response.text
    return response.json()


STRIPS = """return [...document.querySelectorAll('#gen-view .strip')].map(s => ({layer: Number(s.dataset.layer),
    head: Number(s.dataset.head), kv: Number(s.dataset.kv), first: s.classList.contains('kv-first'),
    width: s.querySelector('canvas').width, weights: JSON.parse(s.dataset.weights)}));"""


def shown_rows(driver: Any) -> tuple[list[dict], np.ndarray]:
    """The model view's strips, and their weights as (layers, heads, keys)."""
    strips = driver.execute_script(STRIPS)
    assert [(s["layer"], s["head"]) for s in strips] == [(layer, head) for layer in range(LAYERS)
                                                         for head in range(HEADS)]
    return strips, np.asarray([s["weights"] for s in strips]).reshape(LAYERS, HEADS, -1)


def click_token(driver: Any, kind: str, index: int, keys: int | None) -> tuple[list[dict], np.ndarray]:
    """Click a token; its model view once drawn (with ``keys`` keys, when given)."""
    driver.find_element("css selector", f"#gen-results button.token[data-kind={kind}][data-index='{index}']").click()
    wait_for(driver, "const s = document.querySelectorAll('#gen-view .strip'); return s.length === 270 && "
                     "(arguments[0] === null || s[0].querySelector('canvas').width === arguments[0])", keys)
    return shown_rows(driver)


def test_tokens_appear_as_they_stream_before_the_done_event(page, live):
    generate(page, tokens=24)
    seen, prompt_at, done_at = page.execute_script("return [window.seen, window.promptAt, window.doneAt]")
    counts = [count for count, _ in seen]
    assert counts == list(range(1, 25)), counts                # one token at a time, each added as its event came
    first_at = seen[0][1]
    assert prompt_at < first_at < seen[-1][1] <= done_at       # the prompt first; the first token well before the last
    assert done_at - first_at > 200, (first_at, done_at)       # 23 more steps of 30 layers: not one burst
    answer = api_generation(live, 24)
    shown = page.execute_script("return [...document.querySelectorAll('#gen-new-tokens button')]"
                                   ".map(b => b.textContent)")
    assert shown == [step["token"].replace(" ", "␣").replace("\n", "↵") for step in answer["steps"]]
    prompt = page.execute_script("return [...document.querySelectorAll('#gen-prompt-tokens button')]"
                                    ".map(b => b.textContent)")
    assert prompt == [token.replace(" ", "␣") for token in answer["tokens"]]
    assert console_errors(page) == []


def test_a_generated_token_shows_its_row_in_every_layer_and_head_with_the_api_numbers(page, live):
    generate(page, tokens=6)
    answer = api_generation(live, 6)
    n = len(answer["tokens"])
    strips, rows = click_token(page, "generated", 3, n + 4)     # the 4th new token: n + 3 earlier keys, itself
    expected = np.asarray([layer["weights"] for layer in answer["steps"][3]["attention"]])  # (30, 9, n + 4)
    np.testing.assert_allclose(rows, expected, rtol=1e-6, atol=1e-7)  # the API's float32 rows, as the page got them
    np.testing.assert_allclose(rows.sum(axis=-1), 1, rtol=1e-5)
    # Query heads 3g, 3g+1, 3g+2 share key/value head g: grouped, each group's first head starting a frame.
    assert [(s["kv"], s["first"]) for s in strips[:HEADS]] == [(h // 3, h % 3 == 0) for h in range(HEADS)]
    groups = page.execute_script("return [...document.querySelectorAll('#gen-view .kv-group')]"
                                    ".map(g => [Number(g.dataset.kv), g.textContent])")
    assert groups == [[g, f"key/value head {g}: heads {3 * g}–{3 * g + 2}"] for g in range(KV_HEADS)]
    assert "Generated token 3" in page.find_element("css selector", "#gen-token-heading").text
    assert console_errors(page) == []


CANDIDATES = """return [...document.querySelectorAll('#gen-candidates li')].map(li => ({id: Number(li.dataset.id),
    p: Number(li.dataset.probability), drawn: Number(li.dataset.drawn), chosen: li.classList.contains('chosen'),
    bars: [...li.querySelectorAll('.bar')].map(b => parseFloat(b.style.width))}));"""
LENS = """const t = document.querySelector('#gen-lens-out table');
    return t && {rows: [...t.querySelectorAll('tbody th')].map(th => th.textContent),
                 cells: [...t.querySelectorAll('tbody tr')].map(tr => [...tr.querySelectorAll('td')]
                     .map(td => td.textContent))};"""


def test_a_step_shows_its_candidates_as_bars_and_its_logit_lens(page, live):
    generate(page, tokens=3, lens=True)
    step = api_generation(live, 3, logit_lens=True)["steps"][1]
    click_token(page, "generated", 1, None)
    shown = page.execute_script(CANDIDATES)
    assert [c["id"] for c in shown] == [c["id"] for c in step["top"]]             # the API's 5, likeliest first
    for candidate, expected in zip(shown, step["top"], strict=True):
        p = np.exp(expected["logprob"])
        assert candidate["p"] == pytest.approx(p, rel=1e-9)                      # before the filters
        assert candidate["drawn"] == expected["drawn"]                           # after them (greedy: 1 or 0)
        assert candidate["bars"] == pytest.approx([round(100 * p, 1), round(100 * expected["drawn"], 1)])
        assert candidate["chosen"] == (expected["id"] == step["id"])
    assert sum(c["chosen"] for c in shown) == 1
    lens = page.execute_script(LENS)
    assert lens["rows"] == [str(depth) for depth in range(LAYERS + 1)]           # the embeddings, then each layer
    assert lens["cells"] == [[f"{t['token'].replace(' ', '␣').replace(chr(10), '↵')} {np.exp(t['logprob']):.3f}"
                              for t in layer["top"]] for layer in step["logit_lens"]]
    assert console_errors(page) == []


def test_a_prompt_token_shows_its_row_from_the_attention_endpoint(page, live):
    generate(page, tokens=2, chat=True)
    body = {"messages": [{"role": "user", "content": PROMPT}]}
    answer = requests.post(f"{live}/v1/models/{MODEL}/attention", json=body, timeout=GENERATION).json()
    i = len(answer["tokens"]) - 3                                                # "ass" of the assistant's turn
    _, rows = click_token(page, "prompt", i, i + 1)
    expected = np.asarray([layer["weights"] for layer in answer["layers"]])[:, :, i, :i + 1]
    np.testing.assert_array_equal(rows, expected)                                # the same request's numbers
    assert "has no candidates" in page.find_element("css selector", "#gen-candidates").text
    assert page.execute_script("return document.querySelector('#gen-lens-out table')") is None
    assert console_errors(page) == []


def test_a_refused_request_shows_the_server_s_problem(page, live):
    set_field(page, "#gen-max-new-tokens", "200")            # 270 rows a step over 200 steps: past the limit
    page.find_element("css selector", "#run-generate").click()
    error = wait_for(page, "const e = document.querySelector('#gen-error'); return !e.hidden && e.textContent")
    limit = requests.get(f"{live}/v1/limits", timeout=10).json()["max_weight_elements"]
    assert error.splitlines()[0].startswith("/layers: ") and f"max_weight_elements={limit}" in error
    assert "/max_new_tokens: Select fewer" in error
    assert page.find_element("css selector", "#gen-status").text == "The API refused the request."
    assert not page.find_element("css selector", "#gen-results").is_displayed()
    assert [e for e in console_errors(page) if "422" not in e["message"]] == []  # the refused request only


def test_a_64_bit_seed_travels_exactly_and_draws_what_the_api_draws(page, live):
    """Past 2^53 a JavaScript number would change a seed's last digits: the page sends and shows its digits."""
    seed = 2**63 - 1 - 1000                                      # schemas.fields.MAX_SEED
    set_field(page, "#gen-temperature", "1.2")
    set_field(page, "#gen-seed", str(seed))
    generate(page, tokens=5)
    status = page.find_element("css selector", "#gen-status").text
    assert status.endswith(f"seed {seed}."), status
    answer = api_generation(live, 5, temperature=1.2, seed=seed)
    shown = page.execute_script("return [...document.querySelectorAll('#gen-new-tokens button')]"
                                   ".map(b => Number(b.title.split('id ')[1].split(',')[0]))")
    assert shown == [step["id"] for step in answer["steps"]]      # the same draw: the seed arrived exactly
    set_field(page, "#gen-seed", "1.5")
    page.find_element("css selector", "#run-generate").click()
    error = wait_for(page, "const e = document.querySelector('#gen-error'); return !e.hidden && e.textContent")
    assert error.startswith("/seed: a whole number")
    assert page.find_element("css selector", "#gen-status").text == "Nothing sent (see below)."
    assert console_errors(page) == []


# The page's fetch of generate replaced by a stream of ``arguments[0]`` cut into 7-character chunks (events split
# anywhere, as TCP may split them); every other request goes to the server.
FAKE_STREAM = """const [text, realFetch] = [arguments[0], window.fetch];
window.fetch = (url, options) => {
  if (!String(url).includes('/generate')) return realFetch(url, options);
  const bytes = new TextEncoder().encode(text);
  const body = new ReadableStream({start(controller) {
    for (let i = 0; i < bytes.length; i += 7) controller.enqueue(bytes.slice(i, i + 7));
    controller.close();
  }});
  return Promise.resolve(new Response(body, {headers: {'Content-Type': 'text/event-stream'}}));
};"""


def test_an_error_event_midway_is_shown_and_the_tokens_before_it_stay(page, live):
    """A failure after the status line is an ``event: error`` with a problem (the service's own event format)."""
    answer = api_generation(live, 1)
    step, prompt = answer["steps"][0], {"tokens": answer["tokens"], "token_ids": answer["token_ids"]}
    problem = {"type": "about:blank", "title": "Internal Server Error", "status": 500,
               "detail": "The server failed to finish this generation; this is a bug."}
    text = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in
                   [("prompt", prompt), ("token", step), ("token", {**step, "index": 1}), ("error", problem)])
    page.execute_script(FAKE_STREAM, text)
    page.find_element("css selector", "#run-generate").click()
    error = wait_for(page, "const e = document.querySelector('#gen-error'); return !e.hidden && e.textContent")
    assert error == problem["detail"]
    assert page.find_element("css selector", "#gen-status").text == "The generation stopped midway (see below)."
    assert page.execute_script("return document.querySelectorAll('#gen-new-tokens button').length") == 2
    assert wait_for(page, PROMPT_TOKENS) == prompt_tokens(live)  # no done event: the prompt event named them
    assert console_errors(page) == []


PROMPT_TOKENS = """const b = [...document.querySelectorAll('#gen-prompt-tokens button')];
    return b.length > 0 && b.map(button => button.textContent);"""


def prompt_tokens(url: str) -> list[str]:
    """The prompt's tokens as the page shows them (whitespace made visible)."""
    answer = requests.post(f"{url}/v1/models/{MODEL}/attention", json={"text": PROMPT}, timeout=GENERATION).json()
    return [token.replace(" ", "␣") for token in answer["tokens"]]


def test_stop_ends_the_stream_and_the_prompt_tokens_still_come(page, live):
    set_field(page, "#gen-text", PROMPT)
    set_field(page, "#gen-max-new-tokens", "24")
    set_checkbox(page, "#gen-lens", True)                       # ~7 steps' compute a token: time to press Stop
    page.find_element("css selector", "#run-generate").click()
    wait_for(page, "return document.querySelectorAll('#gen-new-tokens button').length >= 1")
    page.find_element("css selector", "#stop-generate").click()
    status = wait_for(page, "const s = document.querySelector('#gen-status').textContent;"
                            "return s.startsWith('Stopped') && s")
    shown = page.execute_script("return document.querySelectorAll('#gen-new-tokens button').length")
    assert status == f"Stopped after {shown} tokens." and shown < 24
    assert wait_for(page, PROMPT_TOKENS) == prompt_tokens(live)
    assert page.find_element("css selector", "#gen-error").is_displayed() is False
    assert page.find_element("css selector", "#run-generate").is_enabled()
    assert console_errors(page) == []


def test_generate_mode_fits_a_phone(page, live):
    page.set_window_size(390, 844)
    try:
        generate(page, tokens=4)
        click_token(page, "generated", 3, None)
        width = page.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"the page scrolls sideways at phone width: {width}"
    finally:
        page.set_window_size(1280, 1000)


def test_a_prompt_too_long_for_its_attention_says_so_when_a_prompt_token_is_clicked(page, live):
    """Every layer and head of a 100-token prompt's (n, n) weights pass max_weight_elements (270 x 100^2); the
    generation's own rows (a few steps) do not."""
    generate(page, tokens=2, text="one two three four five " * 20)
    page.find_element("css selector", "#gen-prompt-tokens button[data-index='5']").click()
    shown = wait_for(page, "const e = document.querySelector('#gen-view .error'); return e && e.textContent")
    assert shown.startswith("The prompt's attention (POST …/attention, every layer and head) was refused:\n/layers: ")
    assert "max_weight_elements" in shown
    assert [e for e in console_errors(page) if "422" not in e["message"]] == []  # the refused request only
