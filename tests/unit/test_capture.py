"""`patchset capture`: hand edits on a managed tree (git, plain) become a patch (over SSH:
tests/system/test_capture_hosts.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from tests.seriesfactory import CHAT, append_line

from tests.hostutil import cli
from patchset.series.manifest import load_series
from patchset.pin.upstream import materialize

AUTHOR = "Jane <jane@example.invalid>"


def disk(tree: Path, path: str) -> Path:
    return tree / path if (tree / "python").is_dir() else tree / path[len("python/"):]


def snapshot(tree: Path) -> dict[str, str]:
    """Every file's hash outside .git (and the lock's holder note), plus HEAD if any."""
    out = {str(p.relative_to(tree)): hashlib.sha1(p.read_bytes()).hexdigest()
           for p in tree.rglob("*") if p.is_file() and ".git" not in p.relative_to(tree).parts
           and p.name != "lock.json"}
    if (tree / ".git").exists():
        out["HEAD"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, text=True,
                                     capture_output=True, check=True).stdout
    return out


def edit(tree: Path, path: str = CHAT, line: str = "# captured hand edit") -> bytes:
    file = disk(tree, path)
    file.write_text(append_line("import ", line)(file.read_text()))
    return file.read_bytes()


@pytest.fixture(params=["git", "wheel"])
def tree(request, pinned_base, tmp_path: Path) -> Path:
    return materialize(pinned_base, tmp_path / f"tree-{request.param}", layout=request.param)


def capture(capsys, manifest: Path, tree: Path, name: str, *flags: str):
    return cli(capsys, "capture", "localhost", name, "--target", str(tree), "--offline",
               "--series", str(manifest), *flags)


def test_capture_local_tree(tree: Path, series_dir: Path, patchset_home: Path, pinned_base,
                            tmp_path: Path, capsys) -> None:
    manifest = series_dir / "patches.yaml"
    code, _, err = cli(capsys, "apply", "--only", "chat-a,chat-e", "--target", str(tree),
                       "localhost", "--series", str(manifest))
    assert code == 0, err
    edited = edit(tree)
    before = snapshot(tree)
    code, out, err = capture(capsys, manifest, tree, "chat-hand-fix", "--json", "--author",
                             AUTHOR, "--summary", "Fix chat by hand", "--tier", "safe",
                             "--path", "decode")
    assert code == 0, err
    result = json.loads(out)
    assert result["files"] == [CHAT] and result["depends"] == ["chat-a", "chat-e"]
    assert snapshot(tree) == before                       # the host is left as it was

    patch = load_series(manifest).by_name()["chat-hand-fix"]
    assert (patch.file, patch.tier, patch.path, patch.upstream_status, patch.depends,
            patch.summary) == ("patches/chat-hand-fix.patch", "safe", "decode", "pending",
                               ("chat-a", "chat-e"), "Fix chat by hand")
    text = (series_dir / patch.file).read_text()
    assert text.startswith(f"Description: Fix chat by hand\nAuthor: {AUTHOR}\n")
    assert "Patchset-Name: chat-hand-fix\n" in text
    assert "+# captured hand edit\n" in text and text.count("diff --git ") == 1
    [change] = patch.files
    assert change.post == hashlib.sha1(b"blob %d\0" % len(edited) + edited).hexdigest()
    code, out, err = cli(capsys, "check", "--offline", "--series", str(manifest))
    assert code == 0, out + err

    fresh = materialize(pinned_base, tmp_path / "fresh", layout="git")
    code, _, err = cli(capsys, "apply", "--only", "chat-hand-fix", "--target", str(fresh),
                       "localhost", "--series", str(manifest))
    assert code == 0, err
    assert disk(fresh, CHAT).read_bytes() == edited


def test_capture_refusals_are_one_line_and_write_nothing(tree: Path, series_dir: Path,
                                                         patchset_home: Path, capsys) -> None:
    manifest = series_dir / "patches.yaml"
    series_before = {p.name: p.read_bytes() for p in series_dir.rglob("*") if p.is_file()}

    def refused(name: str, *flags: str, author: str = AUTHOR) -> str:
        code, out, err = capture(capsys, manifest, tree, name, "--author", author, *flags)
        assert code == 2 and out == "", err
        lines = [x for x in err.strip().splitlines() if not x.startswith("materialize ")]
        assert len(lines) == 1, err
        assert {p.name: p.read_bytes() for p in series_dir.rglob("*") if p.is_file()} \
            == series_before
        return lines[0]

    assert "not managed" in refused("new-one")
    assert cli(capsys, "apply", "--only", "chat-a", "--target", str(tree), "localhost",
               "--series", str(manifest))[0] == 0
    assert "no hand edits" in refused("new-one")
    assert "'Bad Name'" in refused("Bad Name")
    assert "already in" in refused("chat-a")
    assert "--tier 'wild'" in refused("new-one", "--tier", "wild")
    edit(tree)                       # chat-e also changes this file: not the series' end
    before = snapshot(tree)
    assert "apply the whole series there first" in refused("new-one")
    assert snapshot(tree) == before
    disk(tree, CHAT).write_bytes(disk(tree, CHAT).read_bytes() + b"\0binary\n")
    before = snapshot(tree)
    assert "binary" in refused("new-one")
    assert snapshot(tree) == before


@pytest.mark.parametrize("odd", [b"\r", b"\x0c", b"\x1c", b"\xe2\x80\xa8"])
def test_a_captured_diff_cuts_lines_at_newlines_only(tmp_path: Path, odd: bytes) -> None:
    """The plain-tree diff (gitblob.file_diff) with an odd character inside a line at the
    edge of a hunk's context: `git apply` takes it and gives the new bytes."""
    from patchset.agent.lib.gitblob import file_diff
    lines = [b"line %d\n" % i for i in range(20)]
    lines[5] = b"left" + odd + b"right\n"
    old = b"".join(lines)
    lines[8] = b"changed\n"
    new = b"".join(lines)
    (tmp_path / "f.py").write_bytes(old)
    diff = file_diff("f.py", old, new, "100644")
    proc = subprocess.run(["git", "apply", "-p1", "-"], cwd=tmp_path, input=diff.encode(),
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode() + diff
    assert (tmp_path / "f.py").read_bytes() == new
