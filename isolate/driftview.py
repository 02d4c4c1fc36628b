"""A drift measurement for people: a table, and an inline SVG chart of the drift by
position (for `patchset probe --kind drift --format html` and the audit's HTML report).

The chart is plain SVG text: no script, nothing fetched, so it renders in a mail client
or an air-gapped browser as it does anywhere. The y axis is log10 of the per-token
estimator (a drift of 1e-6 and one of 1e-3 differ by what matters: orders of magnitude),
the x axis the token's position in the sequence; positions are binned (the mean of each
bin is a point) so a 32k-token run stays a few hundred points. The noise threshold is a
dashed line: points above it are drift, below it the server disagreeing with itself.
"""

from __future__ import annotations

import html as htmlmod
import math
from typing import Any

FLOOR = 1e-16                  # log10 of 0 is not drawable: the chart's bottom
WIDTH, HEIGHT, PAD = 640, 240, 48
BINS = 160


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def table(outcome: Any) -> list[str]:
    if outcome.unreachable:
        return [f"drift probe: cannot reach the server: {outcome.error}"]
    rep = outcome.report
    title = ("prefill vs decode" if rep.kind == "prefill-vs-decode"
             else f"A/B against {rep.against}")
    lines = [f"drift ({title}) at {rep.endpoint}: {len(rep.per_sequence)} sequences, "
             f"{rep.overall.overall.tokens} tokens compared, {rep.seconds:.1f} s",
             f"  {'sequence':<16} {'prompt':>7} {'output':>6} {'mean':>9} {'p90':>9} "
             f"{'p99':>9} {'top-1':>7} {'first-div':>9}"]
    for s in rep.per_sequence:
        c = s.comparison
        lines.append(f"  {s.name:<16} {s.prompt_tokens:>7} {s.output_tokens:>6} "
                     f"{_fmt(c.overall.mean):>9} {_fmt(c.overall.p90):>9} "
                     f"{_fmt(c.overall.p99):>9} {_pct(c.top1_agreement):>7} "
                     f"{_fmt(c.first_divergence, 'd'):>9}")
    o = rep.overall
    lines.append(f"  {'overall':<16} {'':>7} {o.overall.tokens:>6} {_fmt(o.overall.mean):>9} "
                 f"{_fmt(o.overall.p90):>9} {_fmt(o.overall.p99):>9} "
                 f"{_pct(o.top1_agreement):>7} {_fmt(o.first_divergence, 'd'):>9}")
    lines.append("  by position: " + "; ".join(
        f"{label} mean {_fmt(b.mean)} p99 {_fmt(b.p99)} ({b.tokens} tokens)"
        for label, b in o.buckets.items()))
    v = rep.verdict
    state = {True: "DRIFT above the noise", False: "within the noise", None: "no verdict"}
    lines.append(f"  verdict: {state[v.above]}: {v.why}")
    if outcome.saved:
        lines.append(f"  saved to {outcome.saved} (use it with --against)")
    return lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def svg(points: list[tuple[int, float]], threshold: float | None, title: str) -> str:
    """The chart of (position, estimator) points, binned; empty input gives an empty
    chart that says so."""
    esc = htmlmod.escape
    if not points:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
                f'role="img" aria-label="{esc(title)}"><text x="{PAD}" y="{HEIGHT // 2}">'
                "no tokens compared</text></svg>")
    bins = _binned(points)
    lo_x, hi_x = bins[0][0], max(bins[-1][0], bins[0][0] + 1)
    ys = [_log(v) for _, v in bins] + ([_log(threshold)] if threshold else [])
    lo_y, hi_y = math.floor(min(ys)), math.ceil(max(ys) + 1e-9)
    hi_y = max(hi_y, lo_y + 1)

    def x(pos: float) -> float:
        return PAD + (pos - lo_x) / (hi_x - lo_x) * (WIDTH - 2 * PAD)

    def y(val: float) -> float:
        return HEIGHT - PAD + (lo_y - _log(val)) / (hi_y - lo_y) * (HEIGHT - 2 * PAD)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc(title)}" '
           'class="drift-chart">',
           f'<text x="{PAD}" y="16" font-size="12">{esc(title)}</text>',
           f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
           'stroke="#444"/>',
           f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>']
    for tick in range(lo_y, hi_y + 1):
        ty = y(10.0 ** tick)
        out.append(f'<text x="4" y="{ty + 4:.1f}" font-size="10">1e{tick}</text>')
    for pos in (lo_x, (lo_x + hi_x) // 2, hi_x):
        out.append(f'<text x="{x(pos) - 10:.1f}" y="{HEIGHT - PAD + 14}" font-size="10">'
                   f"{pos}</text>")
    out.append(f'<text x="{WIDTH // 2 - 40}" y="{HEIGHT - 8}" font-size="10">token '
               "position</text>")
    if threshold:
        ty = y(threshold)
        out.append(f'<line class="noise" x1="{PAD}" y1="{ty:.1f}" x2="{WIDTH - PAD}" '
                   f'y2="{ty:.1f}" stroke="#c00" stroke-dasharray="4 3"/>')
    path = " ".join(f"{x(p):.1f},{y(v):.1f}" for p, v in bins)
    out.append(f'<polyline fill="none" stroke="#06c" points="{path}"/>')
    out += [f'<circle class="point" cx="{x(p):.1f}" cy="{y(v):.1f}" r="1.8" fill="#06c" '
            f'data-position="{p}" data-drift="{v:.6g}"/>' for p, v in bins]
    out.append("</svg>")
    return "\n".join(out)


def _binned(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    ordered = sorted(points)
    size = max(1, math.ceil(len(ordered) / BINS))
    out = []
    for i in range(0, len(ordered), size):
        chunk = ordered[i:i + size]
        out.append((chunk[0][0], sum(v for _, v in chunk) / len(chunk)))
    return out


def _log(value: float) -> float:
    return math.log10(max(value, FLOOR))


def html(outcome: Any) -> str:
    """A whole page: the table and one chart per sequence plus the overall one."""
    esc = htmlmod.escape
    body = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
            "<title>patchset drift probe</title></head><body>",
            "<h1>patchset drift probe</h1>",
            "<pre>" + esc("\n".join(table(outcome))) + "</pre>"]
    rep = outcome.report
    if rep is not None:
        threshold = rep.verdict.threshold
        body.append(svg(list(rep.overall.points), threshold, "overall: drift by position"))
        for s in rep.per_sequence:
            body.append(svg(list(s.comparison.points), threshold, f"{s.name}"))
    body.append("</body></html>")
    return "\n".join(body) + "\n"
