"""One number per token drawn as a standalone SVG bar chart: a token occlusion's effect, bars over the tokens.

As the heatmaps (service.operations.heatmap): pure, one element per line, texts escaped and placed by their width;
every bar is ``<rect class="bar" data-index data-value>`` with a ``<title>``, ``data-value`` the number as the JSON
answer writes it. Bars are one colour (the value is the height, read on the axis), the largest a darker one.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

import numpy as np
import orjson

from service.operations.heatmap import (
    AXIS,
    FONT,
    MARGIN,
    MAX_SHOWN_CHARS,
    SETTINGS,
    SETTINGS_LINE,
    TITLE,
    TITLE_LINE,
    title_block,
)
from service.operations.palette import LUT
from service.operations.svgtext import clean, display, num, text_width, wrap

PLOT_H = 180.0  # px of the tallest bar
LABEL_FONT = 12.0
BAR_FILL, TOP_FILL = LUT[150], LUT[40]  # viridis' teal; the largest bar darker


def render_bars(values: np.ndarray, labels: Sequence[str], *, title: str, settings: Sequence[str] = (),
                quantity: str = "value") -> str:
    """The SVG document of ``values`` (P,) >= 0, one bar over each of ``labels`` (P tokens), heights on a scale
    from 0 to the largest value (its ticks at 0, 1/2 and 1 of it, on the left)."""
    written = orjson.dumps(np.ascontiguousarray(values), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].decode().split(",") \
        if len(values) else []
    heights = values.astype(np.float64)
    top = float(heights.max()) if len(heights) else 0.0
    scale = PLOT_H / top if top > 0 else 0.0
    shown = [display(label if len(label) <= MAX_SHOWN_CHARS else label[:MAX_SHOWN_CHARS - 1] + "…")
             for label in labels]
    bar = float(min(40, max(12, round(640 / max(1, len(values))))))
    ticks = [f"{q * top:.3g}" for q in (0, 0.5, 1)]
    left = max(text_width(tick, AXIS) for tick in ticks) + 14
    label_h = max([text_width(label, LABEL_FONT) for label in shown] or [0]) + 10
    plot_w = max(bar * len(values), text_width(quantity, AXIS))
    width = max(MARGIN * 2 + left + plot_w, min(720.0, text_width(display(title), TITLE, bold=True) + 2 * MARGIN))
    title_lines = wrap(display(title), width - 2 * MARGIN, TITLE, bold=True)
    settings_lines = wrap(" · ".join(settings), width - 2 * MARGIN, SETTINGS) if settings else []
    base = MARGIN + len(title_lines) * TITLE_LINE + len(settings_lines) * SETTINGS_LINE + 24 + PLOT_H  # the 0 line
    height = base + label_h + MARGIN
    x0 = MARGIN + left

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(width)} {num(height)}" '
             f'width="{num(width)}" height="{num(height)}" font-family="{FONT}">',
             f"<title>{clean(title)}</title>", '<rect width="100%" height="100%" fill="#fff"/>']
    parts += title_block(title_lines, settings_lines)
    parts.append(f'<text class="axis" x="{num(x0)}" y="{num(base - PLOT_H - 8)}" font-size="{num(AXIS)}" '
                 f'fill="#555">{escape(quantity)} ↑</text>')
    for q, tick in zip((0, 0.5, 1), ticks, strict=True):
        ty = base - q * PLOT_H
        parts.append(f'<line x1="{num(x0 - 4)}" y1="{num(ty)}" x2="{num(x0 + plot_w)}" y2="{num(ty)}" '
                     f'stroke="#ddd"/><text x="{num(x0 - 6)}" y="{num(ty)}" font-size="{num(AXIS)}" '
                     f'text-anchor="end" dominant-baseline="central" fill="#222">{escape(tick)}</text>')
    largest = int(np.argmax(heights)) if len(heights) else -1
    for i, (value, text, label) in enumerate(zip(heights.tolist(), written, labels, strict=True)):
        h, x = max(value, 0.0) * scale, x0 + i * bar
        parts.append(f'<rect class="bar" x="{num(x + 1)}" y="{num(base - h)}" width="{num(bar - 2)}" '
                     f'height="{num(h)}" fill="{TOP_FILL if i == largest else BAR_FILL}" data-index="{i}" '
                     f'data-value="{text}"><title>{clean(label)}: {text}</title></rect>')
        parts.append(f'<text transform="translate({num(x + bar / 2)} {num(base + 6)}) rotate(90)" '
                     f'font-size="{num(LABEL_FONT)}" dominant-baseline="central" fill="#222">'
                     f"{escape(shown[i])}</text>")
    parts.append(f'<line x1="{num(x0)}" y1="{num(base)}" x2="{num(x0 + plot_w)}" y2="{num(base)}" stroke="#444"/>')
    parts.append("</svg>\n")
    return "\n".join(parts)
