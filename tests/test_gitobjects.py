"""The engine's commit writer against git itself: the trees it writes are the trees git
writes for the same index (new directories, deletions that empty a directory, modes kept),
the objects pass `git fsck --strict`, and the commit text is what fast-import wrote (the
ids of the shipped series did not change when fast-import went)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from patchset.agent import gitobjects
from patchset.agent.engine import git_env

FILES = {"a/b/keep.py": b"keep\n", "a/b/edit.py": b"old\n", "a/gone/only.py": b"x\n",
         "run.sh": b"#!/bin/sh\n", "z.txt": b"z\n", "a.b/c": b"dot sorts before slash\n"}


def sh(cwd: Path, *args: str, data: bytes | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True,
                          check=True, env=git_env()).stdout.decode()


@pytest.fixture(params=["sha1", "sha256"])
def repo(request, tmp_path: Path) -> Path:
    root = tmp_path / "r"
    root.mkdir()
    sh(root, "init", "-q", f"--object-format={request.param}")
    for path, data in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    os.chmod(root / "run.sh", 0o755)
    sh(root, "add", "-A")
    sh(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return root


def writer(root: Path) -> gitobjects.Repository:
    objects, algorithm = sh(root, "rev-parse", "--git-path", "objects",
                            "--show-object-format").split()
    return gitobjects.Repository(root / objects, algorithm,
                                 gitobjects.cat_file_batch(root, git_env()))


CHANGES = {"a/b/edit.py": b"new\n", "a/gone/only.py": None, "a/new/deep/file.py": b"n\n",
           "run.sh": b"#!/bin/sh\necho\n"}


def test_trees_match_gits_own(repo: Path) -> None:
    base = sh(repo, "rev-parse", "HEAD").strip()
    objects = writer(repo)
    builder = gitobjects.Builder(objects, base, set(CHANGES))
    modes = {p: builder.mode(p) or "100644" for p in CHANGES}
    assert modes["run.sh"] == "100755" and modes["a/new/deep/file.py"] == "100644"
    for path, data in CHANGES.items():
        builder.change(path, objects.write("blob", data) if data is not None else None,
                       modes[path])
    tree = builder.write()
    # git's answer: the same edits through the index, then write-tree
    for path, data in CHANGES.items():
        if data is None:
            sh(repo, "rm", "-q", "--cached", path)
        else:
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_bytes(data)
            sh(repo, "add", path)
    assert tree == sh(repo, "write-tree").strip()
    assert "a/gone" not in sh(repo, "ls-tree", "-r", "-t", "--name-only", tree)
    commit = objects.write("commit", gitobjects.commit_text(
        tree, base, "patchset <patchset@localhost> 0 +0000", b"m\n"))
    sh(repo, "update-ref", "refs/heads/check", commit)
    sh(repo, "fsck", "--strict", "--no-dangling")
    assert sh(repo, "cat-file", "-t", commit).strip() == "commit"


def test_commit_ids_are_fast_imports(repo: Path, tmp_path: Path) -> None:
    """The same commit through `git fast-import` (what wrote the series before): same id."""
    base = sh(repo, "rev-parse", "HEAD").strip()
    objects = writer(repo)
    builder = gitobjects.Builder(objects, base, {"a/b/edit.py"})
    builder.change("a/b/edit.py", objects.write("blob", b"new\n"), "100644")
    who = "patchset <patchset@localhost> 1700000000 +0000"
    ours = objects.write("commit", gitobjects.commit_text(builder.write(), base, who,
                                                          b"p: s\n\nPatchset-Name: p\n"))
    message = b"p: s\n\nPatchset-Name: p\n"
    stream = (b"blob\nmark :1\ndata 4\nnew\n\n"
              + f"commit refs/heads/fi\nmark :2\nauthor {who}\ncommitter {who}\n".encode()
              + b"data %d\n" % len(message) + message
              + f"from {base}\nM 100644 :1 a/b/edit.py\n\n".encode())
    marks = tmp_path / "marks"
    sh(repo, "fast-import", "--quiet", f"--export-marks={marks}", data=stream)
    assert dict(line.split() for line in marks.read_text().splitlines())[":2"] == ours


def test_batch_reads_missing_and_odd_names(repo: Path) -> None:
    objects = writer(repo)
    base = sh(repo, "rev-parse", "HEAD").strip()
    trees = objects.trees(base, ["", "a", "no/such dir", "a.b"])
    assert set(trees[""]) == {"a", "a.b", "run.sh", "z.txt"} and trees["no/such dir"] == {}
    with pytest.raises(gitobjects.GitError):
        objects.trees(base, ["evil\n--batch-all-objects"])
    with pytest.raises(gitobjects.GitError):
        objects.commit(f"{base}^{{tree}}")


def test_snapshot_is_commit_and_trees_in_one_batch(repo: Path) -> None:
    """The writer's one read: the base commit and its trees along the paths, one process."""
    base = sh(repo, "rev-parse", "HEAD").strip()
    objects = writer(repo)
    calls: list[list[str]] = []
    batch = objects._batch
    objects._batch = lambda names: calls.append(names) or batch(names)
    raw, trees = objects.snapshot(base, ["", "a", "a/b", "no/such"])
    assert len(calls) == 1
    assert (base, raw) == objects.commit(base)
    assert trees == objects.trees(base, ["", "a", "a/b", "no/such"])
    builder = gitobjects.Builder(objects, base, {"a/b/edit.py"})
    assert builder.base_raw == raw and gitobjects.commit_time(raw) == \
        sh(repo, "log", "-1", "--format=%ct").strip()
    with pytest.raises(gitobjects.GitError, match="is not a commit"):
        objects.snapshot(f"{base}^{{tree}}", [""])


def test_builder_entries_are_the_written_commits(repo: Path) -> None:
    """entries() after write() is what `git ls-tree` says of the commit written (the
    engine resets the index from it): changed, deleted, new, untouched modes; a path the
    builder never read is unknown (None), not absent."""
    base = sh(repo, "rev-parse", "HEAD").strip()
    objects = writer(repo)
    builder = gitobjects.Builder(objects, base, set(CHANGES))
    for path, data in CHANGES.items():
        builder.change(path, objects.write("blob", data) if data is not None else None,
                       builder.mode(path) or "100644")
    tree = builder.write()
    listed = {}
    for line in sh(repo, "ls-tree", "-r", tree).splitlines():
        meta, path = line.split("\t", 1)
        mode, _, oid = meta.split()
        listed[path] = (mode, oid)
    assert builder.entries(sorted(CHANGES)) == {p: listed.get(p) for p in sorted(CHANGES)}
    assert builder.entries(["a/gone/only.py"]) == {"a/gone/only.py": None}
    assert builder.entries(["a/b/keep.py"]) is None
