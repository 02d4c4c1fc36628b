"""Quilt export/import and git-range import, against the real pin and the real series."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.seriesfactory import CHAT, DSV4, append_line, git

from patchset.cli import main
from patchset.series.manifest import load_series

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def body(text: str) -> str:
    """The diff part of a patch file (from the first `diff --git`)."""
    return text[text.index("diff --git "):]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture()
def empty_series(tmp_path: Path, patchset_home: Path, pinned_base) -> Path:
    """A series with the real pin and no patches, to import into."""
    head = (ROOT / "patches.yaml").read_text().split("\nseries:")[0]
    root = tmp_path / "imported"
    root.mkdir()
    (root / "patches.yaml").write_text(head + "\nseries: []\n")
    return root / "patches.yaml"


def blob(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_round_trip_real_series_through_quilt(tmp_path: Path, empty_series: Path,
                                              pinned_base, capsys) -> None:
    quilt_dir = tmp_path / "quilt"
    code, out, err = run(capsys, "export", "--quilt", str(quilt_dir), "--json",
                         "--series", str(ROOT / "patches.yaml"))
    assert code == 0, err
    real = load_series(ROOT / "patches.yaml")
    names = [f"{p.name}.patch" for p in real.patches]
    assert json.loads(out)["patches"] == names
    assert (quilt_dir / "series").read_text().split() == names

    # quilt itself applies it on a plain tree of the pin, every post-image exact.
    from patchset.pin.upstream import materialize
    tree = materialize(pinned_base, tmp_path / "plain", layout="git")
    shutil.rmtree(tree / ".git")
    env = {**os.environ, "QUILT_PATCHES": str(quilt_dir), "LC_ALL": "C"}
    proc = subprocess.run(["quilt", "--quiltrc", "-", "push", "-a"], cwd=tree, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    final = {c.path: c.post for p in real.patches for c in p.files}
    assert {path: blob(tree / path) for path in final} == final

    code, out, err = run(capsys, "import", "--quilt", str(quilt_dir), "--offline", "--json",
                         "--series", str(empty_series))
    assert code == 0, err
    imported = load_series(empty_series)
    assert [p.name for p in imported.patches] == [p.name for p in real.patches]
    for mine, theirs in zip(imported.patches, real.patches):
        ours = (empty_series.parent / mine.file).read_text()
        assert body(ours) == body((ROOT / theirs.file).read_text())
        assert mine.tier == "risky" and mine.path == "both" and mine.upstream_status == "pending"
    by_name = imported.by_name()
    assert by_name["indexer-bf16-gemm"].depends == ("triton-dsa-indexer",)
    assert not any(p["rediffed"] for p in json.loads(out)["patches"])


def test_export_refuses_a_non_empty_directory(tmp_path: Path, capsys) -> None:
    target = tmp_path / "q"
    target.mkdir()
    (target / "keep").write_text("x")
    code, out, err = run(capsys, "export", "--quilt", str(target),
                         "--series", str(ROOT / "patches.yaml"))
    assert code == 2 and out == "" and "not empty" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in target.iterdir()] == ["keep"]
    code, _, _ = run(capsys, "export", "--quilt", str(target), "--force",
                     "--series", str(ROOT / "patches.yaml"))
    assert code == 0 and (target / "series").is_file()


def test_quilt_patch_without_full_index_is_rediffed(tmp_path: Path, series_dir: Path,
                                                    empty_series: Path, capsys) -> None:
    """A plain `diff -u`-style patch with a free-text header becomes the project's format."""
    original = (series_dir / "patches" / "chat-a.patch").read_text()
    plain = "\n".join(line for line in body(original).split("\n")
                      if not line.startswith(("diff --git ", "index ")))
    quilt_dir = tmp_path / "q"
    quilt_dir.mkdir()
    (quilt_dir / "0001-Fix_Chat-thing!.diff").write_text(
        "Fix the chat handler\n\nSome free text.\n\n" + plain)
    (quilt_dir / "series").write_text("# comment\n0001-Fix_Chat-thing!.diff -p1\n")
    code, out, err = run(capsys, "import", "--quilt", str(quilt_dir), "--offline",
                         "--series", str(empty_series))
    assert code == 2 and "header.Author" in err and "--author" in err
    code, out, err = run(capsys, "import", "--quilt", str(quilt_dir), "--offline", "--json",
                         "--author", "Jane <jane@example.invalid>", "--tier", "safe",
                         "--path", "decode", "--series", str(empty_series))
    assert code == 0, err
    [entry] = json.loads(out)["patches"]
    assert entry["name"] == "fix-chat-thing" and entry["rediffed"] is True
    [patch] = load_series(empty_series).patches
    text = (empty_series.parent / patch.file).read_text()
    assert body(text) == body(original)
    assert text.startswith("Description: Fix the chat handler\n Some free text.\n"
                           "Author: Jane <jane@example.invalid>\n")
    assert patch.tier == "safe" and patch.path == "decode"


