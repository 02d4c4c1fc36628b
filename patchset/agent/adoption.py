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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import engine
from .records import TreeState

SKIP_DIRS = ("__pycache__",)
SKIP_SUFFIXES = (".pyc", ".pyo")
READ_LIMIT = 512                     # files whose bytes one inventory returns
COMMIT_LIMIT = 500                   # commits after the base one inventory lists


# ---------------------------------------------------------------- records

@dataclass
class InventoryRequest:
    target: str
    git_prefix: str = "python/"
    package: str = "sglang"
    checkout: str | None = None      # a git checkout the served tree was installed from
    pin_commit: str | None = None    # the manifest's base commit, for the merge-base
    read: list[str] = field(default_factory=list)    # git paths whose bytes to return

    def to_json(self) -> dict:
        return {"op": "inventory", **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> InventoryRequest:
        return cls(target=str(data["target"]), git_prefix=str(data.get("git_prefix", "python/")),
                   package=str(data.get("package", "sglang")), checkout=data.get("checkout"),
                   pin_commit=data.get("pin_commit"), read=[str(p) for p in data.get("read", [])])


@dataclass
class Commit:
    """One first-parent commit after the base: its id, message and diff to its parent."""

    commit: str
    subject: str
    body: str
    diff: str                        # package paths only, --full-index, git layout
    author: str = ""                 # Name <email>


@dataclass
class GitFacts:
    root: str
    head: str
    base: str | None                 # merge-base of HEAD and the pin commit (None: unknown)
    base_why: str                    # how the base was found, or why not
    commits: list[Commit]
    head_files: dict[str, str]       # git path -> blob at HEAD (package files)
    dirty: list[str]                 # uncommitted changes in the checkout


@dataclass
class InventoryResult:
    target: str
    kind: str                        # git | plain
    layout: str                      # git | wheel
    managed: bool
    files: dict[str, str]            # git path -> blob id of every served package file
    git: GitFacts | None = None
    served: dict[str, str | None] = field(default_factory=dict)   # read: bytes (latin-1)
    at_head: dict[str, str | None] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> InventoryResult:
        g = data.get("git")
        facts = None if g is None else GitFacts(
            root=g["root"], head=g["head"], base=g.get("base"), base_why=g.get("base_why", ""),
            commits=[Commit(**c) for c in g.get("commits", [])],
            head_files=dict(g.get("head_files", {})), dirty=list(g.get("dirty", [])))
        return cls(target=data["target"], kind=data["kind"], layout=data["layout"],
                   managed=bool(data["managed"]), files=dict(data["files"]), git=facts,
                   served=dict(data.get("served", {})), at_head=dict(data.get("at_head", {})))


@dataclass
class AdoptRequest:
    target: str
    state: dict                      # the TreeState to record
    expected: dict[str, str]         # served git path -> blob the plan was made from
    patches: list[str]               # bundle names of the patch files (kept for revert)
    base_objects: list[str]          # bundle names base/<blob>: plain trees' pre-images
    git_prefix: str = "python/"
    package: str = "sglang"

    def to_json(self) -> dict:
        return {"op": "adopt", **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> AdoptRequest:
        return cls(target=str(data["target"]), state=dict(data["state"]),
                   expected=dict(data["expected"]), patches=list(data.get("patches", [])),
                   base_objects=list(data.get("base_objects", [])),
                   git_prefix=str(data.get("git_prefix", "python/")),
                   package=str(data.get("package", "sglang")))


@dataclass
class AdoptResult:
    target: str
    files_hashed: int
    identical: bool                  # every served byte the same before and after
    applied: list[str]

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> AdoptResult:
        return cls(target=data["target"], files_hashed=int(data["files_hashed"]),
                   identical=bool(data["identical"]), applied=list(data["applied"]))


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
    import subprocess
    proc = subprocess.run(["git", "cat-file", "blob", f"HEAD:{path}"], cwd=checkout,
                          capture_output=True, env=engine.git_env())
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
    import subprocess
    found = subprocess.run(["git", "cat-file", "-e", f"{pin}^{{commit}}"], cwd=root,
                           capture_output=True, env=engine.git_env())
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


def run(request: dict, bundle: Path) -> dict:
    """The ops' entry (main.py): errors are results, like every op's."""
    try:
        if request.get("op") == "inventory":
            return inventory(InventoryRequest.from_json(request)).to_json()
        return adopt(AdoptRequest.from_json(request), bundle).to_json()
    except engine.EngineError as exc:
        return {"ok": False, "error": {"kind": exc.kind, "message": str(exc),
                                       "details": exc.details}}
    except (KeyError, TypeError, ValueError) as exc:
        return {"ok": False, "error": {"kind": "usage", "details": "",
                                       "message": f"malformed {request.get('op')} request: {exc}"}}
    except OSError as exc:
        return {"ok": False, "error": {"kind": "target", "details": "", "message":
                                       f"{exc.strerror or exc} ({exc.filename})"}}
