"""The series' commits, written as loose git objects from Python.

Why not `git fast-import`: for six patches it cost 20 ms of start-up plus 30 ms of its
`unpack-objects` child, a third of a whole `patchset apply`. What is needed is small: the
base commit's trees along the touched paths (one `git cat-file --batch`), new blobs, trees
and commits (zlib + the repository's hash), and no ref at all until the journal's switch
moves HEAD. The objects are byte for byte what fast-import wrote (same tree order, same
commit text), so a series gets the same commit ids as before and on every machine.

Like git's own default (core.fsync leaves loose objects out), objects are not fsynced;
the engine's journal and roll-forward cover a killed process, whose writes the kernel
keeps.
"""

from __future__ import annotations

import hashlib
import subprocess
import zlib
from pathlib import Path
from typing import Callable

from . import safewrite
from .protocol import ended, killed

TREE_MODE = "40000"
Entry = tuple[str, str]                      # (mode, hex object id) of one tree entry
Tree = dict[str, Entry]                      # name -> entry
Change = tuple[str, str, "bytes | None"]     # (git path, mode, content or None: deleted)


class GitError(Exception):
    """A repository this writer cannot read (the engine maps it to its own error)."""


class Repository:
    """The object side of one git checkout: read its trees, write new objects."""

    def __init__(self, objects: Path, algorithm: str,
                 batch: Callable[[list[str]], list[tuple[str, str, bytes] | None]]) -> None:
        if algorithm not in ("sha1", "sha256"):
            raise GitError(f"object format {algorithm!r} is not supported")
        self.objects = objects
        self.algorithm = algorithm
        self._batch = batch

    # ------------------------------------------------------------ writing
    def write(self, kind: str, data: bytes) -> str:
        """Store one object as a loose file; an object already there is left as it is."""
        raw = b"%s %d\0" % (kind.encode(), len(data)) + data
        oid = hashlib.new(self.algorithm, raw).hexdigest()
        path = self.objects / oid[:2] / oid[2:]
        if not path.exists():                          # git's core.looseCompression default
            safewrite.write_file(path, zlib.compress(raw, 1), 0o444, root=self.objects,
                                 durable=False)
        return oid

    def write_tree(self, tree: Tree) -> str:
        def order(name: str) -> bytes:
            return name.encode() + (b"/" if tree[name][0] == TREE_MODE else b"")
        body = b"".join(f"{tree[n][0]} {n}".encode() + b"\0" + bytes.fromhex(tree[n][1])
                        for n in sorted(tree, key=order))
        return self.write("tree", body)

    # ------------------------------------------------------------ reading
    def commit(self, rev: str) -> tuple[str, bytes]:
        """(oid, raw commit text) of `rev`."""
        [found] = self._batch([rev])
        if found is None or found[1] != "commit":
            raise GitError(f"{rev} is not a commit")
        return found[0], found[2]

    def trees(self, commit: str, dirs: list[str]) -> dict[str, Tree]:
        """Each directory's tree at `commit` ("" is the root); a missing one is empty."""
        return self._parse_trees(dirs, self._batch(_tree_names(commit, dirs)))

    def snapshot(self, commit: str, dirs: list[str]) -> tuple[bytes, dict[str, Tree]]:
        """commit() and trees() in one batch: a `git cat-file` process costs more than
        everything it reads for a series, and the writer needs both before it starts."""
        found = self._batch([commit] + _tree_names(commit, dirs))
        if found[0] is None or found[0][1] != "commit":
            raise GitError(f"{commit} is not a commit")
        return found[0][2], self._parse_trees(dirs, found[1:])

    def _parse_trees(self, dirs: list[str],
                     found: list[tuple[str, str, bytes] | None]) -> dict[str, Tree]:
        return {d: (parse_tree(obj[2], self.algorithm) if obj and obj[1] == "tree" else {})
                for d, obj in zip(dirs, found)}


def _tree_names(commit: str, dirs: list[str]) -> list[str]:
    """The batch names of each directory's tree at `commit` ("" is the root)."""
    return [f"{commit}^{{tree}}" if d == "" else f"{commit}:{d}" for d in dirs]


def parse_tree(data: bytes, algorithm: str) -> Tree:
    size = hashlib.new(algorithm).digest_size
    out: Tree = {}
    at = 0
    while at < len(data):
        space = data.index(b" ", at)
        nul = data.index(b"\0", space)
        mode, name = data[at:space].decode(), data[space + 1:nul].decode("utf-8", "surrogateescape")
        out[name] = (mode, data[nul + 1:nul + 1 + size].hex())
        at = nul + 1 + size
    return out


