"""Patches that delete or create files (issue 25, class 5).

Supported, exactly, on git and plain trees, locally and over SSH (a real host's git tree:
tests/system/test_hardening_deletions_hosts.py): a deleted file is gone after `apply` with
the directories that leaves empty (as `git apply` does), and back byte for byte with its
mode after `revert`; a created file (in a new directory) is there after `apply`, and gone
with that directory after `revert`; `status` is clean after each, and the whole tree after
the revert is the tree before the apply.

Refused by `check` (and so by every command that reads the series): a mode change, and
creating or deleting an executable (100755) file, whose mode could not be restored
exactly (the switch keeps each file's mode and a plain tree records none). Renames and
copies were already refused (`git diff --no-renames`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
import yaml

from patchset.connect.local import LocalTransport
from patchset import api
from patchset.cli import main
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, plan
from patchset.pin.upstream import materialize
from tests.seriesfactory import PIN_YAML, git, header

GONE = "python/sglang/jit_kernel/dsv4/utils.py"                       # 100644, 62 bytes
ALONE = "python/sglang/srt/constrained/torch_ops/token_filter_torch_ops.py"  # alone in its dir
CREATED = "python/sglang/srt/patchset_new/added.py"                   # in a new directory
EXECUTABLE = "python/sglang/srt/layers/amx_utils.py"                  # 100755 at the pin


def entry(name: str) -> dict:
    return {"name": name, "file": f"patches/{name}.patch", "summary": f"test {name}",
            "tier": "safe", "path": "both", "gate": None, "requires": [], "depends": [],
            "conflicts": [], "upstream_status": "pending"}


def write_series(pinned_base, root: Path, change) -> Path:
    """root/patches.yaml with one patch `files`: `change(work)` edits a scratch clone of
    the pin, the patch is its `git diff --full-index`."""
    work = root.parent / f"{root.name}-authoring"
    materialize(pinned_base, work, layout="git")
    change(work)
    git(work, "add", "-A")
    diff = git(work, "diff", "--cached", "--full-index", "--no-color", "--no-renames")
    (root / "patches").mkdir(parents=True, exist_ok=True)
    (root / "patches" / "files.patch").write_text(header("files") + diff)
    manifest = root / "patches.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "upstream": PIN_YAML,
                                        "series": [entry("files")]}, sort_keys=False))
    return manifest


def delete_and_create(work: Path) -> None:
    (work / GONE).unlink()
    (work / ALONE).unlink()
    (work / CREATED).parent.mkdir()
    (work / CREATED).write_text("ADDED = True\n")


def disk(tree: Path, path: str) -> Path:
    return tree / path if (tree / "python").is_dir() else tree / path[len("python/"):]


def snapshot(tree: Path) -> dict[str, tuple]:
    """Every directory and file of the tree but .git and .patchset: mode, content digest."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", ".patchset"))
        out[os.path.relpath(dirpath, tree)] = ("dir", stat.S_IMODE(os.lstat(dirpath).st_mode))
        for name in filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            with open(path, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            out[os.path.relpath(path, tree)] = (info.st_mode, digest)
    return out


def assert_clean(series, tree: Path) -> None:
    record = api.status(series, LocalTransport(tree)).record
    assert record.drift == [] and record.dirty == [] and record.interrupted is None
    if (tree / ".git").exists():
        assert git(tree, "status", "--porcelain", "--untracked-files=all") == ""


@pytest.mark.parametrize("layout", ["git", "wheel"])
def test_deletion_and_creation_apply_and_revert_exactly(layout: str, pinned_base,
                                                        tmp_path: Path) -> None:
    series = load_series(write_series(pinned_base, tmp_path / "series", delete_and_create))
    tree = materialize(pinned_base, tmp_path / "tree", layout=layout)
    before = snapshot(tree)

    [applied] = api.apply(series, plan(series, Selection()), [LocalTransport(tree)])
    assert applied.ok, applied.error
    assert not disk(tree, GONE).exists() and disk(tree, GONE).parent.is_dir()
    assert not disk(tree, ALONE).parent.exists()          # emptied: removed, as git does
    assert disk(tree, CREATED).read_text() == "ADDED = True\n"
    assert stat.S_IMODE(disk(tree, CREATED).stat().st_mode) == 0o644
    assert_clean(series, tree)

    reverted = api.revert(series, ["files"], LocalTransport(tree))
    assert reverted.ok, reverted.error
    assert snapshot(tree) == before                       # bytes, modes, no new directory
    assert_clean(series, tree)

    [again] = api.apply(series, plan(series, Selection()), [LocalTransport(tree)])
    assert again.ok and not disk(tree, GONE).exists() and disk(tree, CREATED).is_file()
    assert_clean(series, tree)


def mode_change(work: Path) -> None:
    os.chmod(work / GONE, 0o755)


def new_executable(work: Path) -> None:
    (work / CREATED).parent.mkdir()
    (work / CREATED).write_text("ADDED = True\n")
    os.chmod(work / CREATED, 0o755)


def deleted_executable(work: Path) -> None:
    (work / EXECUTABLE).unlink()


@pytest.mark.parametrize("change,message", [
    (mode_change, "mode changes are not supported"),
    (new_executable, "creating or deleting an executable file is not supported"),
    (deleted_executable, "creating or deleting an executable file is not supported"),
], ids=["mode-change", "new-executable", "deleted-executable"])
def test_check_refuses_what_cannot_revert_exactly(change, message: str, pinned_base,
                                                  tmp_path: Path, monkeypatch,
                                                  capsys) -> None:
    root = tmp_path / "series"
    write_series(pinned_base, root, change)
    monkeypatch.chdir(root)
    monkeypatch.setenv("PATCHSET_HOME", str(tmp_path / "home"))
    for argv in (["check"], ["apply", "localhost"], ["show", "files"]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2, (argv, out, err)
        assert "patches/files.patch:" in err and "diff.mode" in err and message in err, err
    assert not (tmp_path / "home").exists()
