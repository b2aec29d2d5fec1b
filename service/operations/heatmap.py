"""Attention weights drawn as a standalone SVG heatmap: panels of (n_q, n_k) weights and a colour legend.

Pure (numpy and strings, no Flask), so any endpoint or a script can draw. The SVG is built as a
list of strings joined once (one element per line); colours come from a 256-entry lookup table indexed with numpy, so
the only per-cell Python is emitting each cell's markup. Labels are user input: they are escaped
and their control characters replaced (those are illegal in XML 1.0 even when escaped).
Every text is placed by its width as DejaVu Sans draws it (:func:`text_width`; the widest of the usual sans-serif
fonts): titles and the legend wrap, margins and panels grow to fit their labels, so no text runs out of the picture.
Every cell is ``<rect class="cell" data-row data-col data-value>`` with a ``<title>`` (hover
text, screen readers); ``data-value`` is the weight as the JSON answers write it (orjson's shortest
round-trip text, in the weights' own precision: float32 answers have float32's shorter digits).
Masked cells (``hidden``: what the request's mask or causal flag hid, never guessed from a 0) are hatched and of
class ``cell masked``; a weight that is merely 0 has the colour of 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from xml.sax.saxutils import escape

import numpy as np
import orjson

from service.operations.palette import DEFS, LUT, MASKED_LABEL, TEXT_LUT, legend, legend_width, scaled, zero_label
from service.operations.svgtext import clean, display, num, text_width, wrap

MAX_SHOWN_CHARS = 14  # longer labels are shortened on screen; the full text stays in the hover title
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"

# Type sizes (px) and the height of the line each takes.
TITLE, TITLE_LINE = 17.0, 22.0
SETTINGS, SETTINGS_LINE = 12.0, 16.0
ROW_TITLE, ROW_TITLE_H = 14.0, 24.0
PANEL_TITLE, PANEL_TITLE_H = 13.0, 20.0
AXIS, AXIS_H = 11.0, 16.0
MARGIN, GAP = 12.0, 24.0      # around the picture; between panels
MAX_TEXT_W = 720.0            # a long title widens a narrow picture up to this, then wraps
QUERIES, KEYS = "queries ↓", "keys →"
_SIZE = re.compile(r'width="([0-9.]+)" height="([0-9.]+)"')  # a document's own size, on its first line


def _shown(label: str) -> str:
    return label if len(label) <= MAX_SHOWN_CHARS else label[:MAX_SHOWN_CHARS - 1] + "…"


def _as_written(panels: np.ndarray) -> list[list[list[str]]]:
    """Each value of (p, n_q, n_k) as the JSON answer writes it (orjson, one row at a time)."""
    return [[orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].decode().split(",") for row in panel]
            for panel in panels]


def render_heatmap(weights: np.ndarray, *, row_labels: Sequence[str] | None = None,
                   col_labels: Sequence[str] | None = None, title: str | None = None,
                   settings: Sequence[str] = (), panel_titles: Sequence[str] | None = None,
                   row_titles: Sequence[str] | None = None, hidden: np.ndarray | None = None,
                   color_scale: str = "fixed", annotate: bool | None = None, decimals: int = 2,
                   quantity: str = "weight", axes: tuple[str, str] = (QUERIES, KEYS),
                   hidden_labels: tuple[str, str] | None = None) -> str:
    """The SVG document of ``weights``: one panel (n_q, n_k), p panels (p, n_q, n_k) in rows as many as fit in
    1200 px, or r rows of c panels (r, c, n_q, n_k) (a stack: one row per layer, its heads along it).

    Rows are queries (``row_labels``, n_q of them), columns keys (``col_labels``, n_k); both default to
    positions 0..n-1. ``panel_titles``: p of them for 3-d input (default "head i"), c for 4-d (the same in each
    row, default "head j"). ``row_titles``: r, above each row of a 4-d input. ``settings``: what the run was
    (causal, seed, ...), written under the title. ``hidden``: booleans broadcastable to ``weights``' shape, True
    where the request's mask hid the cell (hatched, and named in the legend only when there is one). Values are
    expected in [0, 1] (the caller checks); ``color_scale`` (schemas.heatmap.COLOR_SCALES) says what the
    brightest colour stands for: 1, each row's largest weight, or the picture's largest. ``annotate`` writes each
    value in its cell with ``decimals`` decimals; None means "when the cells are large enough to read".
    ``quantity``: what the values are, as the legend names them (a weight; a norm, a flow). ``axes``: what the rows
    and the columns are (another table than queries x keys: a knockout's layers x heads); ``hidden_labels`` what the
    legend says a hatched cell is, and a cell of the colour of 0 (default: masked, and the quantity ≈ 0).
    """
    written = np.ascontiguousarray(weights)                    # its dtype decides how a value is written
    n_q, n_k = written.shape[-2:]
    panels = written.astype(np.float64, copy=False).reshape(-1, n_q, n_k)  # (p, n_q, n_k)
    p = len(panels)
    masked = (np.zeros(panels.shape, dtype=bool) if hidden is None
              else np.broadcast_to(hidden, written.shape).reshape(panels.shape))
    row_names = [str(label) for label in row_labels] if row_labels is not None else [str(i) for i in range(n_q)]
    col_names = [str(label) for label in col_labels] if col_labels is not None else [str(j) for j in range(n_k)]
    if panel_titles is None:
        panel_titles = [f"head {i}" for i in range(written.shape[-3])] if written.ndim > 2 else [""]
    rows, cols = [clean(name) for name in row_names], [clean(name) for name in col_names]
    shown_rows = [display(_shown(name)) for name in row_names]
    shown_cols = [display(_shown(name)) for name in col_names]

    # Geometry: cells shrink with the token count but stay readable (14 px at 64 tokens, up to 44 px); margins,
    # panels and the legend are as wide as their texts.
    cell = float(min(44, max(14, round(560 / max(n_q, n_k)))))
    label_font = min(13.0, max(9.0, cell * 0.5))
    if annotate is None:
        annotate = cell >= 30
    value_font = min(12.0, cell * 0.34, (cell - 4) / text_width("0." + "0" * decimals, 1.0))
    left = max(max(text_width(label, label_font) for label in shown_rows), text_width(axes[0], AXIS)) + 10
    top_labels = max(text_width(label, label_font) for label in shown_cols) + 10
    panel_title_h = PANEL_TITLE_H if any(panel_titles) else 0.0
    grid_w, grid_h = n_k * cell, n_q * cell
    widest_title = max(text_width(display(name), PANEL_TITLE, bold=True) for name in panel_titles)
    panel_w = max(left + grid_w, left + text_width(axes[1], AXIS), widest_title) + GAP
    panel_h = panel_title_h + AXIS_H + top_labels + grid_h + GAP
    if written.ndim == 4:
        columns, row_names_shown = written.shape[1], [display(name) for name in row_titles or ()]
    else:
        columns, row_names_shown = max(1, min(p, int(1200 // panel_w))), []
    row_title_h = ROW_TITLE_H if row_names_shown else 0.0
    panel_rows = math.ceil(p / columns)
    content_w = max([columns * panel_w, *(text_width(name, ROW_TITLE, bold=True) + GAP for name in row_names_shown)])

    levels, heading, ticks = scaled(panels, color_scale, quantity)
    legend_w = legend_width(ticks)
    texts_w = max([text_width(display(title or ""), TITLE, bold=True), text_width(" · ".join(settings), SETTINGS)])
    width = max(MARGIN + content_w + legend_w, min(MAX_TEXT_W, texts_w + 2 * MARGIN))
    title_lines = wrap(display(title), width - 2 * MARGIN, TITLE, bold=True) if title else []
    settings_lines = wrap(" · ".join(settings), width - 2 * MARGIN, SETTINGS) if settings else []
    top = MARGIN + len(title_lines) * TITLE_LINE + len(settings_lines) * SETTINGS_LINE + (6 if title_lines else 0)
    hidden_labels = hidden_labels or (MASKED_LABEL, zero_label(quantity))
    key, key_h = legend(width - legend_w, top, heading, ticks, bool(masked.any()), hidden_labels)
    height = top + max(panel_rows * (row_title_h + panel_h), key_h + MARGIN)

    index = np.rint(np.clip(levels, 0.0, 1.0) * 255).astype(np.intp)  # (p, n_q, n_k) LUT indices
    # Nested lists, not arrays: indexing a list per cell costs a tenth of indexing a numpy array.
    fills = np.where(masked, "url(#masked)", LUT[index]).tolist()
    text_fills = TEXT_LUT[index].tolist()
    classes = np.where(masked, "cell masked", "cell").tolist()
    notes = np.where(masked, f" ({hidden_labels[0].split(':')[0]})", "").tolist()
    unmasked = (~masked).tolist()
    values = panels.tolist() if annotate else None  # python floats, for the rounded text written in the cells
    texts = _as_written(written.reshape(panels.shape))  # what the JSON answer says (float32: its own shortest text)
    fmt, size = f"{{:.{decimals}f}}", num(cell)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(width)} {num(height)}" '
        f'width="{num(width)}" height="{num(height)}" font-family="{FONT}">',
        f"<title>{clean(title or 'Attention weights')}</title>",
        *DEFS,
        '<rect width="100%" height="100%" fill="#fff"/>',
    ]
    parts += title_block(title_lines, settings_lines)
    for i_panel in range(p):
        x0 = (i_panel % columns) * panel_w + MARGIN
        y0 = top + (i_panel // columns) * (row_title_h + panel_h) + row_title_h
        if row_names_shown and i_panel % columns == 0:  # a row's title before its panels, as it is read
            parts.append(f'<text class="row-title" x="{num(MARGIN)}" y="{num(y0 - row_title_h + 17)}" '
                         f'font-size="{num(ROW_TITLE)}" font-weight="600" fill="#111">'
                         f"{escape(row_names_shown[i_panel // columns])}</text>")
        gx, gy = x0 + left, y0 + panel_title_h + AXIS_H + top_labels  # grid origin
        parts.append(f'<g class="panel" data-panel="{i_panel}">')
        name = panel_titles[i_panel % len(panel_titles)]
        if name:
            parts.append(f'<text x="{num(x0)}" y="{num(y0 + 15)}" font-size="{num(PANEL_TITLE)}" font-weight="600" '
                         f'fill="#111">{clean(name)}</text>')
        for i, label in enumerate(shown_rows):
            parts.append(f'<text x="{num(gx - 6)}" y="{num(gy + (i + 0.5) * cell)}" font-size="{num(label_font)}"'
                         f' text-anchor="end" dominant-baseline="central" fill="#222">{escape(label)}</text>')
        for j, label in enumerate(shown_cols):
            cx, cy = gx + (j + 0.5) * cell, gy - 6
            parts.append(f'<text transform="translate({num(cx)} {num(cy)}) rotate(-90)" '
                         f'font-size="{num(label_font)}" dominant-baseline="central" fill="#222">'
                         f'{escape(label)}</text>')
        # Which axis is which, after the labels: a panel's texts start with its title and labels, as before.
        parts.append(f'<text class="axis" x="{num(gx)}" y="{num(gy - top_labels - 4)}" font-size="{num(AXIS)}" '
                     f'fill="#555">{axes[1]}</text>'
                     f'<text class="axis" x="{num(gx - 6)}" y="{num(gy - 4)}" font-size="{num(AXIS)}" '
                     f'text-anchor="end" fill="#555">{axes[0]}</text>')
        xs, centres = [num(gx + j * cell) for j in range(n_k)], [num(gx + (j + 0.5) * cell) for j in range(n_k)]
        parts.append('<g stroke="#fff" stroke-width="0.5">')  # thin gaps between cells, inherited
        for i in range(n_q):
            y, middle = num(gy + i * cell), num(gy + (i + 0.5) * cell)
            row_fills, row_text, row_unmasked = fills[i_panel][i], text_fills[i_panel][i], unmasked[i_panel][i]
            row_classes, row_notes, row_texts = classes[i_panel][i], notes[i_panel][i], texts[i_panel][i]
            for j in range(n_k):
                text = row_texts[j]
                parts.append(f'<rect class="{row_classes[j]}" x="{xs[j]}" y="{y}" width="{size}" height="{size}" '
                             f'fill="{row_fills[j]}" data-row="{i}" data-col="{j}" data-value="{text}">'
                             f"<title>{rows[i]} → {cols[j]}: {text}{row_notes[j]}</title></rect>")
                if annotate and row_unmasked[j]:
                    parts.append(f'<text x="{centres[j]}" y="{middle}" font-size="{num(value_font)}" '
                                 'text-anchor="middle" dominant-baseline="central" '
                                 f'fill="{row_text[j]}" stroke="none">{fmt.format(values[i_panel][i][j])}</text>')
        parts.append("</g></g>")
    parts.extend(key)
    parts.append("</svg>\n")
    return "\n".join(parts)  # one element per line: readable when saved or shown as an example


def title_block(title_lines: Sequence[str], settings_lines: Sequence[str]) -> list[str]:
    """The texts at the top of a picture, from its margin down: the title's wrapped lines, then the settings'."""
    parts, y = [], MARGIN
    for line in title_lines:
        y += TITLE_LINE
        parts.append(f'<text class="title" x="{num(MARGIN)}" y="{num(y - 5)}" font-size="{num(TITLE)}" '
                     f'font-weight="600" fill="#111">{escape(line)}</text>')
    for line in settings_lines:
        y += SETTINGS_LINE
        parts.append(f'<text class="settings" x="{num(MARGIN)}" y="{num(y - 4)}" font-size="{num(SETTINGS)}" '
                     f'fill="#444">{escape(line)}</text>')
    return parts


SHARED_DEFS = "\n".join(DEFS)  # as render_heatmap writes them, one line each


def combined(documents: Sequence[str], *, across: bool) -> str:
    """One SVG document of several :func:`render_heatmap` documents, each nested whole (its own title, legend and
    colour scale) side by side (``across``) or one under another. Their definitions are the same and their ids
    document-wide, so they are kept in the first only: one id, one element. One document is returned as it is."""
    if len(documents) == 1:
        return documents[0]
    sizes = [[float(value) for value in _SIZE.search(document).groups()] for document in documents]  # (w, h) each
    width = sum(w for w, _ in sizes) if across else max(w for w, _ in sizes)
    height = max(h for _, h in sizes) if across else sum(h for _, h in sizes)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(width)} {num(height)}" '
             f'width="{num(width)}" height="{num(height)}" font-family="{FONT}">']
    offset = 0.0
    for index, (document, (w, h)) in enumerate(zip(documents, sizes, strict=True)):
        x, y = (offset, 0.0) if across else (0.0, offset)
        nested = document.replace('<svg xmlns="http://www.w3.org/2000/svg" ', f'<svg x="{num(x)}" y="{num(y)}" ', 1)
        parts.append(nested.rstrip("\n") if index == 0 else nested.replace(SHARED_DEFS, "", 1).rstrip("\n"))
        offset += w if across else h
    parts.append("</svg>\n")
    return "\n".join(parts)
