"""Call-path guards: the live settings a patch's code path depends on, derived from the
pinned code, next to what its `requires` and `gate` declare.

A patch is shown `active` when its declared conditions hold; but the upstream code
between the server's forward entry and the patched function may test more (an env
variable, a server argument, the platform) that nobody declared. Each such test is a
guard: derived here from the pinned tree and each patch's post-images (patchset/analysis/callpath.py
walks up from the functions the patch changes, the trace targets of
patchset/agent/lib/tracetargets.py), named like a `requires` fact (`env.X`, `server.X`,
`gpu.compute_cap`; `platform.hip` and the like have no fact) so that coverage is a name
comparison. `patchset show` lists them, `patchset check` lists the uncovered ones, the
audit reads their live values (auditor/guards.py) and `patchset rebase` says which moved.

Derivation reads the whole package once per base (a second or two); the result is kept in
the cache under a key of the pin, the patches' hashes and this code's own, so `check`,
`show` and the audit reuse it and never go stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from patchset.analysis import callpath
from patchset.series import patchfile
from patchset.agent.lib import bounded
from patchset.agent.lib.gitblob import EngineError, git_apply
from patchset.errors import ManifestError, UpstreamError
from patchset.series.model import Patch, Series
from patchset.pin.model import UpstreamPin
from patchset.pin.upstream import BaseTree, cache_root, provision, tree_files

CACHE_DIR = "guards"
CACHE_LIMIT = 16 * bounded.MIB       # the shipped series' guards are ~100 KiB
_TREES: dict[tuple[str, str, str], callpath.SourceTree] = {}
_CODE: list[str] = []           # this code's hash, once per process (series_key)


@dataclass(frozen=True)
class Guard:
    """One condition on a patch's call path that reads a live setting."""

    fact: str             # env.NAME | server.FIELD | gpu.compute_cap | platform.hip
    kind: str             # env | server | platform
    file: str             # git path of the test
    line: int
    function: str         # qualname of the function the test sits in
    hops: int             # 0: in a patched function, n: n callers up
    test: str             # the test as written
    needs: bool           # the path goes on while the test is true (False: while false)
    parse: str = "raw"    # how a live env string reads (callpath.Read.parse)
    default: Any = None   # what the code sees when nobody sets it
    has_default: bool = True
    via: str = ""         # names followed from the test to the read

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def condition(self) -> str:
        """The test as the path needs it: `X`, or `not (X)`."""
        if self.needs:
            return self.test
        return f"not ({self.test})" if " " in self.test else f"not {self.test}"

    @property
    def name(self) -> str:
        """The setting without its namespace: SGLANG_X, attention_backend, hip."""
        return self.fact.partition(".")[2]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Guard:
        return cls(**data)


@dataclass(frozen=True)
class PatchGuards:
    """A patch's guards, nearest first, and what the walk could not follow."""

    patch: str
    guards: tuple[Guard, ...]
    notes: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()   # the function trace targets walked, `module:qualname`

    def to_json(self) -> dict:
        return {"patch": self.patch, "guards": [g.to_json() for g in self.guards],
                "notes": list(self.notes), "targets": list(self.targets)}

    @classmethod
    def from_json(cls, data: dict) -> PatchGuards:
        return cls(data["patch"], tuple(Guard.from_json(g) for g in data["guards"]),
                   tuple(data["notes"]), tuple(data.get("targets", ())))


@dataclass(frozen=True)
class Covered:
    """A guard and the declaration that covers it (None: nothing does)."""

    guard: Guard
    by: str | None


@dataclass(frozen=True)
class GuardChange:
    """`patchset rebase`: a patch's guards on the new release against the old pin."""

    patch: str
    appeared: tuple[Guard, ...] = ()
    vanished: tuple[Guard, ...] = ()
    moved: tuple[tuple[Guard, Guard], ...] = ()     # (on the old pin, on the new release)

    @property
    def changed(self) -> bool:
        return bool(self.appeared or self.vanished or self.moved)


# ---------------------------------------------------------------- derivation

def load_tree(base: BaseTree, pin: UpstreamPin) -> callpath.SourceTree:
    """The base's package files the server runs (callpath.SCOPE), read once per process."""
    root = f"{pin.git_prefix}{pin.name}/"
    key = (str(base.repo), base.commit, root)
    if key not in _TREES:
        files = {p: data.decode("utf-8", "replace") for p, data in
                 tree_files(base, root).items() if callpath.in_scope(root, p)}
        _TREES[key] = callpath.SourceTree(root, files)
    return _TREES[key]


