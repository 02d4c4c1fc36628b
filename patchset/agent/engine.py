"""The engine: changes one SGLang tree, on the machine where the tree is.

Standard library only, part of the agent (patchset/agent/): the controller ships the agent
with the selected patch files and a JSON request to GPU hosts that have just python3 and
git, runs it there and reads one result back; the local transport calls `run()` in this
process. Keeping the whole transaction on the host is what makes it atomic and one round
trip.

A transaction never touches the tree until the result is fully built off to the side:
  1. lock the target; repair what a kill left: stale git locks, then any transaction a
     kill interrupted (journal roll-forward); see "recovery" below;
  2. refuse a dirty tree (hand edits are never lost) or a tree that is not the pinned base;
  3. rebuild every touched file from the base plus the desired patches in a staging dir,
     checking each file's pre-image and post-image blob ids (zero fuzz, no silent no-op);
  4. on a git tree, write one commit per patch (trailers Patchset-Name/Patchset-Sha256)
     with a private index, deterministically, without touching the work tree;
  5. write the journal, switch each file with os.replace, move HEAD, write the state,
     drop the journal. A kill anywhere in 5 leaves every file old or new and a journal
     that the next command rolls forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from .lib import bounded, safewrite, staleness, wire
from .lib.crashpoint import crash_point
from .lib.gitenv import run_git
from .lib.gitblob import EngineError, blob_id, file_diff, git, git_apply, text_or_refuse
from .lib.protocol import Events, ended, killed
from .lib.records import (AppliedPatch, BaseSource, Drift, Interpreter, Interrupted, PatchSpec,
                          Recovered, StateError, StatusPatch, StatusRecord, TreeState,
                          UnitStatus, now_stamp)

META = ".patchset"
AUTHOR = ("patchset", "patchset@localhost")
BASE_REF = "refs/patchset/base"   # on git trees: the pinned base the series sits on
DIFF_LINES = 80


# ---------------------------------------------------------------- small helpers

def file_blob(path: Path) -> str | None:
    return blob_id(path.read_bytes()) if path.is_file() else None


def write_atomic(path: Path, data: bytes, root: Path) -> None:
    """Whole or not at all, only inside `root` and never through a link (safewrite)."""
    safewrite.write_file(path, data, root=root)


def write_json(path: Path, value: Any, root: Path) -> None:
    write_atomic(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode(), root)


STATE_LIMIT = 64 * bounded.MIB      # state, journal, lock and bisect records: kilobytes


def read_json(path: Path) -> Any:
    """A record of the engine's on the host (None when absent), through the bounded
    reader: anyone with write access there may have put a FIFO, a device or a bomb in
    its place, and the engine must refuse it, never hang or crash."""
    try:
        return bounded.loads(bounded.read_bytes(path, STATE_LIMIT, "state record"), str(path))
    except bounded.Missing:
        return None
    except bounded.InputError as exc:
        raise EngineError(f"{path} is corrupt or not a state record ({exc.field}: "
                          f"{exc.message}); move it aside and re-apply") from None


GIT_PATHS = ("rev-parse", "--git-path", "info/exclude", "--show-object-format", "--git-dir",
             "--git-common-dir")


# ---------------------------------------------------------------- the target

class Target:
    """One SGLang tree: a git checkout (python/sglang/...) or a plain wheel-layout dir."""

    def __init__(self, root: str, git_prefix: str, package: str) -> None:
        self.root = Path(os.path.expanduser(root)).resolve()
        if not self.root.is_dir():
            raise EngineError(f"target {root} does not exist or is not a directory", "usage")
        self.prefix = git_prefix
        self.is_git = (self.root / ".git").exists()
        self.package = package
        self.layout = self._layout(root, package)
        self.meta = self.root / META
        self._git_paths: dict[str, Any] | None = None
        self.recovered: Recovered | None = None  # what this operation's recover() did

    def _layout(self, root: str, package: str) -> str:
        if (self.root / self.prefix / package).is_dir():
            return "git"
        if (self.root / package).is_dir():
            return "wheel"
        raise EngineError(f"target {root} holds no {package} tree (expected "
                          f"{self.prefix}{package}/ or {package}/ inside it)", "usage")

    def disk(self, path: str) -> Path:
        """Where a git-layout path lives in this tree."""
        if self.layout == "wheel" and path.startswith(self.prefix):
            path = path[len(self.prefix):]
        return self.root / path

    def disk_paths(self, paths: list[str]) -> list[str]:
        """Git-layout paths as this tree names them, relative to its root."""
        return [str(self.disk(p).relative_to(self.root)) for p in paths]

    @property
    def state_file(self) -> Path:
        return self.meta / "state.json"

    @property
    def journal_file(self) -> Path:
        return self.meta / "journal.json"

    @property
    def bisect_file(self) -> Path:
        return self.meta / "bisect.json"

    def state(self) -> TreeState | None:
        """The tree's state, any readable format (records.TreeState); None: not managed."""
        data = read_json(self.state_file)
        if data is None:
            return None
        try:
            return TreeState.from_json(data, str(self.state_file))
        except StateError as exc:
            raise EngineError(str(exc)) from None

    def ensure_meta(self) -> dict[str, Any]:
        """.patchset/ with objects/ and patches/, and on a git tree its exclude line; what
        this call made, so a caller that must undo exactly its own work can (adopt):
        {"dirs": [made, outermost first], "exclude": (path, its old text or None) or None}.
        A .patchset, objects/ or patches/ that is a link or not a directory is refused
        (usage) before anything is made: nothing is ever made through a link."""
        wanted = [self.meta, self.meta / "objects", self.meta / "patches"]
        missing = []
        for folder in wanted:
            try:
                mode = os.lstat(folder).st_mode
            except FileNotFoundError:
                missing.append(folder)
                continue
            if not stat.S_ISDIR(mode):
                what = "a regular file" if stat.S_ISREG(mode) else safewrite.describe(mode)
                raise EngineError(f"{folder} is {what}, not a directory: "
                                  "move it aside (nothing was changed)", "usage")
        made: dict[str, Any] = {"dirs": [], "exclude": None}
        for folder in missing:
            folder.mkdir()
            made["dirs"].append(folder)
        if self.is_git:
            exclude = self.git_paths()["exclude"]
            text = exclude.read_text() if exclude.exists() else None
            if f"/{META}/" not in (text or "").split("\n"):
                old = text or ""
                made["exclude"] = (exclude, text, not exclude.parent.exists())
                exclude.parent.mkdir(parents=True, exist_ok=True)
                safewrite.write_file(exclude, (old + ("" if old.endswith("\n") or not old
                                                      else "\n") + f"/{META}/\n").encode())
        return made

    # content store: git objects on a git tree, .patchset/objects on a plain one
    def read_blob(self, blob: str) -> bytes:
        if self.is_git:
            proc = run_git(["cat-file", "blob", blob], self.root)
            if proc.returncode == 0:
                return proc.stdout
            if killed(proc.returncode):      # not a missing object: say what happened
                raise EngineError(f"git cat-file failed in {self.root}: "
                                  f"{ended(proc.returncode)}")
        path = self.meta / "objects" / blob[:2] / blob[2:]
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise EngineError(f"content {blob} is missing from {self.meta}; the state is "
                              "damaged: restore the tree from the pin and re-apply") from None

    def store_blob(self, data: bytes) -> str:
        blob = blob_id(data)
        path = self.meta / "objects" / blob[:2] / blob[2:]
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            write_atomic(path, data, self.root)
        return blob

    def git_paths(self) -> dict[str, Any]:
        """Where this checkout keeps its excludes and git directories, and its hash: asked
        once (a linked worktree puts them elsewhere than .git/)."""
        if self._git_paths is None:
            exclude, algorithm, git_dir, common = git(self.root, *GIT_PATHS).splitlines()[:4]
            self._git_paths = {"exclude": self.root / exclude, "algorithm": algorithm,
                               "git_dir": self.root / git_dir, "common_dir": self.root / common}
        return self._git_paths

    def head(self) -> str | None:
        return git(self.root, "rev-parse", "HEAD").strip() if self.is_git else None

    @contextlib.contextmanager
    def lock(self, wait: float, op: str, read_only: bool = False) -> Iterator[None]:
        """The target's flock. A read-only run (a dry run) writes nothing: on a tree that is
        not managed yet it takes no lock (there is no state to protect), on a managed one
        it holds the flock without recording itself in lock.json."""
        if read_only and not (self.meta / "lock").exists():
            yield
            return
        refuse_links(self, [])                  # .patchset itself must not be a link
        self.meta.mkdir(exist_ok=True)
        handle = open_lock(self.meta / "lock")
        try:
            self._acquire(handle, wait)
            if not read_only:
                write_json(self.meta / "lock.json", {"pid": os.getpid(),
                                                     "host": os.uname().nodename,
                                                     "op": op, "since": now()}, self.root)
            yield
        finally:
            handle.close()

    def _acquire(self, handle: Any, wait: float) -> None:
        if not acquire_flock(handle, wait):
            raise EngineError(f"target {self.root} is locked by {self._holder()}; "
                              "wait for it to finish or pass --lock-wait SECONDS", "locked")

    def _holder(self) -> str:
        info = read_json(self.meta / "lock.json") or {}
        return (f"patchset {info.get('op', '?')} (pid {info.get('pid', '?')} on "
                f"{info.get('host', '?')}, since {info.get('since', '?')})")


