"""Renderers: each takes the canonical report dict (auditor.report.to_dict: already
redacted) and returns text. Terminal (rich), Markdown and HTML (Jinja2 templates in
templates/; the HTML's drift charts are inline SVG from chart.py), JSON, JUnit XML (one
suite per host), the Prometheus text format (auditor/metrics.py)."""

from __future__ import annotations

import json

FORMATS = ("terminal", "md", "html", "json", "junit", "prometheus")


def render(data: dict, fmt: str, color: bool = False, width: int | None = None) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    if fmt == "prometheus":
        from ..metrics import render as metrics
        return metrics(data)
    if fmt == "junit":
        from .junit import render as junit
        return junit(data)
    if fmt in ("md", "html"):
        from .templates import render as template
        return template(data, fmt)
    if fmt == "terminal":
        from .terminal import render as terminal
        return terminal(data, color=color, width=width)
    raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")

