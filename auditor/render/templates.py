"""Markdown and HTML through the Jinja2 templates in templates/ (report.md.j2,
report.html.j2). HTML autoescapes everything; Markdown escapes table cells."""

from __future__ import annotations

import sys
from pathlib import Path

from . import view

TEMPLATE_DIRS = (Path(__file__).resolve().parent.parent.parent / "templates",   # a checkout
                 Path(sys.prefix) / "share" / "patchset" / "templates")         # an install


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def environment(fmt: str):
    import jinja2
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in TEMPLATE_DIRS]),
        undefined=jinja2.StrictUndefined,
        autoescape=fmt == "html", trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True)
    env.filters.update(short=view.short, when=view.when, cell=_md_cell,
                       evidence=view.evidence_line)
    env.globals.update(view=view)
    return env


def render(data: dict, fmt: str) -> str:
    name = {"md": "report.md.j2", "html": "report.html.j2"}[fmt]
    return environment(fmt).get_template(name).render(report=data)