def open_lock(path: Path) -> Any:
    """The lock file, never through a link planted at its name (a link would make the
    engine create or open a file wherever it points), and only a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                     | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        raise EngineError(f"{path}: cannot open the lock file ({exc.strerror}); a link "
                          "there is refused: remove it") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EngineError(f"{path} is not a regular file; remove it")
    return os.fdopen(fd, "a+")


def acquire_flock(handle: Any, wait: float) -> bool:
    """Take an exclusive flock, waiting up to `wait` seconds; False if still held.
    (flock, not a lock file: a SIGKILLed holder releases it with its last descriptor.)"""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- drift and dirt

def drift(target: Target, state: TreeState | None) -> list[Drift]:
    """Files the series manages whose content is not what the state says it should be."""
    expected = state.files if state else {}
    out = []
    for path, blob in sorted(expected.items()):
        found = file_blob(target.disk(path))
        if found != blob:
            out.append(Drift(path=path, expected=blob, found=found))
    return out


def git_dirty(target: Target, paths: list[str] | None = None) -> list[str]:
    """Uncommitted changes: in the whole tree (status), or only in `paths` (git layout),
    the files an apply or revert writes, so the check costs what the series touches, not
    a stat of every file in SGLang. Changes elsewhere are not at risk: the switch moves
    HEAD and resets the index of the series' own files only."""
    if not target.is_git:
        return []
    spec = ["--", *target.disk_paths(paths)] if paths is not None else []
    if paths is not None and not paths:
        return []
    # No optional locks: status writes nothing (the index is the switch's to write).
    out = git(target.root, "status", "--porcelain=v1", "--untracked-files=no", *spec,
              env={**LITERAL, "GIT_OPTIONAL_LOCKS": "0"})
    return [line[3:] for line in out.splitlines() if line.strip()]


LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}   # a path is a path, never a pattern or magic


def foreign_commits(target: Target, state: TreeState | None) -> list[str]:
    if not (target.is_git and state and state.head):
        return []
    head, applied = target.head(), state.head
    assert head is not None                     # a git target has a HEAD
    if head == applied:
        return []
    try:
        out = git(target.root, "rev-list", "--oneline", f"{applied}..{head}")
    except EngineError:
        return [f"HEAD {head[:12]} does not descend from the applied head {applied[:12]}"]
    return out.splitlines() or [f"HEAD moved from {applied[:12]} to {head[:12]}"]


def show_diff(target: Target, drifted: list[Drift]) -> str:
    lines: list[str] = []
    for item in drifted:
        old = target.read_blob(item.expected) if item.expected else b""
        new = target.disk(item.path).read_bytes() if item.found else b""
        lines += difflib.unified_diff(old.decode(errors="replace").splitlines(),
                                      new.decode(errors="replace").splitlines(),
                                      f"a/{item.path}", f"b/{item.path}", lineterm="")
    return "\n".join(lines[:DIFF_LINES] + (["..."] if len(lines) > DIFF_LINES else []))


