"""Inline SVG charts of drift figures: the drift by token position, and bars (a bisect's
per-suspect contributions, each step's A/B drift). The one implementation: the audit's
HTML report draws them here, and `patchset probe --kind drift --format html`
(isolate/measure/driftview.py) draws its charts with the same function.

A chart is plain SVG text: no script, nothing fetched, so it renders in a mail client or
an air-gapped browser as it does anywhere; every label is escaped. The y axis is log10 of
the drift (1e-6 and 1e-3 differ by what matters: orders of magnitude). In the position
chart the x axis is the token's position in the sequence; positions are binned (the mean
of each bin is a point, `<circle class="point" data-position=... data-drift=...>`) so a
32k-token run stays a few hundred points. The noise threshold is a dashed line
(`class="noise"`): above it is drift, below it the server disagreeing with itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from patchset import escaping

FLOOR = 1e-16                  # log10 of 0 is not drawable: the chart's bottom
WIDTH, HEIGHT, PAD = 640, 240, 48
BINS = 160
BAR_LABEL = 28                 # characters of a bar's label under the axis


def svg(points: Sequence[tuple[int, float]], threshold: float | None, title: str) -> str:
    """The chart of (position, estimator) points, binned; empty input gives an empty
    chart that says so."""
    if not points:
        return _empty(title, "no tokens compared")
    bins = _binned(points)
    lo_x, hi_x = bins[0][0], max(bins[-1][0], bins[0][0] + 1)
    lo_y, hi_y = _decades([v for _, v in bins] + ([threshold] if threshold else []))

    def x(pos: float) -> float:
        return PAD + (pos - lo_x) / (hi_x - lo_x) * (WIDTH - 2 * PAD)

    def y(val: float) -> float:
        return _y(val, lo_y, hi_y)

    out = _frame(title, "drift-chart", lo_y, hi_y)
    for pos in (lo_x, (lo_x + hi_x) // 2, hi_x):
        out.append(f'<text x="{x(pos) - 10:.1f}" y="{HEIGHT - PAD + 14}" font-size="10">'
                   f"{pos}</text>")
    out.append(f'<text x="{WIDTH // 2 - 40}" y="{HEIGHT - 8}" font-size="10">token '
               "position</text>")
    out += _noise(threshold, y)
    path = " ".join(f"{x(p):.1f},{y(v):.1f}" for p, v in bins)
    out.append(f'<polyline fill="none" stroke="#06c" points="{path}"/>')
    out += [f'<circle class="point" cx="{x(p):.1f}" cy="{y(v):.1f}" r="1.8" fill="#06c" '
            f'data-position="{p}" data-drift="{v:.6g}"/>' for p, v in bins]
    out.append("</svg>")
    return "\n".join(out)


def bars(items: Sequence[tuple[str, float | None, float | None, float | None]],
         threshold: float | None, title: str) -> str:
    """One bar per (label, value, low, high): the value as a bar (`class="bar"`), its
    interval [low, high] as a whisker (`class="interval"`); a value None (not
    attributable: cleared with its group) is an outline up to `high`, the most it can
    carry. Same log axis and noise line as the position chart."""
    if not items:
        return _empty(title, "nothing measured")
    values = [v for _, value, low, high in items for v in (value, low, high) if v]
    lo_y, hi_y = _decades(values + ([threshold] if threshold else []) or [FLOOR])

    def y(val: float) -> float:
        return _y(val, lo_y, hi_y)

    out = _frame(title, "bar-chart", lo_y, hi_y)
    slot = (WIDTH - 2 * PAD) / len(items)
    width = min(40.0, slot * 0.6)
    base = HEIGHT - PAD
    esc = escaping.for_html
    for i, (label, value, low, high) in enumerate(items):
        cx = PAD + slot * (i + 0.5)
        shown = value if value is not None else high
        top = y(shown) if shown else base
        fill = 'fill="#06c"' if value is not None else \
            'fill="none" stroke="#888" stroke-dasharray="3 2"'
        out.append(f'<rect class="bar" x="{cx - width / 2:.1f}" y="{top:.1f}" '
                   f'width="{width:.1f}" height="{max(base - top, 0.5):.1f}" {fill} '
                   f'data-label="{esc(label)}" data-value="{_num(value)}"><title>'
                   f"{esc(label)}: {_num(value) or 'not attributable'}</title></rect>")
        if low is not None and high is not None and high > 0:
            bottom = max(low, 10.0 ** lo_y)          # an interval from 0 starts at the axis
            out.append(f'<line class="interval" x1="{cx:.1f}" y1="{y(bottom):.1f}" '
                       f'x2="{cx:.1f}" y2="{y(high):.1f}" stroke="#222"/>')
        out.append(f'<text x="{cx:.1f}" y="{base + 14}" font-size="9" text-anchor="middle">'
                   f"{esc(_clip(label))}</text>")
    out += _noise(threshold, y)
    out.append("</svg>")
    return "\n".join(out)


def _empty(title: str, says: str) -> str:
    esc = escaping.for_html
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'role="img" aria-label="{esc(title)}"><text x="{PAD}" y="{HEIGHT // 2}">'
            f"{esc(says)}</text></svg>")


def _frame(title: str, css: str, lo_y: int, hi_y: int) -> list[str]:
    """The opening tag, the title, both axes and the y ticks (one per decade)."""
    esc = escaping.for_html
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc(title)}" '
           f'class="{css}">',
           f'<text x="{PAD}" y="16" font-size="12">{esc(title)}</text>',
           f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
           'stroke="#444"/>',
           f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>']
    for tick in range(lo_y, hi_y + 1):
        ty = _y(10.0 ** tick, lo_y, hi_y)
        out.append(f'<text x="4" y="{ty + 4:.1f}" font-size="10">1e{tick}</text>')
    return out


def _noise(threshold: float | None, y) -> list[str]:
    if not threshold:
        return []
    ty = y(threshold)
    return [f'<line class="noise" x1="{PAD}" y1="{ty:.1f}" x2="{WIDTH - PAD}" '
            f'y2="{ty:.1f}" stroke="#c00" stroke-dasharray="4 3"/>']


def _decades(values: Iterable[float]) -> tuple[int, int]:
    ys = [_log(v) for v in values]
    lo_y, hi_y = math.floor(min(ys)), math.ceil(max(ys) + 1e-9)
    return lo_y, max(hi_y, lo_y + 1)


def _y(val: float, lo_y: int, hi_y: int) -> float:
    return HEIGHT - PAD + (lo_y - _log(val)) / (hi_y - lo_y) * (HEIGHT - 2 * PAD)


def _binned(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    ordered = sorted(points)
    size = max(1, math.ceil(len(ordered) / BINS))
    out = []
    for i in range(0, len(ordered), size):
        chunk = ordered[i:i + size]
        out.append((chunk[0][0], sum(v for _, v in chunk) / len(chunk)))
    return out


def _log(value: float) -> float:
    return math.log10(max(value, FLOOR))


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _clip(label: str) -> str:
    return label if len(label) <= BAR_LABEL else label[: BAR_LABEL - 1] + "\u2026"
