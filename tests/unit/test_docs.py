"""The front page and the manual (README.md, docs/*.md): every relative link reaches a file of the repository, and
every ``#anchor`` a heading of its page (GitHub's slugs); the manual's table of contents lists every page; the
configuration table names every variable the service reads, once, with the limits' and the jobs' defaults.

The console examples are run against a real server by tests/live/test_readme.py."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from service import settings
from tests.conftest import ROOT

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
BLAS_VARIABLES = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}  # read by the BLAS libraries

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fence = [], None
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
        else:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text as rendered (code, links and emphasis reduced to their text),
    lower-cased, every character but letters, digits, ``_``, ``-`` and spaces dropped, spaces made hyphens."""
    text = CODE_SPAN.sub(lambda match: match.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on ``page``, repeated slugs numbered as GitHub numbers them (``-1``, ``-2``)."""
    seen: Counter[str] = Counter()
    found = set()
    for line in prose_lines(page.read_text()):
        if heading := HEADING.match(line):
            base = slug(heading.group(2))
            found.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
    return found


def links(page: Path) -> list[str]:
    """The targets of the page's links and images (inline, reference definitions, HTML), code left aside."""
    targets = []
    for line in prose_lines(page.read_text()):
        if definition := REFERENCE.match(line):
            targets.append(definition.group(1))
            continue
        prose = CODE_SPAN.sub("code", line)
        targets += INLINE_LINK.findall(prose) + HTML_LINK.findall(prose)
    return targets


def test_the_slugs_are_githubs():
    assert slug("Batch jobs (OpenAI's Batch API)") == "batch-jobs-openais-batch-api"
    assert slug("The `/v1/batch` endpoint") == "the-v1batch-endpoint"
    assert slug("What was tested here, and what was not") == "what-was-tested-here-and-what-was-not"
    assert slug("ConfigMap `attention-settings`") == "configmap-attention-settings"
    assert slug("`attention/`: the engine") == "attention-the-engine"
    assert slug("Open Inference Protocol (v2)") == "open-inference-protocol-v2"
    assert slug("MAX_D_MODEL and **bold** _words_") == "max_d_model-and-bold-words"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # another site: not checked here (no network in the unit tests)
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(ROOT) or not file.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and file.suffix != ".md":
            broken.append(f"{target}: an anchor into a file that is not Markdown")
        elif anchor and anchor not in anchors(file):
            broken.append(f"{target}: no heading of {file.relative_to(ROOT)} has that anchor")
    assert not broken, "\n".join(broken)


def test_the_checks_find_links():
    readme = links(ROOT / "README.md")
    assert "docs/README.md" in readme and "docs/it-animal.svg" in readme
    assert sum(len(links(page)) for page in PAGES) >= 80


def test_the_manual_lists_every_page_and_the_front_page_reaches_it():
    contents = {target.partition("#")[0] for target in links(DOCS / "README.md")}
    pages = {page.name for page in DOCS.glob("*.md")} - {"README.md"}
    assert pages - contents == set(), "pages missing from docs/README.md"
    assert "docs/README.md" in links(ROOT / "README.md")


def test_the_front_page_stays_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 10_000
    # the two commands, as CI and newcomers read them
    assert "make serve   # creates .venv" in readme and "\nmake test    # creates/updates .venv" in readme


def test_the_picture_is_the_services():
    """docs/it-animal.svg is what the model endpoint draws: layer 3, head 1, "it" looking at "animal"."""
    svg = (DOCS / "it-animal.svg").read_text()
    assert svg.startswith("<svg") and "model: all-minilm-l6-v2" in svg
    assert ">layer 3<" in svg and ">head 1<" in svg
    weight = re.search(r"<title>it → animal: ([0-9.]+)</title>", svg)
    assert weight and round(float(weight.group(1)), 2) == 0.68


def test_the_decoders_picture_is_the_services():
    """docs/it-animal-decoder.svg: layer 13, head 8 of the decoder, " it" looking at " animal", later keys hatched."""
    svg = (DOCS / "it-animal-decoder.svg").read_text()
    assert svg.startswith("<svg") and "model: smollm2-135m-instruct" in svg and "causal: yes" in svg
    assert ">layer 13<" in svg and ">head 8<" in svg
    weight = re.search(r"<title> it →  animal: ([0-9.]+)</title>", svg)
    assert weight and round(float(weight.group(1)), 2) == 0.75
    assert svg.count('class="cell masked"') == 13 * 12 // 2  # every key after its query, of 13 tokens


def test_the_configuration_table_is_the_settings():
    """Every variable service.settings declares, with its default and meaning, in its order: the table is
    ``python -m service.settings``'s output."""
    assert settings.table() in (DOCS / "configuration.md").read_text()
