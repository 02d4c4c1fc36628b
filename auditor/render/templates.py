"""Markdown and HTML through the Jinja2 templates in templates/ (report.md.j2,
report.html.j2). Every `{{ value }}` goes through the format's one escaping helper
(patchset/escaping.py) as Jinja2 writes it (`finalize`): the templates write the markup,
the report's values never do. What a template means as markup it marks as such: `safe`
(chart.py's SVG, escaped there) in HTML, the `code` and `fence` filters in Markdown."""

from __future__ import annotations

import sys
from pathlib import Path

from patchset import escaping

from . import view

TEMPLATE_DIRS = (Path(__file__).resolve().parent.parent.parent / "templates",   # a checkout
                 Path(sys.prefix) / "share" / "patchset" / "templates")         # an install


class Written(str):
    """Markdown a filter wrote from a value (a code span, a fenced block): not escaped
    again."""


def _finalize(fmt: str):
    """The escaping of every value the template prints, for `fmt`."""
    from markupsafe import Markup

    def html(value: object) -> object:
        return value if isinstance(value, Markup) or not isinstance(value, str) \
            else Markup(escaping.for_html(value))

    def markdown(value: object) -> object:
        return value if isinstance(value, Written) or value is None \
            else escaping.for_markdown(value)
    return html if fmt == "html" else markdown


def environment(fmt: str):
    import jinja2
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in TEMPLATE_DIRS]),
        undefined=jinja2.StrictUndefined, finalize=_finalize(fmt),
        autoescape=fmt == "html", trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True)
    env.filters.update(short=view.short, when=view.when, evidence=view.evidence_line,
                       code=lambda v: Written(escaping.markdown_code(v)),
                       fence=lambda v, lang="", indent=0: Written(
                           escaping.markdown_block(v, lang, indent)))
    env.globals.update(view=view)
    return env


def render(data: dict, fmt: str) -> str:
    name = {"md": "report.md.j2", "html": "report.html.j2"}[fmt]
    return environment(fmt).get_template(name).render(report=data)