def test_bad_import_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, series_dir: Path,
                                                          capsys) -> None:
    """Re-importing the series on top of itself cannot apply: nothing is written."""
    quilt_dir = tmp_path / "q"
    manifest = series_dir / "patches.yaml"
    assert run(capsys, "export", "--quilt", str(quilt_dir), "--series", str(manifest))[0] == 0
    before = snapshot(series_dir)
    code, out, err = run(capsys, "import", "--quilt", str(quilt_dir), "--offline",
                         "--series", str(manifest))
    assert code == 2 and out == ""
    [line] = [x for x in err.strip().splitlines() if not x.startswith("materialize ")]
    assert line.startswith(f"patchset: error: {quilt_dir / 'chat-a.patch'}: diff: does not apply")
    assert snapshot(series_dir) == before

    (quilt_dir / "series").write_text("ghost.patch\n")
    code, _, err = run(capsys, "import", "--quilt", str(quilt_dir), "--offline",
                       "--series", str(manifest))
    assert code == 2 and "series:1: series: 'ghost.patch': no such patch file" in err
    code, _, err = run(capsys, "import", "--quilt", str(quilt_dir), "--tier", "wild",
                       "--series", str(manifest))
    assert code == 2 and "--tier 'wild'" in err
    assert snapshot(series_dir) == before


def test_git_range_per_commit_and_split(tmp_path: Path, pinned_base, empty_series: Path,
                                        capsys) -> None:
    from patchset.pin.upstream import materialize
    repo = materialize(pinned_base, tmp_path / "repo", layout="git")
    base = git(repo, "rev-parse", "HEAD").strip()
    for path, line in ((CHAT, "# first"), (DSV4, "# first")):
        (repo / path).write_text(append_line("import ", line)((repo / path).read_text()))
    git(repo, "commit", "-qam", "Chat and model: first edit\n\nWhy it matters.\n\nMore.")
    (repo / CHAT).write_text(append_line("# first", "# second")((repo / CHAT).read_text()))
    git(repo, "commit", "-qam", "Chat and model: first edit")     # same subject: unique name
    split = tmp_path / "split"
    shutil.copytree(empty_series.parent, split)

    code, out, err = run(capsys, "import", "--git", str(repo), f"{base}..HEAD", "--offline",
                         "--json", "--series", str(empty_series))
    assert code == 0, err
    first, second = load_series(empty_series).patches
    assert (first.name, second.name) == ("chat-and-model-first-edit", "chat-and-model-first-edit-2")
    assert second.depends == (first.name,)
    assert body((empty_series.parent / first.file).read_text()) == git(
        repo, "diff", "--full-index", "--no-renames", f"{base}", "HEAD~1")
    header = (empty_series.parent / first.file).read_text().split("\n\n")[0]
    assert "Description: Chat and model: first edit\n Why it matters.\n .\n More." in header

    code, out, err = run(capsys, "import", "--git", str(repo), f"{base}..HEAD", "--split",
                         "--offline", "--series", str(split / "patches.yaml"))
    assert code == 0, err
    names = [p.name for p in load_series(split / "patches.yaml").patches]
    assert names == ["chat-and-model-first-edit-serving-chat",
                     "chat-and-model-first-edit-deepseek-v4",
                     "chat-and-model-first-edit-serving-chat-2"]
    code, out, err = run(capsys, "check", "--offline", "--series", str(split / "patches.yaml"))
    assert code == 0, out + err


def test_git_format_patch_files_as_a_quilt_series(tmp_path: Path, pinned_base,
                                                  empty_series: Path, capsys) -> None:
    """Mail-style patches (short index, diffstat, signature) come in re-diffed, with the
    Subject as Description and From as Author."""
    from patchset.pin.upstream import materialize
    repo = materialize(pinned_base, tmp_path / "repo", layout="git")
    (repo / CHAT).write_text(append_line("import ", "# mailed")((repo / CHAT).read_text()))
    git(repo, "commit", "-qam", "Mailed fix\n\nBody line.", "--author",
        "Mail Author <mail@example.invalid>")
    quilt_dir = tmp_path / "mail"
    git(repo, "format-patch", "-q", "-1", "HEAD", "-o", str(quilt_dir))
    [name] = [p.name for p in quilt_dir.iterdir()]
    (quilt_dir / "series").write_text(name + "\n")
    code, out, err = run(capsys, "import", "--quilt", str(quilt_dir), "--offline",
                         "--series", str(empty_series))
    assert code == 0, err
    [patch] = load_series(empty_series).patches
    text = (empty_series.parent / patch.file).read_text()
    assert patch.name == "mailed-fix"
    assert text.startswith("Description: Mailed fix\n Body line.\n"
                           "Author: Mail Author <mail@example.invalid>\n")
    assert body(text) == git(repo, "diff", "--full-index", "--no-renames", "HEAD~1", "HEAD")