def derive(series: Series, base: BaseTree) -> dict[str, PatchGuards]:
    """Every patch's guards, each walked in the tree as it is after that patch (the base
    with the patches up to it applied), in series order."""
    root = Path(series.root)
    items = [(p.name, (root / p.file).read_bytes().decode("utf-8", "replace"), p.trace)
             for p in series.patches]
    return derive_texts(load_tree(base, series.upstream), items, series.upstream.git_prefix)


def derive_texts(tree: callpath.SourceTree, items: Iterable[tuple[str, str, Any]],
                 git_prefix: str) -> dict[str, PatchGuards]:
    """derive() of (name, patch text, manifest trace entries) in order on `tree`; a patch
    that `git apply` refuses on the tree so far gets no guards and a note."""
    from patchset.agent.lib import tracetargets
    defaults = callpath.read_defaults(tree)
    out: dict[str, PatchGuards] = {}
    for name, text, declared in items:
        try:          # the files the server runs (callpath.SCOPE); the rest has no guards
            files = post_images(tree, text)
        except (ManifestError, EngineError) as exc:
            out[name] = PatchGuards(name, (), (f"does not apply on the tree here ({exc}): "
                                               "no guards derived",))
            continue
        tree = tree.overlay({p: a.decode("utf-8", "replace") if a is not None else None
                             for p, _, a in files})
        images = [(p, _bytes(b), a) for p, b, a in files]
        found = [t for t in tracetargets.for_patch(name, images, git_prefix,
                                                   [_trace(t) for t in declared or ()])
                 if t.qualname != tracetargets.MODULE]
        targets = [callpath.Target(t.file or _module_file(t.module, git_prefix), t.qualname,
                                   _changed(images, t.file)) for t in found]
        conditions, notes = callpath.Walk(tree, defaults).run(targets)
        out[name] = PatchGuards(name, _flatten(conditions), tuple(notes),
                                tuple(dict.fromkeys(f"{t.module}:{t.qualname}" for t in found)))
    return out


def post_images(tree: callpath.SourceTree, text: str
                ) -> list[tuple[str, str | None, bytes | None]]:
    """(path, before, after; None: no such file) of each file the patch `text` changes
    that the server runs (callpath.SCOPE), by `git apply` on copies of them from `tree`."""
    paths = [c.path for c in patchfile.changes(text, "patch")
             if callpath.in_scope(tree.root, c.path)]
    if not paths:
        return []
    with tempfile.TemporaryDirectory(prefix="patchset-guards-") as scratch:
        work = Path(scratch) / "work"
        work.mkdir()
        for path in paths:
            if tree.files.get(path) is not None:
                (work / path).parent.mkdir(parents=True, exist_ok=True)
                (work / path).write_bytes(tree.files[path].encode("utf-8"))
        git_apply(work, text.encode("utf-8"), Path(scratch), include=paths)
        return [(p, tree.files.get(p), (work / p).read_bytes() if (work / p).is_file()
                 else None) for p in paths]


def _flatten(conditions: list[callpath.Condition]) -> tuple[Guard, ...]:
    seen: dict[tuple[str, str, int], Guard] = {}
    for c in conditions:
        for r in c.reads:
            key = (r.fact, c.file, c.line)
            if key not in seen or c.hops < seen[key].hops:
                seen[key] = Guard(r.fact, r.kind, c.file, c.line, c.function, c.hops, c.test,
                                  c.needs, r.parse, r.default, r.has_default, r.via)
    return tuple(sorted(seen.values(), key=lambda g: (g.hops, g.file, g.line, g.fact)))


def _bytes(text: str | None) -> bytes | None:
    return text.encode("utf-8") if text is not None else None


def _changed(images: list[tuple[str, bytes | None, bytes | None]], path: str) -> frozenset[int]:
    from patchset.agent.lib.tracetargets import changed_lines
    for p, before, after in images:
        if p == path and after is not None:
            return frozenset(changed_lines(before, after.decode("utf-8", "replace")))
    return frozenset()


def _module_file(module: str, git_prefix: str) -> str:
    return f"{git_prefix}{module.replace('.', '/')}.py"


def _trace(spec: Any) -> dict:
    return {"module": spec.module, "qualname": spec.qualname, "file": spec.file}


# ---------------------------------------------------------------- coverage

