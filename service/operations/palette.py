"""The colours of the heatmaps and their legend: viridis levels, the colour scales, the masked hatching.

A weight's colour is one of 256 levels of viridis (perceptually uniform, colour-blind safe, dark -> light), looked up
with numpy; which weight the brightest level stands for is the colour scale (``color_scale``), named in the legend.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

import numpy as np

from service.operations.svgtext import num, text_width, wrap

# viridis sampled at 0, 1/8, ..., 1.
_ANCHORS = ("440154", "482878", "3e4989", "31688e", "26828e", "1f9e89", "35b779", "6ece58", "fde725")
_RGB = np.array([[int(h[i:i + 2], 16) for i in (0, 2, 4)] for h in _ANCHORS], dtype=float)  # (9, 3)
_LEVELS = np.linspace(0.0, 1.0, 256)
_LUT_RGB = np.stack([np.interp(_LEVELS, np.linspace(0, 1, len(_ANCHORS)), _RGB[:, c]) for c in range(3)], -1)
LUT = np.array(["#{:02x}{:02x}{:02x}".format(*rgb) for rgb in np.rint(_LUT_RGB).astype(int)])  # (256,) fills
# Dark text on the light end of the scale, white on the dark end (relative luminance > 0.4).
_LUMINANCE = (_LUT_RGB / 255) @ np.array([0.2126, 0.7152, 0.0722])
TEXT_LUT = np.where(_LUMINANCE > 0.4, "#111", "#fff")

MASKED = "#d9d9d9"
LEGEND, LEGEND_LINE = 11.0, 14.0  # type size and line height (px)
LEGEND_TEXT_W = 124.0             # the legend's texts wrap at this width (px)
BAR_W, BAR_H = 16.0, 150.0        # the colour bar (px)
RIGHT = 12.0                      # px right of the legend: the picture's margin
MASKED_LABEL = "masked: may not attend"


def zero_label(quantity: str) -> str:
    """What the colour of 0 says beside the masked swatch, for the ``quantity`` drawn (a weight, a norm...)."""
    return f"{quantity} ≈ 0, not masked"


ZERO_LABEL = zero_label("weight")


# The hatching of masked cells and the colour bar's gradient, referred to as url(#masked) and url(#scale).
DEFS = ('<defs><pattern id="masked" width="6" height="6" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{MASKED}"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#9a9a9a" stroke-width="2"/></pattern>'
        '<linearGradient id="scale" x1="0" y1="1" x2="0" y2="0">',
        *(f'<stop offset="{v:.2f}" stop-color="{LUT[round(v * 255)]}"/>' for v in np.linspace(0, 1, 11)),
        "</linearGradient></defs>")


def legend_width(ticks: list[str]) -> float:
    """Width in px the legend takes (its margin included) with these tick labels."""
    return max([LEGEND_TEXT_W, *(BAR_W + 8 + text_width(tick, LEGEND) for tick in ticks)]) + RIGHT


def scaled(panels: np.ndarray, color_scale: str, quantity: str = "weight") -> tuple[np.ndarray, list[str], list[str]]:
    """Colour positions in [0, 1] of ``panels`` (p, n_q, n_k) on ``color_scale`` (schemas.heatmap.COLOR_SCALES), with
    the legend's heading (naming the ``quantity`` drawn) and the labels of its ticks at 0, 1/4, ..., 1 of the bar."""
    quarters = np.linspace(0.0, 1.0, 5)
    if color_scale == "row":
        top = panels.max(axis=-1, keepdims=True)  # (p, n_q, 1): each row's largest weight is the bar's top
        levels = np.divide(panels, top, out=np.zeros_like(panels), where=top > 0)
        return levels, [f"row scale: {quantity} ÷ its row's largest"], [f"{q:.0%}" for q in quarters]
    if color_scale == "max":
        top = float(panels.max())
        levels = panels / top if top > 0 else panels
        return levels, [f"scale 0 to the picture's largest {quantity}, {top:.3g}"], [f"{q * top:.3g}" for q in quarters]
    return panels, [f"{quantity}, fixed scale 0 to 1"], [f"{q:g}" for q in quarters]


def legend(x: float, y: float, heading: list[str], ticks: list[str], masked: bool,
           labels: tuple[str, str] = (MASKED_LABEL, ZERO_LABEL)) -> tuple[list[str], float]:
    """The legend at (x, y) px and its height in px: the colour bar (0 at the bottom) under its ``heading``, the
    ``ticks`` at 0, 1/4, ..., 1 of it and, when ``masked``, the hatched swatch beside the colour of 0, with their
    ``labels``."""
    start = y
    parts = ['<g class="legend">']
    for line in (line for text in heading for line in wrap(text, LEGEND_TEXT_W, LEGEND)):
        y += LEGEND_LINE
        parts.append(f'<text x="{num(x)}" y="{num(y - 3)}" font-size="{num(LEGEND)}" fill="#222">'
                     f"{escape(line)}</text>")
    bar = y + 8
    parts.append(f'<rect x="{num(x)}" y="{num(bar)}" width="{num(BAR_W)}" height="{num(BAR_H)}" '
                 'fill="url(#scale)" stroke="#888" stroke-width="0.5"/>')
    for quarter, tick in enumerate(ticks):
        ty = bar + (1 - quarter / 4) * BAR_H
        parts.append(f'<line x1="{num(x + BAR_W)}" y1="{num(ty)}" x2="{num(x + BAR_W + 5)}" y2="{num(ty)}" '
                     f'stroke="#444"/><text x="{num(x + BAR_W + 8)}" y="{num(ty)}" font-size="{num(LEGEND)}" '
                     f'dominant-baseline="central" fill="#222">{escape(tick)}</text>')
    y = bar + BAR_H + 14
    for fill, label in zip(("url(#masked)", LUT[0]), labels, strict=True) if masked else ():
        lines = wrap(label, LEGEND_TEXT_W - BAR_W - 6, LEGEND)
        parts.append(f'<rect class="swatch" x="{num(x)}" y="{num(y)}" width="{num(BAR_W)}" height="{num(BAR_W)}" '
                     f'fill="{fill}" stroke="#888" stroke-width="0.5"/>')
        parts.extend(f'<text x="{num(x + BAR_W + 6)}" y="{num(y + 12 + k * LEGEND_LINE)}" font-size="{num(LEGEND)}" '
                     f'fill="#222">{escape(line)}</text>' for k, line in enumerate(lines))
        y += max(BAR_W, len(lines) * LEGEND_LINE) + 8
    parts.append("</g>")
    return parts, y - start