def refuse_if_dirty(target: Target, state: TreeState | None, paths: list[str]) -> None:
    dirty = git_dirty(target, paths)
    if dirty:
        spec = ["--", *target.disk_paths(paths)]
        diff = (git(target.root, "diff", "--stat", "HEAD", *spec, env=LITERAL)
                + git(target.root, "diff", "HEAD", *spec, env=LITERAL))
        raise EngineError(f"target {target.root} has uncommitted changes in "
                          f"{', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''}: "
                          "commit, stash or capture them first (nothing was changed)",
                          details="\n".join(diff.splitlines()[:DIFF_LINES]))
    foreign = foreign_commits(target, state)
    if foreign:
        raise EngineError(f"target {target.root} has commits on top of the patchset series "
                          f"({foreign[0]}{' ...' if len(foreign) > 1 else ''}): revert them or "
                          "capture them as patches first (nothing was changed)")
    drifted = drift(target, state)
    if drifted:
        raise EngineError(f"target {target.root} has hand edits in "
                          f"{', '.join(d.path for d in drifted[:5])}: restore or capture "
                          "them first (nothing was changed)", details=show_diff(target, drifted))


def verify_base(target: Target, base_files: dict[str, str | None]) -> None:
    """First apply: every file the series touches must be the pin's pre-image."""
    for path, blob in sorted(base_files.items()):
        found = file_blob(target.disk(path))
        if found != blob:
            what = "missing" if found is None else f"blob {found}"
            raise EngineError(f"target {target.root} is not the pinned base: {path} is {what}, "
                              f"the pin has {f'blob {blob}' if blob else 'no such file'} "
                              "(provision the pinned upstream or point --target at it)")


# ---------------------------------------------------------------- building the result

class Staging:
    """A scratch copy of every touched file in git layout: under .patchset/txn/ for a real
    transaction (the journal's switch installs from there), or in `where`, a directory
    outside the target, for a dry run. Never touches the target's files."""

    def __init__(self, target: Target, where: Path | None = None) -> None:
        self.target = target
        self.dir = where if where is not None else target.meta / "txn"
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.work = self.dir / "work"
        self.work.mkdir(parents=True)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def seed(self, paths: list[str], base_files: dict[str, str | None]) -> None:
        for path in paths:
            blob = base_files.get(path)
            if blob:
                dest = self.work / path
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(self.base_content(path, blob))

    def base_content(self, path: str, blob: str) -> bytes:
        """The pristine content: the file on disk while it still is the base (a first
        apply, before anything is stored), else the target's content store."""
        disk = self.target.disk(path)
        if disk.is_file():
            data = disk.read_bytes()
            if blob_id(data) == blob:
                return data
        return self.target.read_blob(blob)

    def apply(self, spec: PatchSpec, patch_file: Path) -> list[tuple[str, bytes | None]]:
        """Apply one patch with `git apply`, all or nothing; return its files after. The
        pre-image blob ids are checked before and the post-image ids after, so the result
        is exactly what the patch recorded (zero fuzz, no offset can change it)."""
        for change in spec.files:
            self._expect(spec.name, change.path, change.pre, "pre-image")
        try:
            git_apply(self.work, patch_file.read_bytes(), self.dir)
        except EngineError as exc:
            raise EngineError(f"patch {spec.name} does not apply on the base with the "
                              f"patches before it: {exc}", "target") from None
        for change in spec.files:
            self._expect(spec.name, change.path, change.post, "post-image")
        return [(c.path, self.content(c.path)) for c in spec.files]

    def _expect(self, name: str, path: str, blob: str | None, what: str) -> None:
        """Full 40-hex ids in the message: a 12-hex prefix can be the same for both."""
        found = file_blob(self.work / path)
        if found != blob:
            verb = "does not apply" if what == "pre-image" else "gives the wrong result"
            raise EngineError(f"patch {name} {verb}: {path} {what} is "
                              f"{f'blob {found}' if found else 'absent'}, the patch records "
                              f"{f'blob {blob}' if blob else 'absent'} (series out of order, "
                              "or the patch file does not match its index lines)")

    def content(self, path: str) -> bytes | None:
        file = self.work / path
        return file.read_bytes() if file.is_file() else None


Step = list[tuple[str, "bytes | None"]]   # one patch's files after it: (path, content)


def build(target: Target, desired: list[PatchSpec], bundle: Path, base_files: dict,
          extra_paths: set[str], where: Path | None = None) -> tuple[Staging, list[Step]]:
    """Apply `desired` onto the base in staging; returns each patch's resulting files.
    A patch that does not apply removes the staging at once (nothing is left behind)."""
    paths = sorted({c.path for s in desired for c in s.files} | extra_paths)
    staging = Staging(target, where)
    try:
        staging.seed(paths, base_files)
        steps = [staging.apply(spec, bundle / spec.file) for spec in desired]
    except BaseException:
        staging.remove()
        raise
    return staging, steps


def check_patch_file(spec: PatchSpec, bundle: Path) -> None:
    path = bundle / spec.file
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise EngineError(f"patch file {spec.file} missing from the bundle", "usage") from None
    if digest != spec.sha256:
        raise EngineError(f"patch {spec.name}: file sha256 {digest} != "
                          f"{spec.sha256} (changed in transit?)", "usage")


# ---------------------------------------------------------------- git commits

def write_commits(target: Target, base_commit: str, desired: list[PatchSpec],
                  steps: list[Step]) -> list[str]:
    """One deterministic commit per patch, written by one `git fast-import` (the work tree,
    the index and HEAD untouched until the switch; TXN_REF, which fast-import needs, is
    dropped at once): same base + same patches = same commit ids on every machine, with
    patchset as author and committer at the base commit's time. One git process for the
    whole series, where building each commit with plumbing would take three per patch
    and a blob per file (each a step of the kill tests' every-git-child matrix)."""
    if not desired:
        return []
    root = target.root
    touched = sorted({p for step in steps for p, _ in step})
    disk = dict(zip(touched, target.disk_paths(touched)))
    if any("\n" in d or d.startswith('"') for d in disk.values()):
        raise EngineError(f"a path of the series cannot be committed in {root}: "
                          f"{sorted(disk.values())!r}", "usage")
    modes = _modes(root, base_commit, list(disk.values()))
    when = git(root, "show", "-s", "--format=%ct", base_commit).strip()
    who = f"{AUTHOR[0]} <{AUTHOR[1]}> {when} +0000"
    stream = []
    for number, (spec, step) in enumerate(zip(desired, steps), start=1):
        message = (f"{spec.name}: {spec.summary}\n\n"
                   f"Patchset-Name: {spec.name}\nPatchset-Sha256: {spec.sha256}\n"
                   ).encode()
        stream.append(f"commit {TXN_REF}\nmark :{number}\nauthor {who}\ncommitter {who}\n"
                      .encode() + b"data %d\n" % len(message) + message)
        if number == 1:
            stream.append(f"from {base_commit}\n".encode())
        for path, data in step:
            stream.append(f"D {disk[path]}\n".encode() if data is None else
                          f"M {modes.get(disk[path], '100644')} inline {disk[path]}\n"
                          .encode() + b"data %d\n" % len(data) + data + b"\n")
        stream.append(b"\n")
    marks = target.meta / "txn" / "marks"
    git(root, "fast-import", "--quiet", "--force", f"--export-marks={marks}",
        data=b"".join(stream))
    git(root, "update-ref", "-d", TXN_REF)
    ids = dict(line.split() for line in marks.read_text().splitlines())
    return [ids[f":{number}"] for number in range(1, len(desired) + 1)]