def covered_by(guard: Guard, patch: Patch, series: Series) -> str | None:
    """The declaration that covers `guard`: a `requires` on the same fact, the patch's
    gate, the gate of a patch it requires (`patch.X`), or, for a platform test, any `gpu.`
    requirement (nvidia-smi's facts pin an NVIDIA GPU of that kind)."""
    for req in patch.requires:
        if req.fact == guard.fact:
            return f"requires {req.fact}"
    if patch.gate and guard.fact == f"env.{patch.gate.env}":
        return f"gate {patch.gate.env}"
    others = series.by_name()
    for req in patch.requires:
        other = others.get(req.fact.partition(".")[2]) if req.fact.startswith("patch.") \
            else None
        if other and other.gate and guard.fact == f"env.{other.gate.env}":
            return f"requires {req.fact} (its gate {other.gate.env})"
    if guard.kind == "platform":
        gpu = next((r.fact for r in patch.requires if r.fact.startswith("gpu.")), None)
        if gpu:
            return f"requires {gpu}"
    return None


def coverage(series: Series, derived: dict[str, PatchGuards]) -> dict[str, list[Covered]]:
    """Per patch (series order), each guard with what covers it."""
    return {p.name: [Covered(g, covered_by(g, p, series)) for g in derived[p.name].guards]
            for p in series.patches if p.name in derived}


def uncovered(series: Series, derived: dict[str, PatchGuards]) -> list[tuple[str, Guard]]:
    """(patch, guard) for every guard that neither `requires` nor `gate` covers."""
    return [(name, c.guard) for name, items in coverage(series, derived).items()
            for c in items if c.by is None]


def for_patch(series: Series, name: str, base: BaseTree | None = None,
              offline: bool = True) -> tuple[list[Covered], tuple[str, ...]] | None:
    """One patch's guards with what covers each, and the walk's notes (`patchset show`);
    None when the pinned base is not available."""
    derived = stored(series, base, offline=offline)
    if derived is None or name not in derived:
        return None
    return coverage(series, derived)[name], derived[name].notes


def declared_facts(patch: Patch) -> set[str]:
    """The env and server facts a patch's `requires` and `gate` name."""
    out = {r.fact for r in patch.requires if r.fact.startswith(("env.", "server."))}
    return out | ({f"env.{patch.gate.env}"} if patch.gate else set())


# ---------------------------------------------------------------- the cache

def stored(series: Series, base: BaseTree | None = None, cache: Path | None = None,
           offline: bool = True) -> dict[str, PatchGuards] | None:
    """The series' guards from the cache, else derived (and kept there); None when the
    pinned base is not available (`offline` and never provisioned)."""
    cache = Path(cache) if cache is not None else cache_root()
    path = cache / CACHE_DIR / f"{series_key(series)}.json"
    try:
        data = bounded.read_json(path, CACHE_LIMIT, "guards cache")
        return {d["patch"]: PatchGuards.from_json(d) for d in data["patches"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if base is None:
        try:
            base = provision(series.upstream, cache, offline=offline)
        except UpstreamError:
            return None
    derived = derive(series, base)
    _write(path, {"key": path.stem, "patches": [g.to_json() for g in derived.values()]})
    return derived


def series_key(series: Series) -> str:
    """The pin, each patch's name, file hash and trace entries, and this code's hash: what
    the guards are a function of."""
    doc = {"pin": asdict(series.upstream), "code": _code_hash(),
           "patches": [[p.name, p.sha256 or _sha256(Path(series.root) / p.file),
                        [_trace(t) for t in p.trace], p.trace_mode] for p in series.patches]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def _code_hash() -> str:
    if not _CODE:
        code = Path(callpath.__file__).read_bytes() + Path(__file__).read_bytes()
        _CODE.append(hashlib.sha256(code).hexdigest())
    return _CODE[0]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(path: Path, data: dict) -> None:
    """Atomically; a cache that cannot be written only costs the next run a derivation."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".guards.", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass


# ---------------------------------------------------------------- rebase

def compare(old: PatchGuards, new: PatchGuards) -> GuardChange:
    """Guards are the same guard when they read the same fact in the same function of the
    same file (the n-th such test matched with the n-th): one whose line changed moved."""
    before, after = _identities(old.guards), _identities(new.guards)
    moved = tuple((before[k], after[k]) for k in before if k in after
                  and before[k].line != after[k].line)
    return GuardChange(old.patch,
                       appeared=tuple(g for k, g in after.items() if k not in before),
                       vanished=tuple(g for k, g in before.items() if k not in after),
                       moved=moved)


def _identities(guards: Iterable[Guard]) -> dict[tuple[str, str, str, int], Guard]:
    out: dict[tuple[str, str, str, int], Guard] = {}
    for g in sorted(guards, key=lambda g: (g.file, g.function, g.fact, g.line)):
        n = 0
        while (g.fact, g.file, g.function, n) in out:
            n += 1
        out[(g.fact, g.file, g.function, n)] = g
    return out
