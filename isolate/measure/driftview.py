"""A drift measurement for people: a table, and an inline SVG chart of the drift by
position (`patchset probe --kind drift --format html`).

The chart is auditor/render/chart.py's `svg`, the one the audit's HTML report draws too
(the audit may not import isolate/, so the function lives there): plain SVG text, no
script, nothing fetched; log10 of the per-token estimator by token position, binned, the
noise threshold a dashed line.
"""

from __future__ import annotations

from typing import Any

from patchset.auditor.render.chart import svg
from patchset import escaping


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
    lines.append(f"  verdict: {OUTCOME[v.outcome]}: {v.why}")
    lines.append(f"  drift beyond the noise {_fmt(v.drift)} per token, upper bound "
                 f"{_fmt(v.upper)} at {100 * v.confidence:g}%, tolerance {_fmt(v.tolerance)}; "
                 f"detectable from {_fmt(v.detectable)} (80% power); {v.sequences} sequences, "
                 f"{v.tokens} tokens")
    if v.needs:
        lines.append(f"  to decide: {v.needs}")
    for note in rep.traffic:
        lines.append(f"  note: {note}")
    if outcome.saved:
        lines.append(f"  saved to {outcome.saved} (use it with --against)")
    return lines


OUTCOME = {"above": "DRIFT above the noise", "bounded": "bounded below the tolerance",
           "inconclusive": "INCONCLUSIVE"}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def html(outcome: Any) -> str:
    """A whole page: the table and one chart per sequence plus the overall one."""
    esc = escaping.for_html
    body = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
            "<title>patchset drift probe</title></head><body>",
            "<h1>patchset drift probe</h1>",
            "<pre>" + "\n".join(esc(line) for line in table(outcome)) + "</pre>"]
    rep = outcome.report
    if rep is not None:
        threshold = rep.verdict.tolerance          # the line: the drift that matters
        body.append(svg(list(rep.overall.points), threshold, "overall: drift by position"))
        for s in rep.per_sequence:
            body.append(svg(list(s.comparison.points), threshold, f"{s.name}"))
    body.append("</body></html>")
    return "\n".join(body) + "\n"