TXN_REF = "refs/patchset/txn"   # fast-import's branch while it writes the commits


def _modes(root: Path, commit: str, paths: list[str]) -> dict[str, str]:
    """Each path's mode at `commit` (absent: not listed)."""
    listed = git(root, "ls-tree", "-z", commit, "--", *paths, env=LITERAL).split("\0")
    return {e.split("\t", 1)[1]: e.split(" ", 1)[0] for e in listed if e}


# ---------------------------------------------------------------- the switch

def switch(target: Target, journal: dict) -> None:
    """Make the staged result live. Re-runnable: recovery calls it again after a kill."""
    staged = target.meta / "txn" / "work"
    for number, (path, change) in enumerate(sorted(journal["files"].items())):
        dest = target.disk(path)
        if file_blob(dest) != change["new"]:
            _install(target, dest, staged / path, change["new"])
        crash_point(f"file:{number}")
    if journal.get("new_head"):
        head = target.head()
        assert head is not None                 # only a git tree's journal has a new_head
        if head != journal["new_head"]:
            git(target.root, "update-ref", "-m", "patchset", "HEAD", journal["new_head"], head)
        crash_point("ref")
        reset_index(target, sorted(journal["files"]))
    write_json(target.state_file, journal["state"], target.root)
    crash_point("state")
    target.journal_file.unlink()
    shutil.rmtree(target.meta / "txn", ignore_errors=True)


def reset_index(target: Target, paths: list[str]) -> None:
    """The index entries of `paths` set to HEAD's (removed where it has none), the rest of
    the index untouched: a change staged elsewhere stays staged."""
    if not paths:
        return
    disk = target.disk_paths(paths)
    listed = [e for e in git(target.root, "ls-tree", "-z", "HEAD", "--", *disk,
                             env=LITERAL).split("\0") if e]
    present = {e.split("\t", 1)[1] for e in listed}
    zero = "0" * (64 if target.git_paths()["algorithm"] == "sha256" else 40)
    removed = [f"0 {zero}\t{p}" for p in disk if p not in present]
    git(target.root, "update-index", "-z", "--index-info",
        data="".join(f"{e}\0" for e in listed + removed).encode(), env=LITERAL)


def _install(target: Target, dest: Path, source: Path, blob: str | None) -> None:
    """One file of the switch, by safewrite's rules: reached from the root without a
    link, replaced whole keeping its mode (a new one 0644), removed with the directories
    that leaves empty (as git removes them), so a revert of a creation is exact."""
    if blob is None:
        safewrite.remove_file(dest, target.root)
        return
    data = source.read_bytes()
    if blob_id(data) != blob:
        raise EngineError(f"staged {source} does not match the journal; the transaction "
                          "cannot be finished: restore the tree from the pin")
    mode = dest.stat().st_mode & 0o7777 if dest.is_file() else 0o644
    safewrite.write_file(dest, data, mode, root=target.root, durable=False)


# ---------------------------------------------------------------- recovery
#
# A kill can land on the engine, on one of its git children, or on both: it leaves a
# journal (the switch was under way), git lock files (a git child died holding
# index.lock, HEAD.lock or a ref's lock), or both. Under the engine's own flock no
# patchset git runs, so a git lock with no live git process in the tree is stale. One
# reading of what a kill left (recovery_plan) is what the next apply or revert acts on
# (recover) and what `status` reports (next_step): status never promises more.

GIT_WAIT = 5.0          # seconds recover waits for a live git process in the tree
RECOVERY_LOG = "recovery.log"


class Recovery(NamedTuple):
    journal: dict | None      # the transaction a kill interrupted: rolled forward
    stale: list[Path]         # git lock files no live git process holds: removed
    busy: list[str]           # live git processes in the tree: waited for, else refused
    edited: list[str]         # the journal's files changed by hand since: refused


def git_lock_files(target: Target) -> list[Path]:
    """The lock files in the tree's git directories (git's `*.lock`: the index, HEAD,
    packed-refs, config, each ref's), which a killed git leaves behind."""
    if not target.is_git:
        return []
    paths = target.git_paths()
    found: set[Path] = set()
    for folder in {paths["git_dir"], paths["common_dir"]}:
        found.update(folder.glob("*.lock"))
        found.update((folder / "refs").rglob("*.lock"))
    return sorted(found)


def recovery_plan(target: Target) -> Recovery:
    """What a kill left on this tree, and so what the next apply or revert does first."""
    journal = read_json(target.journal_file)
    edited = [path for path, change in sorted((journal or {}).get("files", {}).items())
              if file_blob(target.disk(path)) not in (change["old"], change["new"])]
    locks = git_lock_files(target)
    busy = []
    if locks:
        from . import runner             # only where a lock is there to judge
        busy = runner.git_processes(sorted({target.root, *(
            target.git_paths()[k] for k in ("git_dir", "common_dir"))}))
    return Recovery(journal, [] if busy else locks, busy, edited)


def refusal(target: Target, plan: Recovery) -> EngineError | None:
    """Why the next apply or revert cannot repair the tree, or None."""
    if plan.busy:
        return EngineError(f"{', '.join(plan.busy)} is working in {target.root} and may hold "
                           f"its git locks: wait for it to finish, then run the command "
                           "again", "locked")
    if plan.edited:
        assert plan.journal is not None         # the edited files are the journal's
        path = plan.edited[0]
        change = plan.journal["files"][path]
        return EngineError(f"an interrupted {plan.journal['op']} left {path} changed by hand "
                           f"since (not {change['old']} nor {change['new']}): restore it, "
                           "then run the command again")
    return None


def next_step(target: Target, plan: Recovery) -> str:
    """What the next apply or revert does about `plan`, in the words status shows."""
    why = refusal(target, plan)
    if plan.busy:
        return (f"the next apply or revert waits up to {GIT_WAIT:g}s, then refuses while "
                f"it still runs: {why}")
    if why:
        return f"the next apply or revert refuses: {why}"
    steps = []
    if plan.stale:
        steps.append(f"clears the stale git lock(s) {_shown(target, plan.stale)} (no git "
                     "process is working in the tree)")
    if plan.journal:
        steps.append("finishes it")
    return "the next apply or revert " + " and ".join(steps)


