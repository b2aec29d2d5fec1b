"""The pages in a real headless Chromium (Debian's chromium + chromedriver) against the real gunicorn.

Skipped, saying why, when no browser is installed; in CI (servers.in_ci) a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import yaml

from tests.harness import ROOT, in_ci
from tests.live.conftest import gunicorn_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SPEC = yaml.safe_load((ROOT / "openapi.yaml").read_text())
DEMO_5 = {"tokens": ["the", "cat", "ate", "food", "it"], "d_model": 8, "n_heads": 4, "causal": True,
          "positional_encoding": True}
WAIT = 20  # seconds for the page to call the API and draw
# This closed network refuses Chromium's background connections: keep it from trying.
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                  "--no-first-run", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-extensions", "--disable-default-apps")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[test]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not found (apt-get install -y --no-install-recommends chromium chromium-driver)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium driven through chromedriver, logging the console."""
    missing = _missing()
    if missing:
        if in_ci():
            pytest.fail(f"CI must run the browser tests, but {missing}")
        pytest.skip(f"No headless Chromium for the browser tests: {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.TemporaryDirectory(prefix="chromium-")
    options.add_argument(f"--user-data-dir={profile.name}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        driver.set_window_size(1280, 1000)
        yield driver
    finally:
        driver.quit()
        profile.cleanup()


@pytest.fixture(scope="module")
def live() -> Iterator[str]:
    """The real gunicorn, one worker."""
    with gunicorn_server(WEB_CONCURRENCY="1") as url:
        yield url


def console_errors(driver: Any) -> list[dict]:
    """Console entries logged since the last call that are errors (failed loads included)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(driver: Any, script: str, *args: Any) -> Any:
    """Wait until the JavaScript ``script`` returns something truthy; return it."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT).until(lambda d: d.execute_script(script, *args))


def open_playground(driver: Any, url: str) -> None:
    driver.get(f"{url}/")
    wait_for(driver, "return document.querySelectorAll('#vocabulary button').length === 5 && "
                     "document.querySelectorAll('#demo-list details').length === 5")


def set_field(driver: Any, selector: str, value: str) -> None:
    field = driver.find_element("css selector", selector)
    field.clear()
    field.send_keys(value)


def set_checkbox(driver: Any, selector: str, checked: bool) -> None:
    box = driver.find_element("css selector", selector)
    if box.is_selected() != checked:
        box.send_keys(" ")  # the keyboard, as a user without a mouse would


HEATMAP_VALUES = """return [...document.querySelectorAll(arguments[0])].map(figure =>
    [...figure.querySelectorAll('rect.cell')].map(cell => Number(cell.getAttribute('data-value'))));"""


def test_playground_loads_without_console_errors(browser, live):
    open_playground(browser, live)
    assert browser.title == "Attention playground"
    assert console_errors(browser) == []
    unlabelled = browser.execute_script("""return [...document.querySelectorAll('input, select, textarea')]
        .filter(control => !control.labels || control.labels.length === 0).map(control => control.id);""")
    assert unlabelled == []


def test_demo_5_settings_show_four_heatmaps_with_the_api_numbers(browser, live):
    open_playground(browser, live)
    browser.find_element("css selector", "#source-tokens").click()
    set_field(browser, "#tokens", " ".join(DEMO_5["tokens"]))
    set_field(browser, "#d-model", "8")
    set_field(browser, "#heads", "4")
    set_field(browser, "#seed", "0")
    set_checkbox(browser, "#causal", True)
    set_checkbox(browser, "#positional", True)
    browser.find_element("css selector", "#tokens").submit()  # Enter in a field submits the form
    shown = wait_for(browser, "const f = document.querySelectorAll('#heatmaps figure');"
                              "return f.length === 4 && !document.querySelector('#results').hidden && f.length;")
    assert shown == 4
    # The page asks with trace=true, whose weights may differ from the untraced ones in the last bit.
    traced = requests.post(f"{live}/v1/multi-head-attention", json={**DEMO_5, "trace": True}, timeout=10).json()
    values = browser.execute_script(HEATMAP_VALUES, "#heatmaps figure")
    assert values == [[value for row in head for value in row] for head in traced["weights"]]  # exact, not close
    untraced = requests.post(f"{live}/v1/multi-head-attention", json=DEMO_5, timeout=10).json()["weights"]
    np.testing.assert_allclose(np.reshape(values, (4, 5, 5)), untraced, rtol=1e-13, atol=1e-16)
    steps = browser.execute_script("return [...document.querySelectorAll('#trace > li h3')].map(h => h.textContent)")
    assert steps == ["Input: embeddings + positional encoding", "Q, K and V of head 0", "Raw scores Q·Kᵀ", "Scaled",
                     "Masked", "Softmax weights", "weights·V: head 0's output", "Concatenate the heads",
                     "Mix with W_o: the output"]
    masked = browser.execute_script("return document.querySelectorAll('#trace td.masked').length")
    assert masked == 10  # the upper triangle of a 5 x 5 causal mask, in the "Masked" step
    hatched = browser.execute_script(
        "return [...document.querySelectorAll('#heatmaps figure')].map(f => "
        "[...f.querySelectorAll('rect.cell.masked')].map(r => r.dataset.row + r.dataset.col))")
    assert hatched == [[f"{i}{j}" for i in range(5) for j in range(i + 1, 5)]] * 4  # what the causal mask hid
    assert console_errors(browser) == []


WORKED = """return Object.fromEntries([...document.querySelectorAll('#trace li')].map(li => [li.dataset.step, {
    text: li.querySelector('.worked').textContent,
    lines: [...li.querySelectorAll('.worked .line')].map(line => line.textContent),
    values: [...li.querySelectorAll('.worked .value')].map(v => Number(v.dataset.value))}]));"""
CHOSEN = """return Object.fromEntries([...document.querySelectorAll('#trace table[data-name]')].map(t => [
    t.dataset.name,
    [...t.querySelectorAll('td.chosen')].map(td => [Number(td.dataset.row), Number(td.dataset.col)])]));"""


def factor(value: float) -> str:
    """A factor of a product as the page writes it: 3 decimals, in parentheses when negative."""
    return f"({value:.3f})" if value < 0 else f"{value:.3f}"


def run_demo_5(driver: Any, url: str) -> dict[str, Any]:
    """The page run with the demo 5 settings it opens with; the API's traced answer to the same request."""
    open_playground(driver, url)
    driver.find_element("css selector", "#run").click()
    wait_for(driver, "return document.querySelectorAll('#trace li').length === 9")
    return requests.post(f"{url}/v1/multi-head-attention", json={**DEMO_5, "trace": True}, timeout=10).json()


def test_clicking_a_cell_shows_the_dot_product_behind_its_weight(browser, live):
    trace = run_demo_5(browser, live)["trace"]
    q, k, v, weights = (np.asarray(trace[name]) for name in ("q", "k", "v", "weights"))  # (h, n, d_k), (h, n, n)
    choose(browser, "#trace-head", 2)
    browser.find_element("css selector", "#trace table[data-name=weights] td[data-row='3'][data-col='1']").click()
    shown = browser.execute_script(WORKED)
    logit = q[2, 3] @ k[2, 1] / np.sqrt(2)                                 # food → cat in head 2, d_k = 8 / 4
    terms = " + ".join(f"{factor(a)} × {factor(b)}" for a, b in zip(q[2, 3], k[2, 1], strict=True))
    assert shown["scores"]["text"] == f"score[food → cat] = q[food] · k[cat] = {terms} = {q[2, 3] @ k[2, 1]:.3f}"
    [scaled] = shown["scaled_scores"]["values"]
    assert scaled == pytest.approx(logit, rel=1e-12) and shown["scaled_scores"]["text"].endswith(f" = {logit:.3f}")
    assert logit == pytest.approx(trace["scaled_scores"][2][3][1], rel=1e-12)  # the weight's logit
    [weight] = shown["weights"]["values"]
    assert weight == pytest.approx(weights[2, 3, 1], rel=1e-12)            # softmax over food's 4 visible keys
    browser.find_element("css selector", "#trace table[data-name=head-output] td[data-row='3'][data-col='1']").click()
    shown = browser.execute_script(WORKED)
    out = weights[2] @ v[2]                                                # (n, d_k)
    assert shown["head-output"]["values"] == pytest.approx([out[3, 1]], rel=1e-12)
    assert shown["concat"]["values"] == pytest.approx([out[3, 1]], rel=1e-12)
    assert shown["concat"]["text"].startswith("concat[food, 2·1] = out[food, 1] of head 2")  # its column 5 of 8
    chosen = browser.execute_script(CHOSEN)
    assert chosen["weights"] == chosen["scores"] == [[3, 1]]
    assert chosen["q"] == [[3, 0], [3, 1]] and chosen["k"] == [[1, 0], [1, 1]]
    assert chosen["v"] == [[row, 1] for row in range(5)]
    assert chosen["concat"] == [[3, column] for column in range(8)]  # food's row: the output step reads all of it
    assert console_errors(browser) == []


def by_hand(x: np.ndarray, w: np.ndarray) -> tuple[str, float]:
    """x · w as the page writes it term by term (``factor(x_m) × factor(w_m)``), and its value."""
    return " + ".join(f"{factor(a)} × {factor(b)}" for a, b in zip(x, w, strict=True)), float(x @ w)


def assert_worked(line: str, value: float, start: str, x: np.ndarray, w: np.ndarray, expected: float) -> None:
    """A worked line ``start = terms = value``: its terms those of x · w, its value x · w within 1e-12, as is the
    API's ``expected``."""
    terms, product = by_hand(x, w)
    assert line == f"{start} = {terms} = {product:.3f}"
    assert value == pytest.approx(product, rel=1e-12, abs=1e-12)
    assert value == pytest.approx(expected, rel=1e-12, abs=1e-12)


def assert_worked_out(shown: dict[str, Any], answer: dict[str, Any], x: np.ndarray, labels: list[str], *,
                      head: int, query: int, key: int, c: int, d: int) -> None:
    """The page's Q, K, V lines (component c of q[query], k[key], v[key] in ``head``) and its output line
    (output[query, d]): X's rows times the trace's W_q, W_k, W_v and the concatenation's row times its W_o."""
    trace = answer["trace"]
    rows = {"q": query, "k": key, "v": key}
    for line, value, (letter, row) in zip(shown["qkv"]["lines"], shown["qkv"]["values"], rows.items(), strict=True):
        token, w = labels[row], np.asarray(trace[f"w_{letter}"])[head, :, c]    # (h, d_model, d_k): column c
        assert_worked(line, value, f"{letter}[{token}, {c}] = Σ x[{token}, m] × W_{letter}[m, {c}]", x[row], w,
                      trace[letter][head][row][c])
    concat = np.concatenate(list(np.asarray(trace["weights"]) @ np.asarray(trace["v"])), axis=-1)  # (n, h * d_k)
    [value] = shown["output"]["values"]
    assert_worked(shown["output"]["text"], value, f"output[{labels[query]}, {d}] = Σ concat[{labels[query]}, m] × "
                  f"W_o[m, {d}]", concat[query], np.asarray(trace["w_o"])[:, d], answer["output"][query][d])


def test_q_k_v_and_the_output_are_worked_out_with_the_trace_s_weights(browser, live):
    answer = run_demo_5(browser, live)
    trace = answer["trace"]
    x = np.asarray(requests.post(f"{live}/v1/embed", timeout=10, json={
        "tokens": DEMO_5["tokens"], "d_model": 8, "positional_encoding": True}).json()["embeddings"])
    choose(browser, "#trace-head", 2)
    choose(browser, "#trace-key", 1)
    browser.find_element("css selector", "#trace table[data-name=head-output] td[data-row='3'][data-col='1']").click()
    browser.find_element("css selector", "#trace table[data-name=output] td[data-row='3'][data-col='6']").click()
    assert [browser.find_element("css selector", f"#trace-{name}").get_attribute("value")
            for name in ("head", "query", "key", "component", "dimension")] == ["2", "3", "1", "1", "6"]
    shown = browser.execute_script(WORKED)
    assert_worked_out(shown, answer, x, DEMO_5["tokens"], head=2, query=3, key=1, c=1, d=6)
    assert shown["qkv"]["lines"][0].startswith("q[food, 1] = Σ x[food, m] × W_q[m, 1] = ")
    assert shown["output"]["text"].startswith("output[food, 6] = Σ concat[food, m] × W_o[m, 6] = ")
    chosen = browser.execute_script(CHOSEN)
    column = [[m, 1] for m in range(8)]                                  # W_q, W_k, W_v: d_model x d_k, column c
    assert chosen["w_q"] == chosen["w_k"] == chosen["w_v"] == column
    assert chosen["x"] == [[i, m] for i in (1, 3) for m in range(8)]     # the rows of food (query), cat (key)
    assert chosen["concat"] == [[3, m] for m in range(8)] and chosen["w_o"] == [[m, 6] for m in range(8)]
    assert chosen["output"] == [[3, 6]]
    tables = {name: browser.execute_script(TABLE, f"#trace table[data-name={name}]") for name in ("w_q", "w_o")}
    assert tables["w_q"]["cells"] == [[f"{value:.3f}" for value in row] for row in trace["w_q"][2]]
    assert tables["w_o"]["cells"] == [[f"{value:.3f}" for value in row] for row in trace["w_o"]]
    assert tables["w_o"]["rows"] == [f"{h}·{c}" for h in range(4) for c in range(2)]  # a row per concat column
    text = browser.find_element("css selector", "#trace").text
    assert "does not return" not in text and "cannot" not in text
    assert console_errors(browser) == []


def test_embeddings_mode_works_out_q_and_the_output_by_hand_too(browser, live):
    embeddings = np.round(np.random.default_rng(20).normal(size=(6, 8)), 3)
    encoding = requests.get(f"{live}/v1/positional-encoding?n_positions=6&d_model=8", timeout=10).json()["encoding"]
    x = embeddings + np.asarray(encoding)                                # X = E + PE, as the API adds them
    open_playground(browser, live)
    browser.find_element("css selector", "#source-embeddings").click()
    set_field(browser, "#embeddings", str(embeddings.tolist()))
    set_field(browser, "#heads", "2")
    set_checkbox(browser, "#causal", False)
    browser.find_element("css selector", "#run").click()
    wait_for(browser, "return document.querySelectorAll('#trace li').length === 9")
    request = {"embeddings": embeddings.tolist(), "n_heads": 2, "seed": 0, "causal": False,
               "positional_encoding": True, "trace": True}
    answer = requests.post(f"{live}/v1/multi-head-attention", json=request, timeout=10).json()
    choose(browser, "#trace-head", 1)
    browser.find_element("css selector", "#trace table[data-name=q] td[data-row='4'][data-col='2']").click()
    browser.find_element("css selector", "#trace table[data-name=k] td[data-row='0'][data-col='2']").click()
    browser.find_element("css selector", "#trace table[data-name=output] td[data-row='4'][data-col='7']").click()
    shown = browser.execute_script(WORKED)                               # the rows of X are labelled 0 to 5
    assert_worked_out(shown, answer, x, [str(i) for i in range(6)], head=1, query=4, key=0, c=2, d=7)
    chosen = browser.execute_script(CHOSEN)
    assert chosen["w_q"] == chosen["w_k"] == chosen["w_v"] == [[m, 2] for m in range(8)]
    assert chosen["w_o"] == [[m, 7] for m in range(8)] and chosen["output"] == [[4, 7]]
    assert console_errors(browser) == []


def test_a_w_o_past_4096_numbers_is_drawn_when_opened_with_its_column_highlighted(browser, live):
    open_playground(browser, live)
    browser.find_element("css selector", "#source-embeddings").click()
    set_field(browser, "#embeddings", str(np.eye(2, 72).tolist()))       # d_model 72: W_o has 5,184 numbers
    browser.find_element("css selector", "#run").click()                 # 4 heads: each W_q 72 x 18, drawn
    wait_for(browser, "return document.querySelectorAll('#trace li').length === 9")
    w_q = browser.execute_script("return document.querySelectorAll('#trace table[data-name=w_q] td').length")
    assert w_q == 72 * 18
    summary = browser.find_element("css selector", "#trace [data-step=output] details.large summary")
    assert summary.text == "W_o: 5,184 numbers, drawn when opened"
    assert browser.execute_script("return document.querySelector('#trace table[data-name=w_o]')") is None
    choose(browser, "#trace-dimension", 70)
    summary.click()
    wait_for(browser, "return document.querySelector('#trace table[data-name=w_o]')")
    assert browser.execute_script(CHOSEN)["w_o"] == [[m, 70] for m in range(72)]
    assert console_errors(browser) == []


def test_the_step_by_step_shows_the_input_and_the_head_s_q_k_v(browser, live):
    trace = run_demo_5(browser, live)["trace"]
    tables = {name: browser.execute_script(TABLE, f"#trace table[data-name={name}]") for name in ("x", "q", "k", "v")}
    x = requests.post(f"{live}/v1/embed", timeout=10, json={"tokens": DEMO_5["tokens"], "d_model": 8,
                                                            "positional_encoding": True}).json()["embeddings"]
    assert tables["x"]["cells"] == [[f"{value:.3f}" for value in row] for row in x]
    for name in ("q", "k", "v"):
        assert tables[name]["rows"] == DEMO_5["tokens"] and tables[name]["cols"] == ["0", "1"]
        assert tables[name]["cells"] == [[f"{value:.3f}" for value in row] for row in trace[name][0]]
    [x_cat] = browser.execute_script(WORKED)["input"]["values"]            # x[cat, 0] = e[cat, 0] + pe[1, 0]
    assert x_cat == x[1][0]                                                # exact: the same float64 sum


def test_a_heatmap_cell_chooses_its_head_and_a_masked_cell_weighs_nothing(browser, live):
    trace = run_demo_5(browser, live)["trace"]
    browser.find_element("css selector", "#heatmaps [data-head='1'] rect.cell[data-row='1'][data-col='3']").click()
    assert [browser.find_element("css selector", f"#trace-{name}").get_attribute("value")
            for name in ("head", "query", "key")] == ["1", "1", "3"]
    shown = browser.execute_script(WORKED)
    q, k = np.asarray(trace["q"][1]), np.asarray(trace["k"][1])
    assert shown["scores"]["values"] == pytest.approx([q[1] @ k[3]], rel=1e-12)  # a raw score exists
    assert shown["masked_scores"]["text"] == "masked: cat may not see food, so the score becomes −∞."
    assert shown["weights"]["values"] == [0]
    assert console_errors(browser) == []


def test_keyboard_adds_words_and_opens_a_demo_with_its_heatmap(browser, live):
    from selenium.webdriver.common.keys import Keys

    open_playground(browser, live)
    set_field(browser, "#tokens", "the")
    browser.find_element("css selector", "#vocabulary button[aria-label='Add cat']").send_keys(Keys.ENTER)
    assert browser.find_element("css selector", "#tokens").get_attribute("value") == "the cat"
    browser.find_element("css selector", "#demo-causal-mask summary").send_keys(Keys.ENTER)
    wait_for(browser, "return document.querySelectorAll('#demo-causal-mask rect.cell').length === 25")
    expected = requests.get(f"{live}/v1/demos/causal-mask", timeout=10).json()["result"]["weights"]
    [values] = browser.execute_script(HEATMAP_VALUES, "#demo-causal-mask figure")
    assert values == [value for row in expected for value in row]
    browser.find_element("css selector", "#demo-scaling summary").send_keys(Keys.ENTER)  # no weights: no heatmap
    wait_for(browser, "return document.querySelector('#demo-scaling table')")
    assert browser.execute_script("return document.querySelector('#demo-scaling svg')") is None
    assert console_errors(browser) == []


TABLE = """const table = document.querySelector(arguments[0]);
    return table && {corner: table.querySelector('thead th').textContent,
                     cols: [...table.querySelectorAll('thead th')].slice(1).map(th => th.textContent),
                     rows: [...table.querySelectorAll('tbody th')].map(th => th.textContent),
                     cells: [...table.querySelectorAll('tbody tr')].map(tr =>
                         [...tr.querySelectorAll('td')].map(td => td.textContent)),
                     strong: [...table.querySelectorAll('tbody tr')].map(tr =>
                         [...tr.querySelectorAll('td')].map(td => td.querySelector('strong') !== null))};"""


def open_demo(driver: Any, url: str, name: str) -> dict[str, Any]:
    """Open demo ``name`` on the page (it draws its tables); its result as the API gives it."""
    driver.find_element("css selector", f"#demo-{name} summary").click()
    wait_for(driver, "return document.querySelector(arguments[0])", f"#demo-{name} table")
    return requests.get(f"{url}/v1/demos/{name}", timeout=10).json()["result"]


def test_demo_tables_are_labelled_with_tokens_and_name_their_axes(browser, live):
    open_playground(browser, live)
    mask = open_demo(browser, live, "causal-mask")
    shown = browser.execute_script(TABLE, "#demo-causal-mask dd[data-key=mask] table")
    assert (shown["corner"], shown["rows"], shown["cols"]) == ("query ↓ key →", mask["tokens"], mask["tokens"])
    assert shown["cells"] == [[str(allowed).lower() for allowed in row] for row in mask["mask"]]
    lookup = open_demo(browser, live, "lookup")
    scores, output = (browser.execute_script(TABLE, f"#demo-lookup dd[data-key={key}] table")
                      for key in ("scores", "output"))
    assert (scores["corner"], scores["rows"], scores["cols"]) == ("query ↓ key →", ["it"], lookup["tokens"])
    assert (output["rows"], output["cols"]) == (["it"], lookup["dimensions"])
    assert output["cells"] == [[f"{value:.3f}" for value in lookup["output"]]]
    assert console_errors(browser) == []


def test_scaling_demo_prints_d_k_as_an_integer(browser, live):
    open_playground(browser, live)
    rows = open_demo(browser, live, "scaling")["rows"]
    shown = browser.execute_script(TABLE, "#demo-scaling table")
    assert shown["corner"] == "d_k" and shown["rows"] == ["4", "64", "512"]
    assert shown["cols"] == ["raw_std", "raw_max_weight", "scaled_std", "scaled_max_weight"]
    assert shown["cells"][2] == [f"{rows[2][key]:.3f}" for key in shown["cols"]]  # 25.118, 1.000, 1.110, 0.525


def test_strongest_links_name_their_axes_and_call_near_ties_ties(browser, live):
    open_playground(browser, live)
    demo = open_demo(browser, live, "multi-head")
    shown = browser.execute_script(TABLE, "#demo-multi-head dd[data-key=strongest_links] table")
    assert shown["corner"] == "query ↓ head →"
    assert (shown["rows"], shown["cols"]) == (demo["tokens"], ["head 0", "head 1", "head 2", "head 3"])
    weights = np.asarray(demo["weights"])                                  # (h, n, n)
    ranked = np.sort(weights, axis=-1)[..., ::-1]
    clear = (ranked[..., 0] - ranked[..., 1] >= 0.05) & (ranked[..., 1] > 0)  # (h, n): a lead, over a second key
    assert np.transpose(shown["strong"]).tolist() == clear.tolist()       # shown (n, h), computed (h, n)
    for h, i in zip(*np.nonzero(clear), strict=True):
        assert shown["cells"][i][h] == f"{demo['strongest_links'][h][i]} {ranked[h, i, 0]:.3f}"
    assert clear.sum() == 7  # of 20 cells: 4 see one key only, 9 are ties or even
    assert shown["cells"][2][0] == "even: all 3 within 0.05"  # 'ate' in head 0: 0.335, 0.334, 0.331
    assert shown["cells"][4][2] == "tie: it 0.378 ≈ food 0.366"
    assert shown["cells"][0] == ["the (its only key)"] * 4  # the causal first row


def test_errors_from_the_api_are_shown_not_thrown(browser, live):
    open_playground(browser, live)
    set_field(browser, "#tokens", "the dog")
    browser.find_element("css selector", "#run").click()
    error = wait_for(browser, "const e = document.querySelector('#error'); return !e.hidden && e.textContent")
    assert "/tokens/1" in error and "dog" in error
    assert [e for e in console_errors(browser) if "422" not in e["message"]] == []  # the refused request only


def run_toy(driver: Any, tokens: str, heads: int = 4) -> None:
    """Submit the toy form with ``tokens`` and ``heads`` (other settings as the page opens)."""
    set_field(driver, "#tokens", tokens)
    set_field(driver, "#heads", str(heads))
    driver.find_element("css selector", "#run").click()


SHOWN_ERROR = "const e = document.querySelector(arguments[0]); return !e.hidden && e.textContent"


def test_an_error_names_the_field_once(browser, live):
    open_playground(browser, live)
    run_toy(browser, "the cat", heads=3)
    shown = wait_for(browser, SHOWN_ERROR, "#error")
    [error] = requests.post(f"{live}/v1/multi-head-attention", timeout=10,
                            json={"tokens": ["the", "cat"], "d_model": 8, "n_heads": 3}).json()["errors"]
    assert error == {"pointer": "/n_heads", "detail": "d_model=8 must be divisible by n_heads=3"}
    assert shown == "/n_heads: d_model=8 must be divisible by n_heads=3"  # the pointer, then the API's detail


def test_after_a_failing_request_no_earlier_result_is_visible(browser, live):
    open_playground(browser, live)
    run_toy(browser, "the cat ate")
    wait_for(browser, "return document.querySelectorAll('#heatmaps figure').length === 4")
    run_toy(browser, "the dog")
    wait_for(browser, SHOWN_ERROR, "#error")
    assert not browser.find_element("css selector", "#results").is_displayed()
    left = browser.execute_script("return document.querySelectorAll('#heatmaps svg, #trace table').length")
    assert left == 0
    assert "cleared" in browser.find_element("css selector", "#status").text
    assert [e for e in console_errors(browser) if "422" not in e["message"]] == []  # the refused request only


def test_playground_fits_a_phone(browser, live):
    browser.set_window_size(390, 844)
    try:
        open_playground(browser, live)
        browser.find_element("css selector", "#run").click()
        wait_for(browser, "return document.querySelectorAll('#heatmaps figure').length === 4")
        width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"the page scrolls sideways at phone width: {width}"
    finally:
        browser.set_window_size(1280, 1000)


def test_docs_render_every_endpoint_of_the_spec(browser, live):
    browser.get(f"{live}/docs")
    count = sum(method in ("get", "post", "delete") for item in SPEC["paths"].values() for method in item)
    wait_for(browser, f"return document.querySelectorAll('.opblock').length === {count}")
    shown = browser.execute_script("""return [...document.querySelectorAll('.opblock')].map(block => [
        block.querySelector('.opblock-summary-method').textContent.toLowerCase(),
        block.querySelector('.opblock-summary-path').getAttribute('data-path')]);""")
    assert sorted(map(tuple, shown)) == sorted((method, path) for path, item in SPEC["paths"].items()
                                               for method in item if method in ("get", "post", "delete"))
    assert console_errors(browser) == []


def test_docs_try_it_out_calls_the_running_server(browser, live):
    browser.get(f"{live}/docs#/limits")
    block = wait_for(browser, "return document.querySelector('#operations-limits-get_v1_limits')")
    block.find_element("css selector", ".opblock-summary-control").click()
    execute = wait_for(browser, "return document.querySelector('#operations-limits-get_v1_limits .execute')")
    execute.click()
    body = wait_for(browser, "const b = document.querySelector('#operations-limits-get_v1_limits "
                             ".live-responses-table .response-col_description pre'); return b && b.textContent")
    assert '"max_heatmap_cells"' in body
    assert console_errors(browser) == []


@pytest.fixture(scope="module")
def live_with_keys() -> Iterator[str]:
    """The real gunicorn with API_KEYS set."""
    with gunicorn_server(WEB_CONCURRENCY="1", API_KEYS="docs-key") as url:
        yield url


LOCKS = "return document.querySelectorAll('.opblock .authorization__btn').length"
OPERATIONS = [(path, method) for path, item in SPEC["paths"].items() for method in item
              if method in ("get", "post", "delete")]


def test_docs_show_the_key_locks_only_when_the_server_sets_api_keys(browser, live, live_with_keys):
    browser.get(f"{live_with_keys}/docs")
    protected = sum("security" in SPEC["paths"][path][method] for path, method in OPERATIONS)
    assert wait_for(browser, LOCKS) == protected == len(OPERATIONS) - 4  # all but the 4 open health probes
    assert browser.execute_script("return document.querySelectorAll('.auth-wrapper .authorize').length") == 1
    browser.get(f"{live}/docs")
    wait_for(browser, f"return document.querySelectorAll('.opblock').length === {len(OPERATIONS)}")
    assert browser.execute_script(LOCKS) == 0
    assert browser.execute_script("return document.querySelectorAll('.auth-wrapper .authorize').length") == 0
    assert console_errors(browser) == []


SVG_SHOWN = """const img = document.querySelector(arguments[0] + ' .live-responses-table .svg-answer img');
    return img && img.complete && img.naturalWidth > 0 && decodeURIComponent(img.src.split(',')[1]);"""


def try_it(driver: Any, block_id: str) -> None:
    """Open an operation of /docs and execute its documented example."""
    block = wait_for(driver, f"return document.querySelector('#{block_id}')")
    block.find_element("css selector", ".opblock-summary-control").click()
    wait_for(driver, f"return document.querySelector('#{block_id} .execute')").click()


def test_docs_try_it_out_on_a_heatmap_shows_the_picture(browser, live):
    block = "operations-attention-post_v1_multi_head_attention_heatmap"
    browser.get(f"{live}/docs#/attention")
    try_it(browser, block)
    shown = wait_for(browser, SVG_SHOWN, f"#{block}")
    example = SPEC["paths"]["/v1/multi-head-attention/heatmap"]["post"]["requestBody"]["content"]["application/json"]
    picture = requests.post(f"{live}/v1/multi-head-attention/heatmap", json=example["example"], timeout=10).text
    assert shown == picture and picture.count('<rect class="cell') == 4 * 5 * 5  # demo 5: 4 heads of 5 x 5
    assert console_errors(browser) == []


def test_docs_choosing_svg_as_the_answer_type_sends_accept_and_shows_the_picture(browser, live):
    block = "operations-attention-post_v1_attention"
    browser.get(f"{live}/docs#/attention")
    opened = wait_for(browser, f"return document.querySelector('#{block}')")
    opened.find_element("css selector", ".opblock-summary-control").click()
    from selenium.webdriver.support.ui import Select

    chooser = wait_for(browser, f"return document.querySelector('#{block} .responses-inner select.content-type')")
    Select(chooser).select_by_value("image/svg+xml")
    wait_for(browser, f"return document.querySelector('#{block} .execute')").click()
    shown = wait_for(browser, SVG_SHOWN, f"#{block}")
    body = SPEC["paths"]["/v1/attention"]["post"]["requestBody"]["content"]["application/json"]["example"]
    assert shown == requests.post(f"{live}/v1/attention", json=body, headers={"Accept": "image/svg+xml"},
                                  timeout=10).text
    assert console_errors(browser) == []


# The real-model mode, against the default model (all-minilm-l6-v2: 6 layers x 12 heads).
SENTENCE = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def live_without_models() -> Iterator[str]:
    """The real gunicorn serving no model (ATTENTION_MODELS empty)."""
    with gunicorn_server(WEB_CONCURRENCY="1", ATTENTION_MODELS="") as url:
        yield url


def open_real_mode(driver: Any, url: str) -> list[dict]:
    """The playground switched to the real model by its radio button; the models the API lists."""
    open_playground(driver, url)
    driver.find_element("css selector", "#mode-real").click()
    models = requests.get(f"{url}/v1/models", timeout=10).json()["models"]
    wait_for(driver, f"return document.querySelectorAll('#model option').length === {len(models)} && "
                     "document.querySelector('#model-info').textContent")
    return models


def run_model(driver: Any, text: str, pair: str = "") -> None:
    set_field(driver, "#text", text)
    set_field(driver, "#text-pair", pair)
    driver.find_element("css selector", "#run-model").click()
    wait_for(driver, "return !document.querySelector('#model-results').hidden")


def choose(driver: Any, selector: str, value: int) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("css selector", selector)).select_by_value(str(value))


SHOWN_HEAD = """const f = document.querySelector('#model-heatmap figure');
    return f && f.dataset.layer === arguments[0] && f.dataset.head === arguments[1] &&
    [...f.querySelectorAll('rect.cell')].map(cell => Number(cell.getAttribute('data-value')));"""


def test_toy_mode_says_plainly_that_its_weights_are_random(browser, live):
    open_playground(browser, live)
    notice = browser.find_element("css selector", "#toy-notice")
    assert notice.is_displayed()
    assert "random" in notice.text and "mean nothing" in notice.text
    assert browser.find_element("css selector", "#mode-toy").is_selected()
    assert not browser.find_element("css selector", "#real-mode").is_displayed()
    assert console_errors(browser) == []  # the toy mode does not ask for the models


def test_real_model_shows_the_chosen_head_labelled_with_the_word_pieces(browser, live):
    models = open_real_mode(browser, live)
    assert [option.text for option in browser.find_elements("css selector", "#model option")] == [
        model["name"] for model in models]
    assert browser.find_element("css selector", "#model").get_attribute("value") == "all-minilm-l6-v2"
    assert not browser.find_element("css selector", "#toy-notice").is_displayed()
    run_model(browser, SENTENCE)
    answer = requests.post(f"{live}/v1/models/all-minilm-l6-v2/attention", json={"text": SENTENCE},
                           timeout=30).json()
    assert answer["tokens"][:3] == ["[CLS]", "the", "animal"]
    shown = browser.execute_script("return [...document.querySelectorAll('#model-tokens code')]"
                                   ".map(c => c.textContent)")
    assert shown == answer["tokens"]
    labels = browser.execute_script("""return [...document.querySelectorAll('#model-heatmap svg .panel text')]
        .map(t => t.textContent)""")
    n = len(answer["tokens"])
    assert labels[:2 * n] == answer["tokens"] * 2  # the row labels, the column labels, then the values in cells
    values = wait_for(browser, SHOWN_HEAD, "0", "0")
    assert values == [value for row in answer["layers"][0]["weights"][0] for value in row]  # exact: same text
    choose(browser, "#layer", 3)
    choose(browser, "#head", 7)
    values = wait_for(browser, SHOWN_HEAD, "3", "7")
    np.testing.assert_array_equal(np.reshape(values, (n, n)), answer["layers"][3]["weights"][7])
    assert console_errors(browser) == []


def test_model_view_has_every_layer_and_head_and_a_click_enlarges_one(browser, live):
    [model] = [model for model in open_real_mode(browser, live) if model["name"] == "all-minilm-l6-v2"]
    assert (model["n_layers"], model["n_heads"]) == (6, 12)
    run_model(browser, "The dog ate.", pair="It was hungry.")
    tokens = requests.post(f"{live}/v1/models/all-minilm-l6-v2/attention", timeout=30,
                           json={"text": "The dog ate.", "text_pair": "It was hungry."}).json()["tokens"]
    assert tokens.count("[SEP]") == 2
    cells = browser.execute_script("""return [...document.querySelectorAll('#model-view button.thumb')].map(b =>
        [Number(b.dataset.layer), Number(b.dataset.head), b.querySelector('canvas').width])""")
    assert cells == [[layer, head, len(tokens)] for layer in range(6) for head in range(12)]  # one pixel a weight
    browser.find_element("css selector", "#model-view button[data-layer='5'][data-head='11']").click()
    wait_for(browser, SHOWN_HEAD, "5", "11")
    assert browser.find_element("css selector", "#layer").get_attribute("value") == "5"
    assert browser.find_element("css selector", "#head").get_attribute("value") == "11"
    pressed = browser.execute_script("""return [...document.querySelectorAll('#model-view [aria-pressed=true]')]
        .map(b => [b.dataset.layer, b.dataset.head])""")
    assert pressed == [["5", "11"]]
    assert console_errors(browser) == []


SHOWN_READING = """const f = document.querySelector('#reading-heatmap figure');
    return f && !document.querySelector('#reading-heatmap').hidden && f.dataset.reading === arguments[0] &&
    f.dataset.layer === arguments[1] && f.dataset.head === arguments[2] &&
    [...f.querySelectorAll('rect.cell')].map(cell => Number(cell.getAttribute('data-value')));"""


def test_the_reading_toggle_draws_norms_rollout_and_flow_for_the_chosen_layer_and_head(browser, live):
    open_real_mode(browser, live)
    text = "the cat sat on the mat"
    run_model(browser, text)
    choose(browser, "#layer", 0)
    choose(browser, "#head", 3)
    wait_for(browser, SHOWN_HEAD, "0", "3")
    url = f"{live}/v1/models/all-minilm-l6-v2/explain"
    readings = {"norms": {"layers": [0], "heads": [3], "return_weights": True}, "rollout": {"layers": [0]}, "flow": {}}
    for reading, options in readings.items():
        browser.find_element("css selector", f"#reading-{reading}").click()
        values = wait_for(browser, SHOWN_READING, reading, "0", "3")
        answer = requests.post(url, json={"text": text, "methods": [reading], **options}, timeout=30).json()
        if reading == "norms":  # the head's weights beside its norms
            expected = [answer["norms"][0]["weights"], answer["norms"][0]["head_norms"]]
        else:
            expected = answer["flow"] if reading == "flow" else answer["rollout"][0]["values"]
        assert values == np.ravel(expected).tolist(), reading  # exact: the same server, the same text
        assert not browser.find_element("css selector", "#model-heatmap").is_displayed()
    browser.find_element("css selector", "#reading-rollout").click()
    choose(browser, "#layer", 4)                                    # the reading follows the chosen layer
    values = wait_for(browser, SHOWN_READING, "rollout", "4", "3")
    answer = requests.post(url, json={"text": text, "methods": ["rollout"], "layers": [4]}, timeout=30).json()
    assert values == np.ravel(answer["rollout"][0]["values"]).tolist()
    browser.find_element("css selector", "#reading-weights").click()
    assert browser.find_element("css selector", "#model-heatmap").is_displayed()
    assert not browser.find_element("css selector", "#reading-heatmap").is_displayed()
    browser.find_element("css selector", "#reading-flow").click()
    run_model(browser, SENTENCE * 3)                                # 44 word pieces: past max_flow_tokens
    error = wait_for(browser, "const e = document.querySelector('#reading-heatmap .error'); return e && e.textContent")
    assert "/text" in error and "max_flow_tokens" in error
    assert [e for e in console_errors(browser) if "422" not in e["message"]] == []  # the refused flow only


def test_a_head_past_the_heatmap_limit_is_drawn_unlabelled(browser, live):
    open_real_mode(browser, live)
    run_model(browser, "the dog ate the food " * 30)                  # 152 word pieces: 152^2 > max_heatmap_cells
    width = wait_for(browser, "const c = document.querySelector('#model-heatmap figure canvas.enlarged');"
                              "return c && c.width")
    assert width == 152
    figure = browser.find_element("css selector", "#model-heatmap figure")
    assert "drawn without labels" in figure.text and "max_heatmap_cells" in figure.text
    assert [e for e in console_errors(browser) if "422" not in e["message"]] == []  # the refused picture only


def test_real_model_errors_are_shown_with_their_pointer(browser, live):
    open_real_mode(browser, live)
    set_field(browser, "#text", "   ")
    browser.find_element("css selector", "#run-model").click()
    error = wait_for(browser, "const e = document.querySelector('#model-error'); return !e.hidden && e.textContent")
    assert "/text" in error
    assert not browser.find_element("css selector", "#model-results").is_displayed()
    assert [e for e in console_errors(browser) if "422" not in e["message"]] == []  # the refused request only


def test_real_model_after_a_failing_request_no_earlier_head_is_visible(browser, live):
    open_real_mode(browser, live)
    run_model(browser, "The dog ate.")
    set_field(browser, "#text", "   ")
    browser.find_element("css selector", "#run-model").click()
    assert "/text" in wait_for(browser, SHOWN_ERROR, "#model-error")
    assert not browser.find_element("css selector", "#model-results").is_displayed()
    left = browser.execute_script("return document.querySelectorAll('#model-heatmap svg, #model-view canvas').length")
    assert left == 0
    assert [e for e in console_errors(browser) if "422" not in e["message"]] == []  # the refused request only


def test_real_mode_says_when_no_model_is_served(browser, live_without_models):
    open_playground(browser, live_without_models)
    browser.find_element("css selector", "#mode-real").click()
    info = wait_for(browser, "return document.querySelector('#model-info').textContent")
    assert "serves no model" in info
    assert not browser.find_element("css selector", "#run-model").is_enabled()
    assert console_errors(browser) == []


def test_real_mode_fits_a_phone(browser, live):
    browser.set_window_size(390, 844)
    try:
        open_real_mode(browser, live)
        run_model(browser, SENTENCE)
        width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"the page scrolls sideways at phone width: {width}"
    finally:
        browser.set_window_size(1280, 1000)
