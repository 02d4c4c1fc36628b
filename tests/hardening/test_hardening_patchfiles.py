"""Hostile patch files (issue: patch files are exact). What `show` displays must be exactly
what `apply` applies: hunk counts match their headers, nothing but a new `diff --git`
section follows a hunk, and per-file and whole-series size limits hold.

Every case runs `show`, `list` and `apply` and asserts the bad-input contract of
tests/hostile.py (exit 2, one line naming file:line: field, nothing changed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pytest

from tests.hostile import World
from patchset import inputfile

HUNK = "@@ -1,4 +1,5 @@"
ADDED = "+# patch chat-a\n"


def edit(old: str, new: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        assert old in text
        return text.replace(old, new, 1)
    return change


def append(extra: str) -> Callable[[str], str]:
    return lambda text: text + extra


CASES = [
    ("over-count-old", edit(HUNK, "@@ -1,5 +1,5 @@"), "diff.hunk",
     "ends at the end of the file with 1 old"),
    ("over-count-new", edit(HUNK, "@@ -1,4 +1,6 @@"), "diff.hunk",
     "ends at the end of the file with 0 old and 1 new"),
    ("under-count-old", edit(HUNK, "@@ -1,3 +1,5 @@"), "diff.hunk",
     "more removed/context lines than its header"),
    ("under-count-new", edit(HUNK, "@@ -1,4 +1,4 @@"), "diff.hunk",
     "more added/context lines than its header"),
    ("added-after-last-hunk", append("+import os  # never applied\n"), "diff.hunk",
     "follows the hunk of line"),
    ("removed-after-last-hunk", append("-import json\n"), "diff.hunk",
     "follows the hunk of line"),
    ("context-after-last-hunk", append(" import copy\n"), "diff.hunk",
     "follows the hunk of line"),
    ("file-header-after-hunk", append("--- a/python/x.py\n+++ b/python/x.py\n"), "diff.hunk",
     "follows the hunk of line"),
    ("index-after-hunk", append("index " + "a" * 40 + ".." + "b" * 40 + "\n"), "diff.hunk",
     "follows the hunk of line"),
    ("text-after-hunk", append("trailing words\n"), "diff.hunk", "follows the hunk of line"),
    ("zero-count-hunk", append("@@ -0,0 +0,0 @@\n"), "diff.hunk", "counts no lines"),
    ("huge-count", edit(HUNK, "@@ -1,9999999999 +1,5 @@"), "diff.hunk",
     "malformed hunk header"),
    ("stray-inside-hunk", edit(ADDED, ADDED + "stray\n"), "diff.hunk",
     "not a diff line: 'stray'"),
    ("crlf-hunk", lambda t: t.replace("\n", "\r\n"), "header", "carriage return"),
    ("escape-in-header", edit("Author: Test", "Author: \x1b[2JTest"), "header",
     "escape character"),
    ("cr-in-header", edit("Forwarded: not-needed", "Forwarded: not-needed\rX"), "header",
     "carriage return"),
    ("short-index", edit("index 48d43831eb4631102e6894d0e8e58e3b1525bd4c",
                         "index 48d43831eb46"), "diff.index", "full 40-hex"),
    ("index-trailing-junk", edit(" 100644\n", " 100644 x\n"), "diff.index", "full 40-hex"),
    ("symlink-mode", edit("index 48d43831eb4631102e6894d0e8e58e3b1525bd4c..ee8c44ca695dedf0e8361"
                          "0408d8cfd47e2fd3467 100644", "index 48d43831eb4631102e6894d0e8e58e3b1"
                          "525bd4c..ee8c44ca695dedf0e83610408d8cfd47e2fd3467 120000"),
     "diff.mode", "file mode '120000' is not supported"),
    ("new-symlink", append("diff --git a/python/sglang/evil b/python/sglang/evil\nnew file "
                           "mode 120000\nindex " + "0" * 40 + ".." + "a" * 40 + "\n"),
     "diff.mode", "file mode '120000'"),
    ("submodule-mode", append("diff --git a/python/sglang/sub b/python/sglang/sub\nnew mode "
                              "160000\n"), "diff.mode", "file mode '160000'"),
    ("rename-without-lines", edit("diff --git a/python/sglang/srt/entrypoints/openai/serving_"
                                  "chat.py b/python/sglang/srt/entrypoints/openai/serving_chat.py",
                                  "diff --git a/python/sglang/srt/entrypoints/openai/serving_"
                                  "chat.py b/python/sglang/srt/other.py"),
     "diff.path", "must name the same file"),
    ("path-escape", edit("b/python/sglang/srt/entrypoints/openai/serving_chat.py\n",
                         "b/../../etc/passwd\n"), "diff.path", "points outside the tree"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", [("show", "chat-a"), ("list",),
                                     ("apply", "--tier", "risky", "localhost")],
                         ids=["show", "list", "apply"])
def test_inexact_patch_files_refused(world: World, case: tuple, command: tuple) -> None:
    _, change, field, fragment = case
    patch = world.series / "patches" / "chat-a.patch"
    original = patch.read_bytes()
    before = world.state()
    patch.write_bytes(change(original.decode()).encode())
    try:
        line = world.refuse(command, fragment, before=world.state())
    finally:
        patch.write_bytes(original)
    assert re.search(rf"chat-a\.patch:\d+: {re.escape(field)}: ", line), line
    assert world.state() == before


def test_no_newline_marker_after_the_last_hunk_is_fine(world: World) -> None:
    """`\\ No newline at end of file` belongs to the hunk it follows: not a refusal."""
    patch = world.series / "patches" / "chat-a.patch"
    original = patch.read_bytes()
    text = original.decode()
    patch.write_text(text.replace(" import json\n", " import json\n\\ No newline at end of "
                                  "file\n") if text.endswith(" import json\n") else text)
    try:
        code, out, err = world.run("show", "chat-a")
        assert code == 0, err
    finally:
        patch.write_bytes(original)


def test_a_patch_file_over_the_size_limit_is_refused(world: World) -> None:
    patch = world.series / "patches" / "chat-a.patch"
    original = patch.read_bytes()
    before = world.state()
    with patch.open("ab") as handle:
        handle.truncate(inputfile.PATCH_LIMIT + 1)
    try:
        for command in (("list",), ("show", "chat-a")):
            line = world.refuse(command, "larger than the 4 MiB a patch file may have",
                                before=world.state())
            assert "series[0].file" in line
    finally:
        patch.write_bytes(original)
    assert world.state() == before


def test_the_whole_series_has_a_size_limit(world: World, monkeypatch) -> None:
    sizes = sorted((p.stat().st_size for p in (world.series / "patches").glob("*.patch")))
    monkeypatch.setattr(inputfile, "SERIES_LIMIT", sum(sizes) - 1)
    line = world.refuse(("list",), "the series' patch files together are larger than")
    assert re.search(r"series\[4\]\.file", line), line
