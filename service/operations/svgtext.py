"""Text in the SVG pictures: made safe for XML, measured, wrapped.

Widths are DejaVu Sans' (Debian's sans-serif, as headless Chromium draws it), which is wider than the other fonts
the pictures ask for, so a text placed by :func:`text_width` stays where it was put in any of them.
"""

from __future__ import annotations

import re
import unicodedata
from xml.sax.saxutils import escape

import numpy as np

# XML 1.0 forbids C0 controls but tab/LF/CR, lone surrogates and U+FFFE/U+FFFF; C1 controls are
# allowed but invisible. A label shows them as U+FFFD; tab/LF/CR become spaces (one-line labels).
_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_WHITESPACE = re.compile("[\t\n\r]")


# Advance widths of ASCII 32..126 in thousandths of an em, DejaVu Sans Book and Bold (font-weight 600) as headless
# Chromium measured them (getComputedTextLength of each character alone), rounded up. DejaVu is Debian's sans-serif
# and wider than Segoe UI, SF Pro, Roboto or Helvetica, so a text that fits by these widths fits in those too.
_BOOK = (318, 401, 460, 838, 637, 951, 780, 275, 391, 391, 500, 838, 318, 361, 318, 338, 637, 637, 637, 637, 637, 637,
         637, 637, 637, 637, 338, 338, 838, 838, 838, 531, 1000, 685, 687, 699, 771, 632, 576, 775, 753, 295, 295, 656,
         558, 863, 749, 788, 604, 788, 695, 635, 611, 733, 685, 989, 686, 611, 686, 391, 338, 391, 838, 500, 500, 613,
         635, 550, 635, 616, 353, 635, 634, 278, 278, 580, 278, 975, 634, 612, 635, 635, 412, 522, 393, 634, 592, 818,
         592, 592, 525, 637, 338, 637, 838)
_BOLD = (349, 457, 522, 838, 696, 1003, 873, 307, 458, 458, 523, 838, 380, 416, 380, 366, 696, 696, 696, 696, 696, 696,
         696, 696, 696, 696, 400, 400, 838, 838, 838, 581, 1000, 775, 763, 734, 831, 684, 684, 821, 838, 373, 373, 775,
         638, 996, 838, 851, 733, 851, 771, 721, 683, 813, 775, 1104, 772, 725, 726, 458, 366, 458, 838, 500, 500, 675,
         716, 593, 716, 679, 436, 716, 713, 343, 343, 666, 343, 1043, 713, 688, 716, 716, 494, 596, 479, 713, 652, 924,
         646, 652, 583, 713, 366, 713, 838)
_WIDE, _OTHER = 1200, 1120  # CJK and emoji (a full em in most fonts, emoji up to ~1.2); any other character


def display(text: str) -> str:
    """``text`` as drawn: control characters replaced (XML 1.0), tab/LF/CR as spaces."""
    return _ILLEGAL.sub("\ufffd", _WHITESPACE.sub(" ", text))


def clean(text: str) -> str:
    """``text`` safe inside XML text and attributes: control characters replaced, then escaped."""
    return escape(display(text), {'"': "&quot;"})


def num(value: float) -> str:
    """A coordinate or size in px as an attribute writes it: one decimal at most (``12``, ``12.5``)."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _char_width(char: str, table: tuple[int, ...]) -> int:
    """One character's advance (thousandths of an em): ASCII from ``table``, an accented letter as its base."""
    code = ord(char)
    if 32 <= code < 127:
        return table[code - 32]
    if unicodedata.combining(char):
        return 0
    if unicodedata.east_asian_width(char) in "WF":
        return _WIDE
    base = unicodedata.normalize("NFD", char)[0]
    return table[ord(base) - 32] if 32 <= ord(base) < 127 else _OTHER


def text_width(text: str, size: float, *, bold: bool = False) -> float:
    """Width in px of ``text`` (as drawn: :func:`display`) at ``size`` px: an upper bound in any of the
    pictures' fonts."""
    table = _BOLD if bold else _BOOK
    return size * sum(_char_width(char, table) for char in text) / 1000


def wrap(text: str, width: float, size: float, *, bold: bool = False) -> list[str]:
    """``text`` as lines no wider than ``width`` px at ``size`` px: broken at spaces, a longer word between letters.

    Runs of spaces become one (SVG draws them so). Never empty: ``[""]`` for no text.
    """
    lines, line = [], ""
    for word in filter(None, text.split(" ")):
        joined = f"{line} {word}" if line else word
        if text_width(joined, size, bold=bold) <= width:
            line = joined
            continue
        if line:
            lines.append(line)
        while len(word) > 1 and text_width(word, size, bold=bold) > width:  # too wide: cut between characters
            edges = np.cumsum([_char_width(char, _BOLD if bold else _BOOK) for char in word]) * size / 1000
            fits = max(1, int(np.searchsorted(edges, width, side="right")))
            lines.append(word[:fits])
            word = word[fits:]
        line = word
    return [*lines, line]
