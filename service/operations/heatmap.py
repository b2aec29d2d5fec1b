"""Attention weights drawn as a standalone SVG heatmap: one panel per head, a 0..1 colour legend.

Pure (numpy and strings, no Flask), so any endpoint or a script can draw. The SVG is built as a
list of strings joined once (one element per line); colours come from a 256-entry lookup table indexed with numpy, so
the only per-cell Python is emitting each cell's markup. Labels are user input: they are escaped
and their control characters replaced (those are illegal in XML 1.0 even when escaped).
Every cell is ``<rect class="cell" data-row data-col data-value>`` with a ``<title>`` (hover
text, screen readers); ``data-value`` is the weight as the JSON answers write it (orjson's shortest
round-trip text, in the weights' own precision: float32 answers have float32's shorter digits).
Exact zeros (masked cells) are hatched, not coloured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import orjson

from service.operations.svgtext import clean, display, text_width

# viridis (perceptually uniform, colour-blind safe, dark -> light) sampled at 0, 1/8, ..., 1.
_ANCHORS = ("440154", "482878", "3e4989", "31688e", "26828e", "1f9e89", "35b779", "6ece58", "fde725")
_RGB = np.array([[int(h[i:i + 2], 16) for i in (0, 2, 4)] for h in _ANCHORS], dtype=float)  # (9, 3)
_LEVELS = np.linspace(0.0, 1.0, 256)
_LUT_RGB = np.stack([np.interp(_LEVELS, np.linspace(0, 1, len(_ANCHORS)), _RGB[:, c]) for c in range(3)], -1)
LUT = np.array(["#{:02x}{:02x}{:02x}".format(*rgb) for rgb in np.rint(_LUT_RGB).astype(int)])  # (256,) fills
# Dark text on the light end of the scale, white on the dark end (relative luminance > 0.4).
_LUMINANCE = (_LUT_RGB / 255) @ np.array([0.2126, 0.7152, 0.0722])
TEXT_LUT = np.where(_LUMINANCE > 0.4, "#111", "#fff")

MAX_SHOWN_CHARS = 14  # longer labels are shortened on screen; the full text stays in the hover title

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"
MASKED = "#d9d9d9"
LEGEND_H = 230.0  # colour bar, ticks and the masked swatch


def _shown(label: str) -> str:
    return label if len(label) <= MAX_SHOWN_CHARS else label[:MAX_SHOWN_CHARS - 1] + "…"


def _as_written(panels: np.ndarray) -> list[list[list[str]]]:
    """Each value of (p, n_q, n_k) as the JSON answer writes it (orjson, one row at a time)."""
    return [[orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].decode().split(",") for row in panel]
            for panel in panels]


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def render_heatmap(weights: np.ndarray, *, row_labels: Sequence[str] | None = None,
                   col_labels: Sequence[str] | None = None, title: str | None = None,
                   panel_titles: Sequence[str] | None = None, annotate: bool | None = None,
                   decimals: int = 2, columns: int | None = None) -> str:
    """The SVG document of ``weights`` (n_q, n_k) or (p, n_q, n_k): one heatmap panel per leading index.

    Rows are queries (``row_labels``, n_q of them), columns keys (``col_labels``, n_k); both default to
    positions 0..n-1. ``panel_titles`` (p of them) default to "head i" for 3-d input. Values are
    expected in [0, 1] (the caller checks). ``annotate`` writes each value in its cell with
    ``decimals`` decimals; None means "when the cells are large enough to read". ``columns``: panels per
    row (default as many as fit in 1200 px; a model's answer: its heads, one row per layer).
    """
    written = np.ascontiguousarray(weights)                    # its dtype decides how a value is written
    weights = written.astype(np.float64, copy=False)
    panels = weights[None] if weights.ndim == 2 else weights  # (p, n_q, n_k)
    p, n_q, n_k = panels.shape
    row_names = [str(label) for label in row_labels] if row_labels is not None else [str(i) for i in range(n_q)]
    col_names = [str(label) for label in col_labels] if col_labels is not None else [str(j) for j in range(n_k)]
    if panel_titles is None:
        panel_titles = [f"head {i}" for i in range(p)] if weights.ndim == 3 else [""]
    rows, cols = [clean(name) for name in row_names], [clean(name) for name in col_names]
    shown_rows, shown_cols = [clean(_shown(name)) for name in row_names], [clean(_shown(name)) for name in col_names]

    # Geometry: cells shrink with the token count but stay readable (14 px at 64 tokens, up to 44 px).
    cell = float(min(44, max(14, round(560 / max(n_q, n_k)))))
    label_font = min(13.0, max(9.0, cell * 0.5))
    if annotate is None:
        annotate = cell >= 30
    value_font = min(12.0, cell * 0.34, (cell - 4) / text_width("0." + "0" * decimals, 1.0))
    left = max(text_width(display(_shown(name)), label_font) for name in row_names) + 10
    top_labels = max(text_width(display(_shown(name)), label_font) for name in col_names) + 10
    panel_title_h = 22.0 if any(panel_titles) else 0.0
    grid_w, grid_h = n_k * cell, n_q * cell
    panel_w, panel_h = left + grid_w + 24, panel_title_h + top_labels + grid_h + 24
    columns = max(1, min(p, columns or int(1200 // panel_w)))
    title_h = 34.0 if title else 8.0
    legend_w = 110.0
    width = columns * panel_w + legend_w
    height = title_h + max(math.ceil(p / columns) * panel_h, LEGEND_H) + 8

    levels = np.rint(np.clip(panels, 0.0, 1.0) * 255).astype(np.intp)  # (p, n_q, n_k) LUT indices
    fills = np.where(panels == 0.0, "url(#masked)", LUT[levels])
    text_fills = np.where(panels == 0.0, "#333", TEXT_LUT[levels])
    values = panels.tolist() if annotate else None  # python floats, for the rounded text written in the cells
    texts = _as_written(written.reshape(panels.shape))  # what the JSON answer says (float32: its own shortest text)
    fmt = f"{{:.{decimals}f}}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_num(width)} {_num(height)}" '
        f'width="{_num(width)}" height="{_num(height)}" font-family="{FONT}">',
        f"<title>{clean(title or 'Attention weights')}</title>",
        '<defs><pattern id="masked" width="6" height="6" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{MASKED}"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#9a9a9a" stroke-width="2"/></pattern>'
        '<linearGradient id="scale" x1="0" y1="1" x2="0" y2="0">',
        *(f'<stop offset="{v:.2f}" stop-color="{LUT[round(v * 255)]}"/>' for v in np.linspace(0, 1, 11)),
        "</linearGradient></defs>",
        '<rect width="100%" height="100%" fill="#fff"/>',
    ]
    if title:
        parts.append(f'<text x="12" y="24" font-size="17" font-weight="600" fill="#111">{clean(title)}</text>')
    for index in range(p):
        x0 = (index % columns) * panel_w + 8
        y0 = title_h + (index // columns) * panel_h
        gx, gy = x0 + left, y0 + panel_title_h + top_labels  # grid origin
        parts.append(f'<g class="panel" data-panel="{index}">')
        if panel_titles[index]:
            parts.append(f'<text x="{_num(gx)}" y="{_num(y0 + 15)}" font-size="14" font-weight="600" '
                         f'fill="#111">{clean(panel_titles[index])}</text>')
        for i, label in enumerate(shown_rows):
            parts.append(f'<text x="{_num(gx - 6)}" y="{_num(gy + (i + 0.5) * cell)}" font-size="{_num(label_font)}"'
                         f' text-anchor="end" dominant-baseline="central" fill="#222">{label}</text>')
        for j, label in enumerate(shown_cols):
            cx, cy = gx + (j + 0.5) * cell, gy - 6
            parts.append(f'<text transform="translate({_num(cx)} {_num(cy)}) rotate(-90)" '
                         f'font-size="{_num(label_font)}" dominant-baseline="central" fill="#222">{label}</text>')
        panel_fills, panel_text = fills[index], text_fills[index]
        panel_texts = texts[index]
        parts.append('<g stroke="#fff" stroke-width="0.5">')  # thin gaps between cells, inherited
        for i in range(n_q):
            y = _num(gy + i * cell)
            for j in range(n_k):
                text = panel_texts[i][j]
                parts.append(f'<rect class="cell" x="{_num(gx + j * cell)}" y="{y}" width="{_num(cell)}" '
                             f'height="{_num(cell)}" fill="{panel_fills[i][j]}" '
                             f'data-row="{i}" data-col="{j}" data-value="{text}">'
                             f"<title>{rows[i]} → {cols[j]}: {text}</title></rect>")
                if annotate:
                    parts.append(f'<text x="{_num(gx + (j + 0.5) * cell)}" y="{_num(gy + (i + 0.5) * cell)}" '
                                 f'font-size="{_num(value_font)}" text-anchor="middle" dominant-baseline="central" '
                                 f'fill="{panel_text[i][j]}" stroke="none">{fmt.format(values[index][i][j])}</text>')
        parts.append("</g></g>")
    parts.extend(_legend(width - legend_w + 14, title_h + 8))
    parts.append("</svg>\n")
    return "\n".join(parts)  # one element per line: readable when saved or shown as an example


def _legend(x: float, y: float) -> list[str]:
    """The colour bar (0 at the bottom, 1 at the top) and the swatch for masked / zero cells."""
    bar_h = LEGEND_H - 62
    y += 8
    parts = [f'<g class="legend"><text x="{_num(x)}" y="{_num(y)}" font-size="12" fill="#222">weight</text>',
             f'<rect x="{_num(x)}" y="{_num(y + 14)}" width="16" height="{_num(bar_h)}" fill="url(#scale)" '
             'stroke="#888" stroke-width="0.5"/>']
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        ty = y + 14 + (1 - tick) * bar_h
        parts.append(f'<line x1="{_num(x + 16)}" y1="{_num(ty)}" x2="{_num(x + 21)}" y2="{_num(ty)}" stroke="#444"/>'
                     f'<text x="{_num(x + 24)}" y="{_num(ty)}" font-size="11" dominant-baseline="central" '
                     f'fill="#222">{tick:g}</text>')
    sy = y + 14 + bar_h + 16
    parts.append(f'<rect x="{_num(x)}" y="{_num(sy)}" width="16" height="16" fill="url(#masked)" stroke="#888" '
                 f'stroke-width="0.5"/><text x="{_num(x + 22)}" y="{_num(sy + 8)}" font-size="11" '
                 'dominant-baseline="central" fill="#222">0 / masked</text></g>')
    return parts
