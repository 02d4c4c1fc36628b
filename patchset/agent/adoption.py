"""`adopt` on a host: read an unmanaged tree the server imports, then put it under
management without changing one byte of it.

Two ops (stdlib only, like the whole agent), each a request and a result record:

- `inventory` (read-only): every served file of the package with its git blob id; for a
  git checkout (the served tree, or `checkout` beside a site-packages install) its HEAD,
  the merge-base with the pin commit and each first-parent commit after it with its diff;
  and the bytes of the files the controller asks for (`read`: served and at HEAD).
- `adopt` (writes .patchset/ only): hashes every served file, refuses a managed tree or a
  tree that is not what the controller planned on, records the state (base pre-images
  and patch copies for revert), hashes again; any difference removes what it wrote.

Why its own module: the adoption ops are new and the other ops' records live in
records.py; these records are the wire of these two ops only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import engine
from .gitenv import run_git
from .wire import (AdoptRequest, AdoptResult, Commit, Failure, GitFacts, InventoryRequest,
                   InventoryResult, Request)
from .records import TreeState

SKIP_DIRS = ("__pycache__",)
SKIP_SUFFIXES = (".pyc", ".pyo")
READ_LIMIT = 512                     # files whose bytes one inventory returns
COMMIT_LIMIT = 500                   # commits after the base one inventory lists


# The records (InventoryRequest/Result, AdoptRequest/Result, GitFacts, Commit) are the
# wire's (wire.py), like every op's.

# ---------------------------------------------------------------- reading

def served_files(target: engine.Target) -> dict[str, str]:
    """git path -> blob id of every file of the package the server imports (bytecode
    caches left out: the interpreter writes those itself)."""
    top = target.disk(f"{target.prefix}{target.package}")
    out: dict[str, str] = {}
    for folder, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in names:
            path = Path(folder) / name
            if name.endswith(SKIP_SUFFIXES) or path.is_symlink() or not path.is_file():
                continue
            rel = path.relative_to(top).as_posix()
            out[f"{target.prefix}{target.package}/{rel}"] = engine.file_blob(path) or ""
    return out


def inventory(req: InventoryRequest) -> InventoryResult:
    target = engine.Target(req.target, req.git_prefix, req.package)
    files = served_files(target)
    checkout = Path(req.checkout) if req.checkout else (target.root if target.is_git
                                                        else installed_from(target))
    facts = _git_facts(checkout, req) if checkout is not None else None
    wanted = req.read[:READ_LIMIT]
    served = {p: _text(target.disk(p)) for p in wanted}
    at_head = {p: _at_head(checkout, p) for p in wanted} if facts else {}
    return InventoryResult(str(target.root), "git" if target.is_git else "plain",
                           target.layout, target.state_file.exists(), files, facts,
                           served, at_head)


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


def _text(path: Path) -> str | None:
    """File bytes as latin-1 text (lossless through JSON); None: no such file."""
    return path.read_bytes().decode("latin-1") if path.is_file() else None


def _at_head(checkout: Path, path: str) -> str | None:
    proc = run_git(["cat-file", "blob", f"HEAD:{path}"], checkout)
    return proc.stdout.decode("latin-1") if proc.returncode == 0 else None


def _git_facts(root: Path, req: InventoryRequest) -> GitFacts:
    if not (root / ".git").exists():
        raise engine.EngineError(f"{root} is not a git checkout", "usage")
    head = engine.git(root, "rev-parse", "HEAD").strip()
    base, why = _merge_base(root, head, req.pin_commit)
    scope = f"{req.git_prefix}{req.package}/"
    commits = []
    if base is not None:
        ids = engine.git(root, "rev-list", "--first-parent", "--reverse",
                         f"{base}..{head}").split()[:COMMIT_LIMIT]
        commits = [_commit(root, c, scope) for c in ids]
    listing = engine.git(root, "ls-tree", "-r", "--full-tree", "HEAD", "--", scope)
    head_files = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        if meta.split()[1] == "blob":
            head_files[path] = meta.split()[2]
    dirty = engine.git(root, "status", "--porcelain=v1", "--untracked-files=no",
                       env={"GIT_OPTIONAL_LOCKS": "0"}).splitlines()
    return GitFacts(str(root), head, base, why, commits, head_files,
                    [d[3:] for d in dirty if d.strip()])


def _merge_base(root: Path, head: str, pin: str | None) -> tuple[str | None, str]:
    if not pin:
        return None, "no pin commit given"
    found = run_git(["cat-file", "-e", f"{pin}^{{commit}}"], root)
    if found.returncode != 0:
        return None, f"the pin commit {pin[:12]} is not in {root}"
    base = engine.git(root, "merge-base", head, pin).strip()
    return base, f"git merge-base HEAD {pin[:12]} in {root}"


def _commit(root: Path, commit: str, scope: str) -> Commit:
    message = engine.git(root, "log", "-1", "--format=%an <%ae>%x00%s%x00%b", commit)
    author, subject, body = (message.split("\0", 2) + ["", ""])[:3]
    diff = engine.git(root, "diff", "--full-index", "--no-color", "--no-renames", "-U3",
                      f"{commit}^1", commit, "--", scope, env=engine.LITERAL)
    return Commit(commit, subject.strip(), body.strip(), diff, author.strip())


# ---------------------------------------------------------------- adopting

def adopt(req: AdoptRequest, bundle: Path) -> AdoptResult:
    """Record the state; the served files are hashed before and after, and any difference
    (or failure) removes .patchset/ again, so the tree is as it was."""
    target = engine.Target(req.target, req.git_prefix, req.package)
    if target.state_file.exists():
        raise engine.EngineError(f"{target.root} is already managed by patchset; adopt takes "
                                 "an unmanaged tree (nothing was changed)", "usage")
    leftover = target.meta.exists()      # a killed adopt's (no state): rewritten whole
    before = served_files(target)
    moved = sorted(p for p in set(before) | set(req.expected)
                   if before.get(p) != req.expected.get(p))
    if moved:
        raise engine.EngineError(f"{target.root} changed since the plan was made "
                                 f"({', '.join(moved[:5])}): run adopt again (nothing was "
                                 "changed)", "usage")
    state = TreeState.from_json(req.state, "the adopt request")
    state.updated = last_change(target)
    try:
        _record(target, state, req, bundle)
        after = served_files(target)
        if after != before:
            raise engine.EngineError(f"{target.root}: served files changed while adopting; "
                                     "the management state was removed", "target")
    except BaseException:
        if leftover:
            target.state_file.unlink(missing_ok=True)
        else:
            shutil.rmtree(target.meta, ignore_errors=True)
        raise
    return AdoptResult(str(target.root), len(before), True, state.names())


def last_change(target: engine.Target) -> str:
    """The state's `updated`: when the served files last changed (their newest mtime), not
    the adoption's time. Adopting changes no byte, so a process started after that moment
    runs exactly the adopted series (the time rule of staleness.judge)."""
    import time
    top = target.disk(f"{target.prefix}{target.package}")
    newest = max((p.stat().st_mtime for p in top.rglob("*") if p.is_file()
                  and "__pycache__" not in p.parts), default=0.0)
    t = min(newest, time.time())
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _record(target: engine.Target, state: TreeState, req: AdoptRequest, bundle: Path) -> None:
    target.ensure_meta()
    for name in req.base_objects:
        target.store_blob((bundle / name).read_bytes())
    for name in req.patches:
        data = (bundle / name).read_bytes()
        engine.write_atomic(target.meta / "patches" / Path(name).name, data, target.root)
    if target.is_git:
        state.head = target.head()
        engine.git(target.root, "update-ref", engine.BASE_REF, state.base["commit"])
    engine.write_json(target.state_file, state.to_json(), target.root)


def run(request: Request, bundle: Path) -> InventoryResult | AdoptResult | Failure:
    """The ops' entry (main.py): errors are results, like every op's."""
    try:
        if isinstance(request, InventoryRequest):
            return inventory(request)
        if isinstance(request, AdoptRequest):
            return adopt(request, bundle)
        return Failure("usage", f"not an adoption op: {request.op!r}")
    except engine.EngineError as exc:
        return Failure(exc.kind, str(exc), exc.details)
    except (KeyError, TypeError, ValueError) as exc:
        return Failure("usage", f"malformed {request.op} request: {exc}")
    except OSError as exc:
        return Failure("target", f"{exc.strerror or exc} ({exc.filename})")