def commit_time(raw: bytes) -> str:
    """The committer's raw date ("SECONDS +ZONE") of a commit."""
    for line in raw.split(b"\n\n", 1)[0].split(b"\n"):
        if line.startswith(b"committer "):
            seconds, _zone = line.rsplit(b" ", 2)[-2:]
            return seconds.decode()
    raise GitError("commit has no committer line")


def parents(path: str) -> list[str]:
    """"a/b/c.py" -> ["", "a", "a/b"]: the directories whose trees hold it."""
    parts = path.split("/")[:-1]
    return [""] + ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


class Builder:
    """Trees of a commit chain, changed in memory step by step, written per commit."""

    def __init__(self, repo: Repository, base: str, paths: set[str]) -> None:
        self.repo = repo
        self.paths = set(paths)
        self.dirs = sorted({d for p in paths for d in parents(p)}, key=lambda d: d.count("/"))
        self.base_raw, self.trees = repo.snapshot(base, self.dirs)   # base's commit text

    def mode(self, path: str) -> str | None:
        entry = self.entry(path)
        return entry[0] if entry else None

    def entry(self, path: str) -> Entry | None:
        """`path`'s (mode, id) in the trees as they are now: after write(), the trees of
        the commit just written (None: no such entry)."""
        directory, _, name = path.rpartition("/")
        return self.trees[directory].get(name)

    def entries(self, paths: list[str]) -> dict[str, Entry | None] | None:
        """entry() of each of `paths`, or None if one is not a path this builder tracks
        (its directory was never read, so its entry is unknown, not absent)."""
        if not set(paths) <= self.paths:
            return None
        return {p: self.entry(p) for p in paths}

    def change(self, path: str, oid: str | None, mode: str) -> None:
        directory, _, name = path.rpartition("/")
        if oid is None:
            self.trees[directory].pop(name, None)
        else:
            self.trees[directory][name] = (mode, oid)

    def write(self) -> str:
        """Write every directory's tree, deepest first, linking each into its parent;
        an empty one is dropped from its parent, as git keeps no empty trees."""
        for directory in sorted(self.dirs, key=lambda d: -d.count("/")):
            if directory == "":
                continue
            parent, _, name = directory.rpartition("/")
            tree = self.trees[directory]
            if tree:
                self.trees[parent][name] = (TREE_MODE, self.repo.write_tree(tree))
            else:
                self.trees[parent].pop(name, None)
        return self.repo.write_tree(self.trees[""])


def commit_text(tree: str, parent: str, who: str, message: bytes) -> bytes:
    return (f"tree {tree}\nparent {parent}\nauthor {who}\ncommitter {who}\n\n".encode()
            + message)


def cat_file_batch(root: Path, env: dict[str, str]) -> Callable[[list[str]],
                                                               list[tuple[str, str, bytes] | None]]:
    """A reader for `git cat-file --batch`: one process per call, all names at once.
    Names are revisions the engine made ("COMMIT:dir"), passed on stdin, never as options."""
    def batch(names: list[str]) -> list[tuple[str, str, bytes] | None]:
        if any("\n" in n for n in names):
            raise GitError("a path with a newline cannot be read")
        proc = subprocess.run(["git", "cat-file", "--batch"], cwd=root, env=env,
                              input="".join(f"{n}\n" for n in names).encode(),
                              capture_output=True)
        if proc.returncode != 0:
            stderr = proc.stderr.decode(errors="replace").strip()
            raise GitError(f"git cat-file {ended(proc.returncode)}"
                           if killed(proc.returncode) or not stderr else stderr)
        return _parse_batch(proc.stdout, len(names))
    return batch


def _parse_batch(out: bytes, count: int) -> list[tuple[str, str, bytes] | None]:
    found: list[tuple[str, str, bytes] | None] = []
    at = 0
    for _ in range(count):
        end = out.index(b"\n", at)
        header = out[at:end].decode(errors="replace").split()
        at = end + 1
        if len(header) != 3 or header[1] not in ("blob", "tree", "commit", "tag"):
            found.append(None)                # "<name> missing" / "ambiguous"
            continue
        size = int(header[2])
        found.append((header[0], header[1], out[at:at + size]))
        at += size + 1
    return found
