"""The README's console examples, run as written against a real gunicorn: each answers as the README shows.

``...`` in a shown answer stands for any text; request ids are not compared. Commands run in a temporary
directory (the binary v2 example writes body.bin there), with the README's localhost:8000 pointed at the server.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT
from tests.live.conftest import gunicorn_server

REQUEST_ID = re.compile(r'"request_id":"[0-9a-f]{32}"')


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
    """(command, shown answer) for every ``$ `` line of the README's sessions."""
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


EXAMPLES = examples((ROOT / "README.md").read_text())


def test_the_readme_shows_its_examples():
    assert len(EXAMPLES) >= 30 and sum(command.startswith("curl") for command, _ in EXAMPLES) >= 25


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with gunicorn_server(WEB_CONCURRENCY="1") as url:
        yield url


def test_every_readme_example_answers_as_shown(server, tmp_path):
    mismatches = []
    for command, shown in EXAMPLES:  # in order: a later one may read what an earlier one wrote
        run = command.replace("localhost:8000", server.removeprefix("http://"))
        got = subprocess.run(run, shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=30).stdout
        expected = ".*?".join(re.escape(part) for part in REQUEST_ID.sub("", shown).split("..."))
        if not re.fullmatch(expected, REQUEST_ID.sub("", got.strip()), flags=re.S):
            mismatches.append(f"$ {command}\nshown: {shown[:300]}\ngot:   {got[:300]}")
    assert not mismatches, "\n\n".join(mismatches)
