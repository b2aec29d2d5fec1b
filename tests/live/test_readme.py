"""The console examples of README.md and of every page of the manual (docs/*.md), run as written against a real
gunicorn: each answers as its page shows.

``...`` in a shown answer stands for any text; request ids are not compared. Each page's commands run in order
(a later one may read what an earlier one wrote) in a temporary directory of that page's own (the binary v2
example writes body.bin there), with the pages' localhost:8000 pointed at the server.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.operations import catalogue
from tests.conftest import ROOT
from tests.live.conftest import gunicorn_server

REQUEST_ID = re.compile(r'"request_id":"[0-9a-f]{32}"')
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def console_blocks(text: str) -> Iterator[list[str]]:
    """The lines of each ``` or ```console block (other languages are code, not sessions)."""
    block: list[str] | None = None
    kind = ""
    for line in text.splitlines():
        if line.startswith("```"):
            if block is None:
                block, kind = [], line.strip()
            else:
                if kind in ("```", "```console"):
                    yield block
                block = None
        elif block is not None:
            block.append(line)


def _complete(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return not command.rstrip().endswith("\\")


def examples(text: str) -> list[tuple[str, str]]:
    """(command, shown answer) for every ``$ `` line of a page's sessions."""
    found = []
    for lines in console_blocks(text):
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                i += 1
                continue
            command, i = lines[i][2:], i + 1
            while not _complete(command) and i < len(lines):
                command, i = f"{command}\n{lines[i]}", i + 1
            shown = []
            while i < len(lines) and not lines[i].startswith("$ "):
                shown, i = [*shown, lines[i]], i + 1
            found.append((command, "\n".join(shown).strip()))
    return found


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


EXAMPLES = {page_name(page): examples(page.read_text()) for page in PAGES}


def test_the_pages_show_their_examples():
    every = [command for found in EXAMPLES.values() for command, _ in found]
    # at least the 42 examples (40 of them curl) that README.md ran before the manual moved to docs/
    assert len(every) >= 42 and sum(command.startswith("curl") for command in every) >= 40
    assert EXAMPLES["README.md"], "the front page shows a first answer"
    # the pages of the API show theirs (a page that lost its examples would pass the run below unnoticed)
    for page, at_least in {"docs/api.md": 15, "docs/models.md": 4, "docs/pictures.md": 7, "docs/v2.md": 5,
                           "docs/batch.md": 2}.items():
        assert len(EXAMPLES[page]) >= at_least, page


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The models a user gets with ATTENTION_MODELS unset (the live tests' servers serve MiniLM alone)."""
    with gunicorn_server(WEB_CONCURRENCY="1", ATTENTION_MODELS=",".join(catalogue.DEFAULTS)) as url:
        yield url


@pytest.mark.parametrize("page", [name for name, found in EXAMPLES.items() if found])
def test_every_example_answers_as_shown(server, tmp_path, page):
    mismatches = []
    for command, shown in EXAMPLES[page]:  # in order: a later one may read what an earlier one wrote
        run = command.replace("localhost:8000", server.removeprefix("http://"))
        got = subprocess.run(run, shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=30).stdout
        expected = ".*?".join(re.escape(part) for part in REQUEST_ID.sub("", shown).split("..."))
        if not re.fullmatch(expected, REQUEST_ID.sub("", got.strip()), flags=re.S):
            mismatches.append(f"$ {command}\nshown: {shown[:300]}\ngot:   {got[:300]}")
    assert not mismatches, f"{page}:\n\n" + "\n\n".join(mismatches)
