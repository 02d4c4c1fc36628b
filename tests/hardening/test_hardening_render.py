"""Issue 25, class 11: every renderer escapes what it did not write.

A report's fields are data (a host's facts, a supplied bisect report, a waiver file):
ids, verdicts, probe and patch names, host names and messages may hold control
characters, ANSI escapes, newlines and the markup of the output format. Each format has
one escaping helper (patchset/escaping.py) that every value goes through: the Markdown
and HTML templates through Jinja2's `finalize`, the terminal renderer and the CLI's
`esc()` through `for_terminal`, the SVG charts and the drift page through `for_html`.
"""

from __future__ import annotations

import copy
import re

import pytest
from tests.audit_facts import synth

from patchset.auditor import api, report
from patchset.auditor.render import chart, render
from patchset import escaping

HOSTILE = ("evil|pipe\x1b[31mRED\x1b[0m\r\n# HEAD <script>alert(1)</script> "
           "[link](http://x.invalid) **bold** `tick` ```fence [bold]rich[/bold] "
           "\u202eRTL\x07\x00 &amp; _em_")
CONTROLS = ("\x1b", "\r", "\x07", "\x00", "\u202e")


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory):
    return synth.real_series(tmp_path_factory.mktemp("series"))


@pytest.fixture(scope="module")
def hostile(series) -> dict:
    """The seed's report with every field a renderer shows replaced by HOSTILE."""
    rep = api.evaluate(series, [synth.facts(synth.load("seed.yaml"), series)], "context-loss")
    data = copy.deepcopy(report.to_dict(rep))
    data["series"]["manifest"] = "odd`name|.yaml\x1b[2J"   # a code span (it shows <, [ as is)
    for host in data["hosts"]:
        host["host"] = HOSTILE
        for state in host["states"]:
            state["patch"], state["server"], state["reason"] = HOSTILE, HOSTILE, HOSTILE
    for f in data["findings"]:
        f["host"] = HOSTILE
        for key in ("id", "subject", "expected", "found", "message"):
            f[key] = HOSTILE + key
    symptom = data["symptom"]
    symptom["title"] = HOSTILE
    for s in symptom["suspects"]:
        s["name"], s["reasons"] = HOSTILE, [HOSTILE, HOSTILE]
    for step in symptom["next_steps"]:
        step["title"], step["why"] = HOSTILE, HOSTILE
        step["command"] = "patchset x ``` y\x1b[2J"        # a code block: shown as is
    return data


def no_controls(text: str) -> None:
    for char in CONTROLS:
        assert char not in text, f"{char!r} reached the output"


def real_pipes(line: str) -> int:
    """Pipes Markdown reads as cell borders: not preceded by an odd run of backslashes."""
    return len(re.findall(r"(?<!\\)(?:\\\\)*\|", line))


def test_markdown_keeps_its_structure(hostile: dict) -> None:
    md = render(hostile, "md")
    no_controls(md)
    assert "<script>" not in md and "[link](http://x.invalid)" not in md
    assert "**bold**" not in md and "[bold]" not in md.replace("\\[bold\\]", "")
    lines = md.split("\n")
    assert not any(line.startswith("# HEAD") for line in lines)
    assert [line for line in lines if line.startswith("# ")] == ["# patchset audit"]
    header = None
    for line in lines:                      # every row has its header's cell count
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = real_pipes(line)
        else:
            assert real_pipes(line) == header, line
    assert escaping.for_markdown(HOSTILE) in md
    assert "for the series ``odd`name\\|.yaml\\x1b[2J`` on" in md
    fences = [line.strip() for line in lines if line.strip().startswith("```")]
    assert fences and all(f.startswith("````") for f in fences), fences   # longer than ```
    assert "   patchset x ``` y\\x1b[2J\n" in md


def test_html_holds_no_markup_from_the_report(hostile: dict) -> None:
    html = render(hostile, "html")
    no_controls(html)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&amp;amp;" in html                 # an entity in data is shown, not decoded
    assert "\\x1b[31mRED" in html              # the escape is visible as text


@pytest.mark.parametrize("color", [False, True])
def test_the_terminal_shows_markup_and_escapes_as_text(hostile: dict, color: bool) -> None:
    out = render(hostile, "terminal", color=color, width=400)
    assert "\x1b[31mRED" not in out and "\r" not in out and "\x07" not in out
    assert "\u202e" not in out and "\x00" not in out
    if not color:
        assert "\x1b" not in out
        assert "[bold]rich[/bold]" in out      # shown, not applied


def test_a_chart_label_is_escaped() -> None:
    svg = chart.svg([(1, 1e-4), (2, 2e-4)], 1e-5, HOSTILE)
    no_controls(svg)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    bars = chart.bars([(HOSTILE, 1e-4, 1e-5, 1e-3)], 1e-5, HOSTILE)
    no_controls(bars)
    assert "<script>" not in bars


@pytest.mark.parametrize("helper", [escaping.for_terminal, escaping.for_html,
                                    escaping.for_markdown, escaping.markdown_code,
                                    escaping.markdown_block])
def test_each_helper_leaves_no_control_character(helper) -> None:
    text = helper(HOSTILE)
    no_controls(text)
    assert "\n" not in text.strip("\n`") or helper is escaping.markdown_block


def test_markdown_code_spans_and_blocks_outrun_any_backticks() -> None:
    assert escaping.markdown_code("a``b") == "```a``b```"
    assert escaping.markdown_code("`x`") == "`` `x` ``"
    assert escaping.markdown_code("a|b") == "`a\\|b`"
    block = escaping.markdown_block("x ```` y", "sh", 2)
    assert block.startswith("`````sh\n  x ```` y\n  `````")


def test_the_cli_esc_is_the_terminal_helper() -> None:
    from patchset.cli.render import esc
    assert esc(HOSTILE) == escaping.for_terminal(HOSTILE)
    assert "\x1b" not in esc("\x1b[2J") and esc("[red]x") == "\\[red]x"
