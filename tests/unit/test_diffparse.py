"""The one diff parser (patchset/agent/lib/diffparse.py), standard library only, used by the
patch-file reader (patchset/series/patchfile.py): on every real patch in patches/ and on the edge
cases of tests/diffparse/edges.diff (a new, a deleted, a no-newline file, several hunks)
it reads the same files, hunks and line counts as unidiff 1.0.1 did before it was
dropped. tests/diffparse/unidiff.json is what unidiff read (written by it, at the commit
that replaced it: `PatchSet(text[text.index("diff --git "):])`, each file's names, kinds,
counts and each hunk's [source_start, source_length, target_start, target_length,
added, removed, lines])."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.series import patchfile
from patchset.agent.lib import diffparse
from patchset.errors import ManifestError

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "diffparse"
BEFORE = json.loads((DATA / "unidiff.json").read_text())
SOURCES = {**{p.name: p for p in sorted((ROOT / "patches").glob("*.patch"))},
           "edges.diff": DATA / "edges.diff"}


def _diff(name: str) -> str:
    text = SOURCES[name].read_text()
    return text[text.index("diff --git "):]


def _as_unidiff_read_it(f: diffparse.FileDiff) -> dict:
    return {"source": f.source, "target": f.target, "path": f.path,
            "added_file": f.is_added_file, "removed_file": f.is_removed_file,
            "added": f.added, "removed": f.removed,
            "hunks": [[h.old_start, h.old_count, h.new_start, h.new_count, h.added,
                       h.removed, len(h.lines)] for h in f.hunks]}


def test_every_real_patch_is_compared() -> None:
    assert set(BEFORE) == set(SOURCES) and len(SOURCES) >= 7
    assert sum(len(f["hunks"]) for files in BEFORE.values() for f in files) >= 20


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_same_files_hunks_and_counts_as_unidiff(name: str) -> None:
    assert [_as_unidiff_read_it(f) for f in diffparse.parse(_diff(name))] == BEFORE[name]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_parse_gives_back_every_line(name: str) -> None:
    """Round trip: header, ---/+++, hunk headers and lines rebuild the diff exactly."""
    text, out = _diff(name), []
    for f in diffparse.parse(text):
        out += f.header
        if f.source is not None:
            out += [f"--- {f.source}", f"+++ {f.target}"]
        for h in f.hunks:
            out += [h.header, *(sign + line for sign, line in h.lines)]
    assert "\n".join(out) + "\n" == text


def test_the_edge_cases_read_as_git_wrote_them() -> None:
    fresh, gone, keep, long, noeol = diffparse.parse(_diff("edges.diff"))
    assert fresh.is_added_file and fresh.path == "python/sglang/fresh.py"
    assert gone.is_removed_file and gone.path == "python/sglang/gone.py"
    assert [h.old_start for h in long.hunks] == [2, 27, 37]
    assert noeol.hunks[0].lines == ((" ", "one"), ("-", "two"),
                                    ("\\", " No newline at end of file"), ("+", "TWO"),
                                    ("\\", " No newline at end of file"))
    assert keep.header[1].startswith("index ") and gone.line == 9


@pytest.mark.parametrize("text, line, words", [
    ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+b\n", 6, "ends before"),
    ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n+c\n", 7, "not a diff line"),
    ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n-b\n", 6, "more lines"),
    ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n*b\n", 6, "not a hunk line"),
    ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @\n-a\n+b\n", 4, "malformed hunk"),
    ("diff --git a/x b/x\n--- a/x\n@@ -1 +1 @@\n", 3, "without its `+++`"),
    ("hello\ndiff --git a/x b/x\n", 1, "expected `diff --git`"),
])
def test_what_is_no_diff_is_refused_at_its_line(text: str, line: int, words: str) -> None:
    with pytest.raises(diffparse.DiffError) as err:
        diffparse.parse(text)
    assert err.value.line == line and words in err.value.message


def test_the_patch_reader_uses_it_and_names_the_file_line() -> None:
    """patchfile's FileChange counts are the parser's; its error the file's line."""
    name = "mma-splitk-decode.patch"
    parsed = patchfile.parse(SOURCES[name].read_text(), name, "python/")
    assert [(c.path, c.added, c.removed) for c in parsed.files] == \
        [(f["path"], f["added"], f["removed"]) for f in BEFORE[name]]
    with pytest.raises(ManifestError) as err:
        patchfile.parse_diff("diff --git a/python/x b/python/x\n--- a/python/x\n"
                             "+++ b/python/x\n@@ -1 +1 @\n", "p.patch", 10, "python/")
    assert str(err.value).startswith("p.patch:14: diff: malformed diff")


def test_the_agent_ships_it_and_nothing_imports_unidiff() -> None:
    from patchset import transport
    assert "patchset_agent/lib/diffparse.py" in transport.agent_files()
    product = [p for top in ("patchset", "cli", "isolate", "deploy", "auditor", "connect")
               for p in (ROOT / top).rglob("*.py")]
    assert [p for p in product if "unidiff" in p.read_text("utf-8")] == []
    assert "unidiff" not in (ROOT / "pyproject.toml").read_text()
