"""The hostile tests' "nothing changed anywhere" rests on tests/hostile.py's snapshot: it
must see every kind of change a refused command could make."""

from __future__ import annotations

import os
from pathlib import Path

from tests.hostile import snapshot


def _world(root: Path) -> Path:
    (root / "tree" / "pkg").mkdir(parents=True)
    (root / "tree" / "pkg" / "a.py").write_text("x = 1\n")
    (root / "tree" / "b.txt").write_text("b\n")
    os.symlink("pkg", root / "tree" / "linked")
    return root / "tree"


def test_the_snapshot_sees_every_change(tmp_path: Path) -> None:
    tree = _world(tmp_path)
    before = snapshot(tree, tmp_path / "absent")
    assert snapshot(tree, tmp_path / "absent") == before          # stable
    assert before[str(tree / "linked")] == ("link", "pkg")           # a link to a directory
    assert before[str(tmp_path / "absent")] == ("absent",)
    changes = [
        lambda: (tree / "pkg" / "a.py").write_text("x = 2\n"),     # same size, new content
        lambda: (tree / "new").write_text(""),                       # a file added
        lambda: (tree / "b.txt").chmod(0o600),                       # a mode
        lambda: (tree / "b.txt").unlink(),                           # a file removed
        lambda: (os.unlink(tree / "linked"), os.symlink("b.txt", tree / "linked")),
        lambda: (tree / "pkg" / "sub").mkdir(),                      # an empty directory
        lambda: (tmp_path / "absent").mkdir(),                       # a root appears
    ]
    for change in changes:
        reference = snapshot(tree, tmp_path / "absent")
        change()
        assert snapshot(tree, tmp_path / "absent") != reference, change
