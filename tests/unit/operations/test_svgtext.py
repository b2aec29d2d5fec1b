"""service.operations.svgtext: text made safe for XML, its width as DejaVu Sans draws it, wrapped to a width.
(That these widths hold in a real Chromium: tests/live/test_pictures_browser.py.)"""

from __future__ import annotations

import itertools

import pytest

from service.operations.svgtext import clean, num, text_width, wrap


def test_clean_replaces_exactly_the_characters_xml_forbids():
    assert clean("ok é ☃ \U0001f600") == "ok é ☃ \U0001f600"
    assert clean("<&>\"'") == "&lt;&amp;&gt;&quot;'"
    controls = "".join(map(chr, range(0x20)))
    assert clean(controls) == "".join(" " if c in "\t\n\r" else "\ufffd" for c in controls)
    assert clean("\x7f\x85\x9f\ud800\udfff\ufffe\uffff") == "\ufffd" * 7


def test_widths_are_dejavu_sans_advances():
    assert text_width("W", 100) == pytest.approx(98.9) and text_width("i", 100) == pytest.approx(27.8)
    assert text_width("W", 100, bold=True) == pytest.approx(110.4)
    assert text_width("Wi", 10) == pytest.approx(text_width("W", 10) + text_width("i", 10))
    assert text_width("é", 10) == text_width("e", 10)            # an accented letter is as wide as its base
    assert text_width("e\u0301", 10) == text_width("e", 10)      # a combining accent takes no room
    assert text_width("東", 10) == text_width("😀", 10) == 12.0  # wide characters: 1.2 em
    assert text_width("→", 10) == pytest.approx(11.2)           # any other character: 1.12 em (DejaVu: 0.84)


def test_wrap_breaks_at_spaces_within_the_width():
    text = "The causal mask stops a decoder from reading the future"
    lines = wrap(text, 150, 17, bold=True)
    assert len(lines) > 2 and " ".join(lines) == text
    assert all(text_width(line, 17, bold=True) <= 150 for line in lines)
    assert all(text_width(f"{line} {after.split()[0]}", 17, bold=True) > 150  # each line is as full as it can be
               for line, after in itertools.pairwise(lines))


def test_wrap_cuts_a_word_wider_than_the_line_between_its_letters():
    lines = wrap(f"a {'x' * 100} b", 60, 10)  # an x is 5.92 px at 10 px: ten of them fit in 60 px
    assert lines == ["a", *["x" * 10] * 10, "b"]
    assert wrap("W", 1, 10) == ["W"]  # a character wider than the line still moves on


def test_wrap_collapses_runs_of_spaces_as_svg_draws_them():
    assert wrap("a   b  ", 1000, 10) == ["a b"]
    assert wrap("", 100, 10) == [""]


def test_numbers_are_written_with_one_decimal_at_most():
    assert [num(v) for v in (12.0, 12.5, 12.04, 0.0)] == ["12", "12.5", "12", "0"]
