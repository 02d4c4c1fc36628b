"""`adopt` on a host: read an unmanaged tree the server imports, then put it under
management without changing one byte of it.

Two ops (stdlib only, like the whole agent), each a request and a result record:

- `inventory` (read-only): every served file of the package with its git blob id; for a
  git checkout (the served tree, or `checkout` beside a site-packages install) its HEAD,
  the merge-base with the pin commit and each first-parent commit after it that changes
  a package file, with its diff; every entry of the package that is not a regular file
  (a link, a FIFO: `special`, never taken for absent), the executable ones; and the bytes
  of the files the controller asks for (`read`: served and at HEAD), each bounded, the
  ones left for the next request (`deferred`) or refused (`not_read`) named, never
  dropped.
- `adopt` (writes .patchset/ only): hashes every served file, refuses a managed tree, a
  .patchset or state.json that is a link or not what it should be, or a tree that is not
  what the controller planned on, records the state (base pre-images and patch copies for
  revert), hashes again; any difference or failure removes exactly what it made (files,
  directories, the base ref, the exclude line).

Why its own module: the adoption ops are new and the other ops' records live in
records.py; these records are the wire of these two ops only.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

from .lib import bounded
from . import engine
from .lib.gitenv import run_git
from .lib.wire import (AdoptRequest, AdoptResult, Commit, Failure, GitFacts, InventoryRequest,
                       InventoryResult, Request, WireError, op_function)
from .lib.protocol import Events
from .lib.records import TreeState

SKIP_DIRS = ("__pycache__",)
SKIP_SUFFIXES = (".pyc", ".pyo")
READ_LIMIT = 512                     # files whose bytes one inventory returns
READ_BYTES = 16 * bounded.MIB        # ... and their bytes together (the rest: deferred)
FILE_LIMIT = 4 * bounded.MIB         # one file's bytes (a patch file's bound: inputfile)
COMMIT_LIMIT = 500                   # package commits after the base one inventory lists
HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


# The records (InventoryRequest/Result, AdoptRequest/Result, GitFacts, Commit) are the
# wire's (wire.py), like every op's.

# ---------------------------------------------------------------- reading

def served_files(target: engine.Target) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """What the server imports of the package: git path -> blob id of every regular file
    (bytecode caches left out: the interpreter writes those itself); git path -> what it
    is of every other entry (a link, to a file or a directory, a FIFO, a device: never
    read, never taken for absent); and the executable regular files."""
    top = target.disk(f"{target.prefix}{target.package}")
    scope = f"{target.prefix}{target.package}"
    files: dict[str, str] = {}
    special: dict[str, str] = {}
    executable: list[str] = []
    if os.path.islink(top):
        return files, {scope: "a symbolic link (the package directory itself)"}, executable
    for folder, dirs, names in os.walk(top):
        for name in list(dirs):
            path = Path(folder) / name
            if path.is_symlink():
                special[f"{scope}/{path.relative_to(top).as_posix()}"] = "a symbolic link"
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS
                         and not (Path(folder) / d).is_symlink())
        for name in names:
            path = Path(folder) / name
            if name.endswith(SKIP_SUFFIXES):
                continue
            rel = f"{scope}/{path.relative_to(top).as_posix()}"
            mode = os.lstat(path).st_mode
            if not stat.S_ISREG(mode):
                special[rel] = _describe(mode)
                continue
            files[rel] = _blob_of(path)
            if mode & 0o111:
                executable.append(rel)
    return files, special, sorted(executable)


def _blob_of(path: Path) -> str:
    """The git blob id of a regular file, read in chunks (a huge file costs time, never
    memory), opened without following a link or blocking on a FIFO swapped in."""
    import hashlib
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(str(path), flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise engine.EngineError(f"{path} changed while it was read (now "
                                     f"{_describe(info.st_mode)}): run adopt again", "target")
        digest = hashlib.sha1(b"blob %d\0" % info.st_size)
        seen = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            seen += len(chunk)
    finally:
        os.close(fd)
    if seen != info.st_size:
        raise engine.EngineError(f"{path} changed while it was read: run adopt again",
                                 "target")
    return digest.hexdigest()


def _describe(mode: int) -> str:
    from .lib.safewrite import describe
    return "a regular file" if stat.S_ISREG(mode) else describe(mode)


def op_inventory(req: InventoryRequest, bundle: Path) -> InventoryResult:
    target = engine.Target(req.target, req.git_prefix, req.package)
    files, special, executable = served_files(target)
    checkout = Path(req.checkout) if req.checkout else (target.root if target.is_git
                                                        else installed_from(target))
    facts = _git_facts(checkout, req) if checkout is not None else None
    scope = f"{req.git_prefix}{req.package}/"
    served: dict[str, str | None] = {}
    at_head: dict[str, str | None] = {}
    not_read: dict[str, str] = {}
    deferred: list[str] = []
    total = 0
    for path in req.read:
        if not path.startswith(scope) or ".." in path.split("/") or "\0" in path:
            not_read[path] = "not a path of the package"
        elif len(served) >= READ_LIMIT or total >= READ_BYTES:
            deferred.append(path)          # the controller asks again: never dropped
        else:
            try:
                served[path] = _text(target.disk(path))
                at_head[path] = _at_head(checkout, path) if facts and checkout else None
            except _TooBig as exc:
                served.pop(path, None)
                not_read[path] = str(exc)
                continue
            total += sum(len(t) for t in (served[path], at_head[path]) if t)
    return InventoryResult(str(target.root), "git" if target.is_git else "plain",
                           target.layout, _managed(target), files, facts,
                           served, at_head if facts else {}, special, executable,
                           not_read, deferred)


def installed_from(target: engine.Target) -> Path | None:
    """The git checkout a site-packages install came from, as pip recorded it
    (PACKAGE-*.dist-info/direct_url.json, PEP 610: a local directory), else None."""
    import json
    from urllib.parse import unquote, urlparse
    for record in sorted(target.root.glob(f"{target.package}-*.dist-info/direct_url.json")):
        try:
            url = urlparse(json.loads(record.read_text(encoding="utf-8"))["url"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if url.scheme != "file":
            continue
        for where in (Path(unquote(url.path)), *Path(unquote(url.path)).parents):
            if (where / ".git").exists():
                return where
    return None


class _TooBig(Exception):
    """A file larger than FILE_LIMIT: named in not_read, never read whole."""


def _text(path: Path) -> str | None:
    """File bytes as latin-1 text (lossless through JSON); None: no such file. Only a
    regular file, at most FILE_LIMIT bytes (bounded: a FIFO or a huge file is refused)."""
    try:
        return bounded.read_bytes(path, FILE_LIMIT, "served file").decode("latin-1")
    except bounded.Missing:
        return None
    except bounded.InputError as exc:
        raise _TooBig(exc.message) from None


def _at_head(checkout: Path, path: str) -> str | None:
    size = run_git(["cat-file", "-s", f"HEAD:{path}"], checkout)
    if size.returncode != 0:
        return None
    if int(size.stdout.decode().strip() or 0) > FILE_LIMIT:
        raise _TooBig(f"larger than {bounded.size_text(FILE_LIMIT)} at HEAD")
    proc = run_git(["cat-file", "blob", f"HEAD:{path}"], checkout)
    return proc.stdout.decode("latin-1") if proc.returncode == 0 else None


def _git_facts(root: Path, req: InventoryRequest) -> GitFacts:
    if not (root / ".git").exists():
        raise engine.EngineError(f"{root} is not a git checkout", "usage")
    head = engine.git(root, "rev-parse", "HEAD").strip()
    base, why = _merge_base(root, head, req.pin_commit)
    scope = f"{req.git_prefix}{req.package}/"
    commits, more = [], 0
    if base is not None:
        ids, touching = _package_commits(root, base, head, scope)
        more = max(0, len(touching) - COMMIT_LIMIT)
        listed = dict(list(touching.items())[:COMMIT_LIMIT])
        others = [c for c in ids if c not in touching][:COMMIT_LIMIT]   # shown, not read
        subjects = _subjects(root, base, head) if others else {}
        commits = [_commit(root, c, listed[c], scope) if c in listed
                   else Commit(c, subjects.get(c, ""), "", "", "", [])
                   for c in ids if c in listed or c in others]
    listing = engine.git(root, "ls-tree", "-r", "-z", "--full-tree", "HEAD", "--", scope,
                         env=engine.LITERAL)
    head_files = {}
    for record in filter(None, listing.split("\0")):
        meta, path = record.split("\t", 1)
        if meta.split()[1] == "blob":
            head_files[path] = meta.split()[2]
    dirty = engine.git(root, "status", "--porcelain=v1", "--untracked-files=no",
                       env={"GIT_OPTIONAL_LOCKS": "0"}).splitlines()
    return GitFacts(str(root), head, base, why, commits, head_files,
                    [d[3:] for d in dirty if d.strip()], more)


def _package_commits(root: Path, base: str, head: str,
                     scope: str) -> tuple[list[str], dict[str, list[str]]]:
    """Each first-parent commit after the base, oldest first, and of those the ones that
    change a package file against their first parent, with those files: the limit counts
    only these (a fork with thousands of commits elsewhere loses none of its package
    commits)."""
    parents = [line.split() for line in engine.git(
        root, "rev-list", "--first-parent", "--reverse", "--parents",
        f"{base}..{head}").splitlines()]
    ids = [p[0] for p in parents if len(p) > 1]
    if not ids:
        return [], {}
    lines = "".join(f"{p[0]} {p[1]}\n" for p in parents if len(p) > 1)
    out = engine.git(root, "diff-tree", "--stdin", "-r", "-z", "--name-only", "--no-renames",
                     "--", scope, data=lines.encode(), env=engine.LITERAL)
    found: dict[str, list[str]] = {}
    current = None
    wanted = set(ids)
    for token in filter(None, out.split("\0")):
        if token in wanted:
            current = token
            found[current] = []
        elif current is not None:
            found[current].append(token)
    return ids, {c: sorted(found[c]) for c in ids if c in found}


def _subjects(root: Path, base: str, head: str) -> dict[str, str]:
    listing = engine.git(root, "log", "--first-parent", "--format=%H%x01%s", f"{base}..{head}")
    return dict(line.split("\x01", 1) for line in listing.splitlines() if "\x01" in line)


def _merge_base(root: Path, head: str, pin: str | None) -> tuple[str | None, str]:
    if not pin:
        return None, "no pin commit given"
    found = run_git(["cat-file", "-e", f"{pin}^{{commit}}"], root)
    if found.returncode != 0:
        return None, f"the pin commit {pin[:12]} is not in {root}"
    base = engine.git(root, "merge-base", head, pin).strip()
    return base, f"git merge-base HEAD {pin[:12]} in {root}"


def _commit(root: Path, commit: str, files: list[str], scope: str) -> Commit:
    message = engine.git(root, "log", "-1", "--format=%an <%ae>%x00%s%x00%b", commit)
    author, subject, body = (message.split("\0", 2) + ["", ""])[:3]
    diff = engine.git(root, "diff", "--full-index", "--no-color", "--no-renames", "-U3",
                      f"{commit}^1", commit, "--", scope, env=engine.LITERAL)
    return Commit(commit, subject.strip(), body.strip(), diff, author.strip(), files)


# ---------------------------------------------------------------- adopting

def op_adopt(req: AdoptRequest, bundle: Path) -> AdoptResult:
    """Record the state; the served files are hashed before and after, and any difference
    (or failure) removes exactly what this op made, so the tree is as it was."""
    target = engine.Target(req.target, req.git_prefix, req.package)
    _check_meta(target)
    state = TreeState.from_json(req.state, "the adopt request")
    commit = state.base.get("commit") if isinstance(state.base, dict) else None
    if not isinstance(commit, str) or not HEX.fullmatch(commit):
        raise engine.EngineError("the adopt request: state.base.commit must be a commit id "
                                 f"(40 or 64 hex digits), got {str(commit)[:80]!r}", "usage")
    if target.is_git and run_git(["cat-file", "-e", f"{commit}^{{commit}}"],
                                 target.root).returncode != 0:
        raise engine.EngineError(f"{target.root}: the base commit {commit[:12]} is not in this "
                                 "checkout (fetch the pin and rebase onto it; nothing was "
                                 "changed)", "usage")
    before, special, _ = served_files(target)
    if special:
        first = sorted(special)[0]
        raise engine.EngineError(f"{target.root}: {first} is {special[first]}: adopt compares "
                                 "only regular files (nothing was changed)", "usage")
    moved = sorted(p for p in set(before) | set(req.expected)
                   if before.get(p) != req.expected.get(p))
    if moved:
        raise engine.EngineError(f"{target.root} changed since the plan was made "
                                 f"({', '.join(moved[:5])}): run adopt again (nothing was "
                                 "changed)", "usage")
    state.updated = last_change(target)
    made = _Made()
    try:
        _record(target, state, req, bundle, made)
        after = served_files(target)
        if after[0] != before or after[1]:
            raise engine.EngineError(f"{target.root}: served files changed while adopting; "
                                     "the management state was removed", "target")
    except BaseException as exc:
        problem = made.undo(target)
        if problem and isinstance(exc, engine.EngineError):
            exc.details = (exc.details + "\n" if exc.details else "") + problem
        raise
    return AdoptResult(str(target.root), len(before), True, state.names())


def _check_meta(target: engine.Target) -> None:
    """Before anything is written: not managed, and .patchset (a killed adopt's may be
    there) a real directory whose state.json, objects/ and patches/ are absent or what
    they should be; a link is never written through."""
    if _managed(target):
        raise engine.EngineError(f"{target.root} is already managed by patchset; adopt "
                                 "takes an unmanaged tree (nothing was changed)", "usage")


def _managed(target: engine.Target) -> bool:
    """Whether the tree holds a state record (a regular state.json); a .patchset, its
    state.json, objects/ or patches/ that is a link or the wrong kind is refused (usage),
    for the dry run too: it is named, never taken for managed or for absent."""
    checks = [(target.meta, stat.S_ISDIR, "a directory"),
              (target.state_file, None, ""),
              (target.meta / "objects", stat.S_ISDIR, "a directory"),
              (target.meta / "patches", stat.S_ISDIR, "a directory")]
    managed = False
    for path, kind, what in checks:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            if path == target.meta:
                return False
            continue
        if kind is None:
            if stat.S_ISREG(mode):
                managed = True
                continue
            raise engine.EngineError(f"{path} is {_describe(mode)}, not a state record: move "
                                     "it aside (nothing was changed)", "usage")
        if not kind(mode):
            raise engine.EngineError(f"{path} is {_describe(mode)}, not {what}: move it "
                                     "aside (nothing was changed)", "usage")
    return managed


class _Made:
    """What one adopt op made on the host, to remove exactly that when it fails."""

    def __init__(self) -> None:
        self.files: list[Path] = []
        self.dirs: list[Path] = []
        self.exclude = None            # (path, old text or None, parent made)
        self.ref: str | None = None    # "": made; else the old value, put back

    def undo(self, target: engine.Target) -> str:
        """Remove it all, newest first; each step's failure is reported, not raised, so
        the error that started the undo stays the one the user sees."""
        problems = []

        def step(what: str, action) -> None:
            try:
                action()
            except Exception as exc:      # noqa: BLE001 - reported with the real error
                problems.append(f"could not undo {what}: {exc}")
        if self.ref is not None:
            if self.ref:
                step(engine.BASE_REF, lambda: engine.git(target.root, "update-ref",
                                                          engine.BASE_REF, self.ref))
            else:
                step(engine.BASE_REF, lambda: engine.git(target.root, "update-ref", "-d",
                                                          engine.BASE_REF))
        for path in reversed(self.files):
            step(str(path), lambda path=path: path.unlink(missing_ok=True))
        for path in reversed(self.dirs):
            step(str(path), lambda path=path: _rmdirs(path))
        if self.exclude is not None:
            path, old, parent_made = self.exclude
            if old is None:
                step(str(path), lambda: path.unlink(missing_ok=True))
                if parent_made:
                    step(str(path.parent), lambda: path.parent.rmdir())
            else:
                step(str(path), lambda: engine.safewrite.write_file(path, old.encode()))
        return "; ".join(problems)


def _rmdirs(top: Path) -> None:
    """A directory this op made: what is inside it was made by this op too."""
    import shutil
    if top.is_symlink() or not top.is_dir():
        return
    shutil.rmtree(top)


def last_change(target: engine.Target) -> str:
    """The state's `updated`: when the served files last changed (their newest mtime), not
    the adoption's time. Adopting changes no byte, so a process started after that moment
    runs exactly the adopted series (the time rule of staleness.judge)."""
    import time
    top = target.disk(f"{target.prefix}{target.package}")
    newest = max((p.stat().st_mtime for p in top.rglob("*") if p.is_file()
                  and not p.is_symlink() and "__pycache__" not in p.parts), default=0.0)
    t = min(newest, time.time())
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _record(target: engine.Target, state: TreeState, req: AdoptRequest, bundle: Path,
            made: _Made) -> None:
    created = target.ensure_meta()
    made.dirs.extend(created["dirs"])
    made.exclude = created["exclude"]
    for name in req.base_objects:
        data = (bundle / name).read_bytes()
        blob = engine.blob_id(data)
        path = target.meta / "objects" / blob[:2] / blob[2:]
        if not path.parent.exists():
            path.parent.mkdir()
            made.dirs.append(path.parent)
        if not path.exists():
            made.files.append(path)
            target.store_blob(data)
    for name in req.patches:
        data = (bundle / name).read_bytes()
        path = target.meta / "patches" / Path(name).name
        if not path.exists():
            made.files.append(path)
        engine.write_atomic(path, data, target.root)
    if target.is_git:
        state.head = target.head()
        old = run_git(["rev-parse", "--verify", "-q", engine.BASE_REF], target.root)
        made.ref = old.stdout.decode().strip() if old.returncode == 0 else ""
        engine.git(target.root, "update-ref", engine.BASE_REF, state.base["commit"])
    made.files.append(target.state_file)
    engine.write_json(target.state_file, state.to_json(), target.root)


def serve(request: Request, bundle: str | Path = ".",
          events: Events | None = None) -> InventoryResult | AdoptResult | Failure:
    """The adoption ops' frame (wire.OPS names the op's function): errors are results,
    like every op's."""
    try:
        return op_function(sys.modules[__name__], request)(request, Path(bundle))
    except WireError as exc:
        return Failure(exc.kind, str(exc))
    except engine.EngineError as exc:
        return Failure(exc.kind, str(exc), exc.details)
    except (KeyError, TypeError, ValueError) as exc:
        return Failure("usage", f"malformed {request.op} request: {exc}")
    except OSError as exc:
        return Failure("target", f"{exc.strerror or exc} ({exc.filename})")