def _shown(target: Target, paths: list[Path]) -> str:
    """The paths as the tree names them (.git/index.lock), absolute outside it."""
    return ", ".join(os.path.relpath(p, target.root) if str(p).startswith(f"{target.root}/")
                     else str(p) for p in paths)


def interrupted(target: Target, plan: Recovery) -> Interrupted | None:
    """status's `interrupted`: the journal's transaction, or the stale git locks alone."""
    if plan.journal is None and not (plan.stale or plan.busy):
        return None
    journal = plan.journal or {"op": "git", "id": "no journal", "files": {}}
    return Interrupted(op=journal["op"], id=journal["id"], files=len(journal["files"]),
                       git_locks=_shown(target, plan.stale) or None,
                       next=next_step(target, plan))


def recover(target: Target) -> Recovered | None:
    """Under the engine's lock: clear stale git locks (logged), then finish a transaction
    a kill interrupted; refuse while a git process works in the tree (after GIT_WAIT) or
    if someone edited the journal's files since. What was done, or None."""
    plan = _settled_plan(target)
    why = refusal(target, plan)
    if why:
        raise why
    for lock in plan.stale:
        lock.unlink(missing_ok=True)
    if plan.journal is None:
        shutil.rmtree(target.meta / "txn", ignore_errors=True)  # killed before the journal
    else:
        switch(target, plan.journal)
    if plan.journal is None and not plan.stale:
        return None
    target.recovered = _done(plan)
    _log_recovery(target, target.recovered)
    return target.recovered


def _settled_plan(target: Target) -> Recovery:
    """recovery_plan, once no live git works in the tree, or after GIT_WAIT seconds."""
    plan = recovery_plan(target)
    deadline = time.monotonic() + GIT_WAIT
    while plan.busy and time.monotonic() < deadline:
        time.sleep(0.1)
        plan = recovery_plan(target)
    return plan


def _done(plan: Recovery) -> Recovered:
    """The record of a repair: the result's `recovered` and the recovery log's line."""
    journal = plan.journal or {}
    after = {a["name"] for a in journal.get("state", {}).get("applied", [])}
    return Recovered(op=journal.get("op"), id=journal.get("id"), finished=bool(journal),
                     removed=[n for n in journal.get("before", []) if n not in after],
                     stale_git_locks=[str(p) for p in plan.stale])


