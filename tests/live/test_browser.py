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
    assert steps == ["Raw scores Q·Kᵀ", "Scaled", "Masked", "Softmax weights", "Output"]
    masked = browser.execute_script("return document.querySelectorAll('#trace td.masked').length")
    assert masked == 10  # the upper triangle of a 5 x 5 causal mask, in the "Masked" step
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


def test_errors_from_the_api_are_shown_not_thrown(browser, live):
    open_playground(browser, live)
    set_field(browser, "#tokens", "the dog")
    browser.find_element("css selector", "#run").click()
    error = wait_for(browser, "const e = document.querySelector('#error'); return !e.hidden && e.textContent")
    assert "/tokens/1" in error and "dog" in error
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
    count = sum(method in ("get", "post") for item in SPEC["paths"].values() for method in item)
    wait_for(browser, f"return document.querySelectorAll('.opblock').length === {count}")
    shown = browser.execute_script("""return [...document.querySelectorAll('.opblock')].map(block => [
        block.querySelector('.opblock-summary-method').textContent.toLowerCase(),
        block.querySelector('.opblock-summary-path').getAttribute('data-path')]);""")
    assert sorted(map(tuple, shown)) == sorted((method, path) for path, item in SPEC["paths"].items()
                                               for method in item if method in ("get", "post"))
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
