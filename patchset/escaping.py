"""One escaping helper per output format, for every value a renderer did not write itself.

A report, a saved run or a host's facts can carry anything: ids, verdicts, probe and patch
names, host names and messages are data, and data must never become structure. Each
helper first shows every control character as its escape (`validate.printable`: no
cursor moves, no ANSI colours, no line breaks inside a table row), then escapes what the
format would read as markup:

- terminal: rich markup (`[bold]`), so a value never styles or hides text;
- HTML: `& < > " '` (attributes are quoted by the templates);
- Markdown: the CommonMark punctuation that makes emphasis, code, links, images, HTML,
  entities, headings and table cells (a backslash escape prints the character itself);
  code spans and fenced blocks fenced longer than any run of backticks inside.

Standard library only (rich is imported where the terminal helper is used).
"""

from __future__ import annotations

import html as htmlmod
import re

from .validate import printable

# `_` inside a word (model_type) is no emphasis in CommonMark: left as it is.
_MD_PUNCT = re.compile(r"([\\`*{}\[\]<>#|~&!]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")
_BACKTICKS = re.compile(r"`+")


def for_terminal(value: object) -> str:
    """A value inside a rich markup string (or a rich table cell)."""
    from rich.markup import escape
    return escape(printable(str(value)))


def for_html(value: object) -> str:
    """A value inside HTML text or a quoted attribute."""
    return htmlmod.escape(printable(str(value)), quote=True)


def for_markdown(value: object) -> str:
    """A value inside Markdown text, a heading or a table cell."""
    return _MD_PUNCT.sub(r"\\\1", printable(str(value)))


def markdown_code(value: object) -> str:
    """A value as a Markdown code span, whatever backticks or pipes it holds (a pipe would
    end a table cell even inside a code span: GFM reads `\\|` there as a pipe)."""
    text = printable(str(value)).replace("|", "\\|")
    fence = "`" * (_longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_block(value: object, lang: str = "", indent: int = 0) -> str:
    """A value as a fenced code block (its lines indented by `indent` after the first, as
    the template indents the first)."""
    text = printable(str(value))
    fence = "`" * max(3, _longest_backticks(text) + 1)
    pad = "\n" + " " * indent
    return f"{fence}{lang}{pad}{text}{pad}{fence}"


def _longest_backticks(text: str) -> int:
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)