def _log_recovery(target: Target, done: Recovered) -> None:
    """One JSON line per repair in .patchset/recovery.log: what a kill left and what was
    done about it outlives the result line (which a dropped SSH connection loses). A log
    that cannot be written (a link or a fifo planted there) fails nothing: the result
    carries the same record."""
    target.meta.mkdir(exist_ok=True)
    line = json.dumps({"time": now(), "pid": os.getpid(), **done.to_json()},
                      sort_keys=True) + "\n"
    try:
        fd = os.open(target.meta / RECOVERY_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                     | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):     # never through a link or into a fifo
            os.write(fd, line.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------- operations

def transition(target: Target, request: wire.TreeChangeRequest, desired: list[PatchSpec],
               bundle: Path) -> wire.ApplyResult:
    """Move the target from its current state to base + `desired` (in order)."""
    state = target.state()
    refuse_links(target, _written(state, request, desired))
    refuse_if_dirty(target, state, _written(state, request, desired))
    base_files = _base_files(target, state, request)
    current = [(a.name, a.sha256) for a in state.applied] if state else []
    if state is not None and current == [(s.name, s.sha256) for s in desired]:
        return _result(target, state, changed=False, before=current)
    for spec in desired:
        check_patch_file(spec, bundle)
    if request.dry_run:
        # The same build as a real apply, off to the side: a patch that does not apply is
        # the same refusal (message and exit code) as `apply`'s, and nothing is written.
        with tempfile.TemporaryDirectory(prefix="patchset-dry-run-") as scratch:
            build(target, desired, bundle, base_files, set(base_files), Path(scratch) / "txn")
        return wire.ApplyResult(changed=True, dry_run=True, before=[n for n, _ in current],
                                after=[s.name for s in desired])
    # Build first: a patch that does not apply leaves the target as it was (no .patchset
    # content store, no exclude line, no staging).
    staging, steps = build(target, desired, bundle, base_files, set(base_files))
    try:
        target.ensure_meta()
        _store_base(target, state, base_files)
        crash_point("staged")
        new_state = _new_state(target, request, state, base_files, desired, staging)
        journal = _journal(target, request, state, desired, staging, steps, new_state, bundle)
    except BaseException:
        staging.remove()
        raise
    write_json(target.journal_file, journal, target.root)
    crash_point("journal")
    switch(target, journal)
    return _result(target, new_state, changed=True, before=current)


def refuse_links(target: Target, paths: list[str]) -> None:
    """Before anything is written: every file a transition writes, and its state, must be
    reached from the root without a link and be a regular file or absent; a tree with a
    linked directory inside would have the patch written wherever the link points."""
    try:
        for path in [target.state_file, *(target.disk(p) for p in paths)]:
            safewrite.check_beneath(path, target.root)
    except safewrite.RefusedPath as exc:
        raise EngineError(f"target {target.root}: {exc} (nothing was changed)", "usage") from None


def _written(state: TreeState | None, request: wire.TreeChangeRequest,
             desired: list[PatchSpec]) -> list[str]:
    """Every file this transition may write: managed so far, or touched by the series."""
    return sorted(set(state.files if state else ()) | set(request.base_files)
                  | {c.path for s in desired for c in s.files})


def _base_files(target: Target, state: TreeState | None,
                request: wire.TreeChangeRequest) -> dict:
    """The pin's pre-images of every file managed so far, plus any the request adds (a
    series that grew touches new files): those must still be the pin on disk."""
    known = dict(state.base["files"]) if state else {}
    new = {p: b for p, b in request.base_files.items() if p not in known}
    verify_base(target, new)
    return {**known, **new}


def _store_base(target: Target, state: TreeState | None, base_files: dict) -> None:
    """Keep the pristine pre-images of a plain tree, so any later revert is exact."""
    if target.is_git:
        return
    for path, blob in base_files.items():
        if blob and (state is None or path not in state.base["files"]):
            target.store_blob(target.disk(path).read_bytes())


def _new_state(target: Target, request: wire.TreeChangeRequest, state: TreeState | None, base_files: dict,
               desired: list[PatchSpec], staging: Staging) -> TreeState:
    files = {path: (blob_id(c) if (c := staging.content(path)) is not None else None)
             for path in sorted(set(base_files) | {c.path for s in desired for c in s.files})}
    return TreeState(
        tool_version=request.tool_version, updated=now_stamp(),
        kind="git" if target.is_git else "plain", layout=target.layout,
        upstream=request.upstream if state is None else state.upstream,
        base={"commit": (state.base.get("commit") if state else None) or target.head(),
              "files": base_files},
        applied=[AppliedPatch.from_spec(s) for s in desired],
        head=None, files=files)


def _journal(target: Target, request: wire.TreeChangeRequest, state: TreeState | None,
             desired: list[PatchSpec], staging: Staging, steps: list, new_state: TreeState,
             bundle: Path) -> dict:
    for spec in desired:
        _keep_patch_copy(target, spec, bundle)
    old = state.files if state else request.base_files
    files = {p: {"old": old.get(p), "new": b} for p, b in new_state.files.items()
             if old.get(p) != b}
    new_head = None
    if target.is_git:
        git(target.root, "update-ref", BASE_REF, new_state.base["commit"])
        commits = write_commits(target, new_state.base["commit"], desired, steps)
        for applied, commit in zip(new_state.applied, commits):
            applied.commit = commit
        new_head = commits[-1] if commits else new_state.base["commit"]
        new_state.head = new_head
    else:
        for path in new_state.files:
            if (data := staging.content(path)) is not None:
                target.store_blob(data)
    return {"id": f"{int(time.time())}-{os.getpid()}", "op": request.op, "files": files,
            "before": state.names() if state else [],
            "old_head": target.head(), "new_head": new_head, "state": new_state.to_json()}


def _keep_patch_copy(target: Target, spec: PatchSpec, bundle: Path) -> None:
    """The tree's own copy of each applied patch file: what a revert re-applies from."""
    dest = target.meta / "patches" / f"{spec.sha256}.patch"
    if not dest.exists():
        write_atomic(dest, (bundle / spec.file).read_bytes(), target.root)


def _result(target: Target, state: TreeState, changed: bool, before: list) -> wire.ApplyResult:
    return wire.ApplyResult(changed=changed, before=[n for n, _ in before],
                            after=state.names(), head=state.head, target=str(target.root))


def op_apply(target: Target, request: wire.ApplyRequest, bundle: Path) -> wire.ApplyResult:
    return transition(target, request, list(request.patches), bundle)


def op_revert(target: Target, request: wire.RevertRequest, bundle: Path) -> wire.RevertResult:
    state = target.state()
    applied = state.applied if state else []
    names = [a.name for a in applied]
    remove = set(request.names)
    # a revert the recovery just finished is this one, run again after a kill: done
    done = set(target.recovered.removed if target.recovered else ()) & remove
    missing = sorted(remove - set(names) - done)
    if missing:
        raise EngineError(f"{', '.join(missing)} not applied on {target.root} "
                          f"(applied: {', '.join(names) or 'none'})", "usage")
    dependents = _dependents(applied, remove)
    if dependents and not request.with_dependents:
        raise EngineError(f"{', '.join(dependents)} depend(s) on {', '.join(sorted(remove))}; "
                          "revert those too with --with-dependents", "usage")
    remove |= set(dependents)
    patches = target.meta / "patches"
    desired = [a.spec() for a in applied if a.name not in remove]
    result = transition(target, request, desired, patches)
    return wire.RevertResult(**vars(result),
                             reverted=[n for n in names if n in remove] or sorted(done))


def _dependents(applied: list[AppliedPatch], remove: set[str]) -> list[str]:
    out: list[str] = []
    gone = set(remove)
    for item in applied:
        if item.name not in gone and set(item.depends or ()) & gone:
            gone.add(item.name)
            out.append(item.name)
    return out


def op_status(target: Target, request: wire.StatusRequest) -> StatusRecord:
    """Read-only: never takes the lock, never repairs; says what the next command will do."""
    state = target.state()
    plan = recovery_plan(target)
    journal = plan.journal
    return StatusRecord(
        target=str(target.root), kind="git" if target.is_git else "plain",
        layout=target.layout, managed=state is not None,
        state_version=state.format if state else None,
        tool_version=state.tool_version if state else None,
        updated=state.updated if state else None,
        upstream=state.upstream if state else None,
        base=state.base if state else None,
        applied=[StatusPatch(name=a.name, sha256=a.sha256, commit=a.commit, gate=a.gate,
                             path=a.path, tier=a.tier)
                 for a in (state.applied if state else [])],
        head=target.head(),
        drift=[] if journal else drift(target, state),
        dirty=git_dirty(target),
        foreign_commits=foreign_commits(target, state) if not journal else [],
        interrupted=interrupted(target, plan),
        locked_by=_lock_holder(target),
        bisect=read_json(target.bisect_file),
        interpreter=interpreter_facts(target, request.python),
        units=unit_facts(target, state),
    )


# ---------------------------------------------------------------- bisect record

def refuse_during_bisect(target: Target,
                         request: wire.TreeChangeRequest | wire.DeployRequest) -> None:
    """While a bisect holds the host in a test state, only its own steps may change the
    tree: anything else would make its restore put back the wrong thing. The controller
    reads the record from the error and finishes an abandoned bisect's restore first."""
    record = read_json(target.bisect_file)
    if record is None or request.bisect == record.get("id"):
        return
    raise EngineError(f"a bisect (started {record.get('started')} by {record.get('by')}) "
                      f"holds {target.root} in a test state; it restores the starting "
                      "state when it ends, or run `patchset bisect HOST --restore`",
                      "bisect_pending", json.dumps(record, sort_keys=True))


def op_bisect_mark(target: Target, request: wire.BisectMarkRequest,
                   bundle: Path) -> wire.BisectMarkResult:
    """Write (request.record) or drop (None) the bisect record, under the tree lock.
    A second bisect is refused while one's record is there (it must be restored first)."""
    record, current = request.record, read_json(target.bisect_file)
    if record is None:
        if current is not None and current.get("id") == request.bisect:
            target.bisect_file.unlink()
        return wire.BisectMarkResult(bisect=None)
    if current is not None and current.get("id") != record.get("id"):
        raise EngineError(f"another bisect ({current.get('id')}, started "
                          f"{current.get('started')} by {current.get('by')}) is unfinished "
                          f"on {target.root}", "bisect_pending", json.dumps(current, sort_keys=True))
    target.ensure_meta()
    write_json(target.bisect_file, record, target.root)
    return wire.BisectMarkResult(bisect=record)


# ---------------------------------------------------------------- capture (read-only)




def op_capture(target: Target, request: wire.CaptureRequest,
               bundle: Path) -> wire.CaptureResult:
    """Hand edits on a managed tree as one full-index git diff, for `patchset capture`.
    Read-only: the controller turns the diff into a patch; the tree stays as it is."""
    state = target.state()
    if state is None:
        raise EngineError(f"target {target.root} is not managed by patchset: nothing to "
                          "capture (apply a selection first)", "usage")
    if target.is_git:
        foreign = foreign_commits(target, state)
        if foreign:
            raise EngineError(f"target {target.root} has commits on top of the series "
                              f"({foreign[0]}): capture takes uncommitted edits only", "usage")
        diff, files = _capture_git(target)
    else:
        diff, files = _capture_plain(target, state)
    if not files:
        raise EngineError(f"target {target.root} has no hand edits to capture", "usage")
    return wire.CaptureResult(target=str(target.root), diff=diff, files=files,
                              applied=state.names())


def _capture_git(target: Target) -> tuple[str, dict]:
    """`git diff HEAD` of tracked files; binary changes are refused (patches are text)."""
    numstat = git(target.root, "diff", "--numstat", "--no-renames", "HEAD")
    binary = [line.split("\t", 2)[2] for line in numstat.splitlines()
              if line.startswith("-\t-\t")]
    if binary:
        raise EngineError(f"cannot capture binary changes ({', '.join(binary[:5])}): patches "
                          "are text; restore those files first", "usage")
    diff = git(target.root, "diff", "--full-index", "--no-color", "--no-renames", "HEAD")
    files = {}
    for path in git(target.root, "diff", "--name-only", "--no-renames", "HEAD").split("\n"):
        if path:
            text_or_refuse(path, target.disk(path).read_bytes()
                            if target.disk(path).is_file() else b"")
            pre = run_git(["rev-parse", "--verify", "-q", f"HEAD:{path}"], target.root)
            files[path] = {"pre": pre.stdout.decode().strip() or None,
                           "post": file_blob(target.disk(path))}
    return diff, files


def _capture_plain(target: Target, state: TreeState) -> tuple[str, dict]:
    """Managed files that differ from the state, diffed against the stored expected blob."""
    parts, files = [], {}
    for item in drift(target, state):
        old = target.read_blob(item.expected) if item.expected else None
        disk_path = target.disk(item.path)
        new = disk_path.read_bytes() if item.found else None
        parts.append(file_diff(item.path, old, new, _mode(disk_path)))
        files[item.path] = {"pre": item.expected, "post": item.found}
    return "".join(parts), files


def _mode(path: Path) -> str:
    return "100755" if path.is_file() and os.access(path, os.X_OK) else "100644"


# ---------------------------------------------------------------- trace targets

def trace_targets(target: Target, state: TreeState | None) -> dict[str, list[dict]]:
    """`name:sha12` -> the trace targets (tracetargets.for_patch) of every applied patch,
    from each patch's own pre- and post-images: the applied series rebuilt off to the side
    from the copies kept in .patchset/patches (the same build as a revert's). Read-only."""
    from .lib import tracetargets  # deploy only: not on apply's path
    if state is None or not state.applied:
        return {}
    patches = target.meta / "patches"
    desired = [a.spec() for a in state.applied]
    with tempfile.TemporaryDirectory(prefix="patchset-trace-") as scratch:
        staging, steps = build(target, desired, patches, state.base["files"],
                               set(state.base["files"]), Path(scratch) / "txn")
        current = {p: (staging.base_content(p, b) if b else None)
                   for p, b in state.base["files"].items()}
    out = {}
    for applied, step in zip(state.applied, steps):
        files = []
        for path, after in step:
            files.append((path, current.get(path), after))
            current[path] = after
        found = tracetargets.for_patch(applied.name, files, target.prefix, applied.trace,
                                       applied.trace_mode)
        out[f"{applied.name}:{applied.sha256[:12]}"] = [t.to_json() for t in found]
    return out


# ---------------------------------------------------------------- units serving the tree

UNIT_MARK = re.compile(r"^X-Patchset-(Tree|Role)=(.*)$", re.M)


def unit_facts(target: Target, state: TreeState | None) -> list[UnitStatus]:
    """The systemd units that serve this tree (`X-Patchset-Tree=` in the unit, written by
    `patchset deploy`), and whether each still runs the tree as it is now: an active
    unit is judged by the one staleness rule (staleness.judge), from the unit's main
    process start and PATCHSET_PATCHES, read with the one systemctl and environ reader."""
    unit_dir = Path(os.environ.get("PATCHSET_UNIT_DIR", "/etc/systemd/system"))
    try:
        files = sorted(unit_dir.glob("*.service"))
    except OSError:
        return []
    applied = [a.to_json() for a in state.applied] if state else []
    updated = state.updated if state else None
    out = []
    for path in files:
        try:
            data = bounded.read_bytes(path, STATE_LIMIT, "unit file")
        except bounded.InputError:           # a FIFO or device named *.service, say
            continue
        marks = dict(UNIT_MARK.findall(data.decode("utf-8", "replace")))
        tree = marks.get("Tree", "").strip()
        if not tree or Path(tree).resolve() != target.root:
            continue
        out.append(_unit_fact(target, path, marks.get("Role", "").strip(), applied, updated))
    return out


def _unit_fact(target: Target, path: Path, role: str, applied: list[dict],
               updated: str | None) -> UnitStatus:
    from . import runner                 # status and deploy read units; apply never does
    from .lib.facts import systemd
    show = runner.unit_show(path.name)
    pid = show.get("MainPID") or 0
    started = systemd.main_started(show, time.time(), time.monotonic())
    environ = runner.environ_of(pid) if pid else None
    imports, managed = _process_imports(target, pid, environ) if pid else (None, None)
    running = environ.get(staleness.PATCHES_VAR) if environ is not None else None
    stale, why = staleness.judge(started, running, applied, updated, role, pid)
    active = show.get("ActiveState") == "active"
    return UnitStatus(
        unit=path.name, role=role, path=str(path),
        active=show.get("ActiveState"), sub=show.get("SubState"), main_pid=pid,
        started=_iso(started), tree_changed=updated, running_patches=running,
        patches=" ".join(staleness.role_patch_ids(applied, role)),
        stale=bool(active and stale), stale_reason=why if active else "not running",
        need_daemon_reload=show.get("NeedDaemonReload") == "yes",
        enabled=show.get("UnitFileState"), imports=imports, managed=managed)


def _process_imports(target: Target, pid: int,
                     environ: dict[str, str] | None) -> tuple[str | None, bool | None]:
    """Which tree the unit's running process imports, asked as the audit asks it
    (runner.process_import): (origin, is it this tree) or (None, None) if unknown."""
    from . import runner
    if environ is None:
        return None, None
    _, value = runner.process_import(pid, runner.argv_of(pid), environ, target.package)
    if not value.known:
        return None, None
    origin = value.value["origin"]
    return origin, _is_managed(target, origin)


def _is_managed(target: Target, origin: str | None) -> bool:
    if not origin:
        return False
    managed_dir = target.disk(target.prefix + target.package)
    return Path(origin).resolve().parent == managed_dir.resolve()


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


def interpreter_facts(target: Target, python: str | None) -> Interpreter | None:
    """Which tree does the SGLang interpreter really import? (find_spec, never an import:
    the one reader, runner.import_origin, that the audit uses for each server too.)"""
    from . import runner
    if not python:
        return None
    raw, value = runner.import_origin(python, target.package)
    if not value.known and raw.get("exit_code") == 0:
        # it ran and imports no such package: patching this tree is a no-op for it
        return Interpreter(python=python, managed=False, error=value.reason,
                           expected=str(target.disk(target.prefix + target.package) /
                                        "__init__.py"))
    if not value.known:
        return Interpreter(python=python, error=value.reason)
    origin = value.value["origin"]
    return Interpreter(python=python, imports=origin, managed=_is_managed(target, origin),
                       expected=str(target.disk(target.prefix + target.package) /
                                    "__init__.py"))


def _lock_holder(target: Target) -> str | None:
    path = target.meta / "lock"
    if not path.exists():
        return None
    with open_lock(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            return target._holder()


def provision_base(request: wire.ApplyRequest, bundle: Path) -> str:
    """No tree yet: clone the pin from the git remote if this host reaches it, else from
    the base bundle the controller shipped; else ask for the bundle (kind need_base)."""
    dest = Path(os.path.expanduser(request.target))
    base = request.base
    tmp = dest.parent / f".{dest.name}.provisioning-{os.getpid()}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    source = _clone_base(base, bundle, tmp)
    if source is None:
        raise EngineError(f"no tree at {dest} and the pinned base is not reachable from this "
                          "host", "need_base")
    for key, value in (("user.name", AUTHOR[0]), ("user.email", AUTHOR[1])):
        git(tmp, "config", key, value)
    os.rename(tmp, dest)
    return source


def _clone_base(base: BaseSource, bundle: Path, tmp: Path) -> str | None:
    shipped = bundle / "base.bundle"
    attempts: list[tuple[str, str, str | None]] = \
        [("controller", str(shipped.resolve()), None)] if shipped.exists() else []
    if base.git and not shipped.exists():
        _refuse_option("upstream.git.url", base.git.url)
        _refuse_option("upstream.git.ref", base.git.ref)
        attempts.append(("git", base.git.url, base.git.ref))
    commit = base.commit
    if shipped.exists() and not (isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}",
                                                                          commit)):
        raise EngineError(f"the request's base commit {commit!r} is not a 40-hex id", "usage")
    for source, url, ref in attempts:
        # url and ref come from a manifest: the ref is glued to --branch= and the url sits
        # after `--`, so git can read neither as an option; only real transports are
        # allowed (no ext:: or fd:: remote helpers).
        args = ["clone", "-q", "--no-checkout"] + (["--depth", "1", f"--branch={ref}"] if ref
                                                    else []) + ["--", url, str(tmp.resolve())]
        try:
            if run_git(args, None, extra={"GIT_ALLOW_PROTOCOL": "https:http:ssh:git:file"},
                       timeout=120).returncode != 0:
                raise EngineError(f"git clone of {url} failed")
            git(tmp, "checkout", "-q", "-B", "patchset",
                str(commit) if source == "controller" else "HEAD")
            return source
        except (subprocess.SubprocessError, EngineError):
            shutil.rmtree(tmp, ignore_errors=True)
    return None


def _refuse_option(field: str, value: object) -> None:
    """The controller validates the pin (patchset/pin/pinrules.py); the host checks again that
    no value could reach git as an option or carry a control character."""
    if (not isinstance(value, str) or not value or value.startswith(("-", "+"))
            or re.search(r"[\x00-\x20\x7f]", value) or re.match(r"[A-Za-z][A-Za-z0-9+.-]*::",
                                                                 value)):
        raise EngineError(f"{field}: {value!r} is not allowed for git (it could be read as "
                          "an option or a remote helper, or holds a space or control "
                          "character); nothing was run", "usage")


def serve(request: wire.Request, bundle: str | Path = ".",
          events: Events | None = None) -> wire.Result | wire.Failure:
    """The tree ops' frame (wire.OPS names the op's function): provision a missing tree,
    take the lock (status reads without it), finish an interrupted transaction, run the
    op; always a result (errors are a Failure)."""
    try:
        function = wire.op_function(sys.modules[__name__], request)
        provisioned = None
        if (isinstance(request, wire.ApplyRequest) and request.provision
                and not request.dry_run
                and not Path(os.path.expanduser(request.target)).exists()):
            provisioned = provision_base(request, Path(bundle))
        target = Target(request.target, request.git_prefix, request.package)
        if isinstance(request, wire.StatusRequest):
            return function(target, request)
        dry_run = isinstance(request, wire.TreeChangeRequest) and request.dry_run
        with target.lock(float(getattr(request, "lock_wait", 0.0)), request.op,
                         read_only=dry_run):
            if isinstance(request, wire.TreeChangeRequest) and not dry_run:
                refuse_during_bisect(target, request)
            recovered = recover(target)
            result = function(target, request, Path(bundle))
        return dataclasses.replace(result, recovered=recovered, provisioned=provisioned)
    except (EngineError, wire.WireError) as exc:
        return wire.Failure(exc.kind, str(exc), getattr(exc, "details", "") or "")
    except OSError as exc:   # permissions, disk full: say which file, never a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        return wire.Failure("target", f"{exc.strerror or exc}{where}; a journal, if "
                            "written, lets the next command finish")
