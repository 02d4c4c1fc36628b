"""`patchset adopt HOST`: from an unmanaged fork a server runs to a proposed series, and
with `write` to a managed host, without changing one byte the server imports.

Why: users arrive with a server running upstream plus local commits and hand edits, and no
record of which is which. This reads the served tree through the agent (ops `inventory`
and `adopt`, patchset/agent/adoption.py), finds the base with evidence (the merge-base
with the pin for a git checkout; else the release whose files match best: the pin and the
wheels in the local cache), and proposes one patch per local commit and one for the hand
edits (or one per edited file, `split`), each with a proposed gate (an env switch its diff
introduces), its trace targets and call-path guards (patchset/guards.py, as `show`
derives them). Writing goes through `import` (patchset/interop.py: every patch checked on
the pin) and is undone when the host refuses.
"""

from __future__ import annotations

import re
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__, api, interop
from .agent import engine, wire
from .agent.records import AppliedPatch, TreeState, now_stamp
from .errors import UsageError
from .model import Series
from .progress import NullProgress, Progress

if TYPE_CHECKING:
    from .transport import Transport
    from .upstream import BaseTree

ENV_READ = re.compile(r"""(?:getenv\(|environ\.get\(|environ\[)\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
HAND_EDITS = "hand-edits"


@dataclass(frozen=True)
class AdoptOptions:
    checkout: str | None = None      # on the host: the git checkout a site-packages came from
    split: bool = False              # hand edits: one patch per file
    tier: str = "risky"
    path: str = "both"
    offline: bool = False
    author: str | None = None        # DEP-3 Author of the hand edits (commits name theirs)


@dataclass(frozen=True)
class BaseEvidence:
    """One candidate base and how well the served files match it."""

    label: str                       # sglang 0.5.14 (the pin), a cached wheel, a merge-base
    source: str                      # pin | wheel cache | merge-base
    commit: str | None
    compared: int                    # served package files compared
    matching: int                    # ... identical to the candidate's
    is_pin: bool


@dataclass(frozen=True)
class ProposedPatch:
    name: str
    source: str                      # "commit 1a2b3c4d5e6f" or "hand edit"
    summary: str
    files: list[str]
    gate: dict | None                # {"env": NAME, "on": "1"}: an env switch it introduces
    trace_targets: list[str]
    guards: list[str]
    tier: str
    path: str
    diff: str
    author: str | None = None


@dataclass(frozen=True)
class LeftOut:
    commit: str
    subject: str
    why: str


@dataclass
class AdoptPlan:
    host: str
    target: str
    layout: str
    base: BaseEvidence
    candidates: list[BaseEvidence]
    patches: list[ProposedPatch]
    left_out: list[LeftOut]
    served: dict[str, str] = field(repr=False, default_factory=dict)
    notes: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)     # --write: the patch names
    files_hashed: int = 0                                # --write: served files compared

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("served")
        for p in data["patches"]:
            p.pop("diff")
        return data


# ---------------------------------------------------------------- the plan

def plan(series: Series, transport: Transport, options: AdoptOptions,
         progress: Progress | None = None) -> AdoptPlan:
    """Read the host and propose a series; nothing is written anywhere."""
    from .upstream import provision
    progress = progress or NullProgress()
    pin = series.upstream
    base = provision(pin, progress=progress, offline=options.offline)
    inv = _inventory(transport, series, options, base.commit, [])
    if inv.managed:
        raise UsageError(f"{transport.host}: {inv.target} is already managed by patchset; "
                         "adopt takes an unmanaged tree (see `patchset status`)")
    pin_files = _pin_blobs(base, pin)
    chosen, candidates = _choose_base(series, inv, pin_files)
    commits, left_out = _local_commits(inv, base)
    expected = dict(inv.git.head_files) if inv.git and inv.git.base else pin_files
    edited = sorted(p for p, b in inv.files.items() if expected.get(p) != b)
    read = _inventory(transport, series, options, base.commit, edited) if edited else inv
    patches = [_from_commit(c, options) for c in commits]
    patches += _hand_edits(read, edited, base, inv.git is not None and inv.git.base is not None,
                           options)
    _derive(patches, base, series)
    return AdoptPlan(transport.host, inv.target, inv.layout, chosen, candidates, patches,
                     left_out, served=inv.files, notes=_notes(inv, chosen))


def _inventory(transport: Transport, series: Series, options: AdoptOptions, pin_commit: str,
               read: list[str]) -> wire.InventoryResult:
    from .transport import raise_for
    req = wire.InventoryRequest(target=transport.target,
                                git_prefix=series.upstream.git_prefix,
                                package=series.upstream.name, checkout=options.checkout,
                                pin_commit=pin_commit, read=read)
    result = raise_for(transport.host, transport.call(req))
    assert isinstance(result, wire.InventoryResult)
    return result


def _pin_blobs(base: BaseTree, pin) -> dict[str, str]:
    from .upstream import tree_files
    files = tree_files(base, f"{pin.git_prefix}{pin.name}/", suffix="")
    return {p: engine.blob_id(data) for p, data in files.items()}


def _choose_base(series: Series, inv: wire.InventoryResult,
                 pin_files: dict[str, str]) -> tuple[BaseEvidence, list[BaseEvidence]]:
    """The merge-base where a checkout says it; else the best-matching candidate."""
    pin = series.upstream
    label = f"{pin.name} {pin.version} (the pin)"
    candidates = [_evidence(label, "pin", None, inv.files, pin_files, True)]
    for wheel, files in _cached_wheels(pin):
        candidates.append(_evidence(wheel, "wheel cache", None, inv.files, files,
                                    files == pin_files))
    if inv.git and inv.git.base:
        git = inv.git
        return BaseEvidence(f"merge-base {git.base[:12]} ({git.base_why})", "merge-base",
                            git.base, len(inv.files), candidates[0].matching, True), candidates
    best = max(candidates, key=lambda c: (c.matching, c.is_pin))
    return best, candidates


def _evidence(label: str, source: str, commit: str | None, served: dict[str, str],
              files: dict[str, str], is_pin: bool) -> BaseEvidence:
    matching = sum(1 for p, b in served.items() if files.get(p) == b)
    return BaseEvidence(label, source, commit, len(served), matching, is_pin)


def _cached_wheels(pin) -> list[tuple[str, dict[str, str]]]:
    """Every cached wheel of the package other than the pin's: git path -> blob id."""
    from .upstream import cache_root
    out = []
    mine = pin.pypi.file if pin.pypi else None
    for wheel in sorted((cache_root() / "wheels").glob(f"{pin.name}-*.whl")):
        if wheel.name == mine:
            continue
        try:
            with zipfile.ZipFile(wheel) as zf:
                out.append((wheel.name, {f"{pin.git_prefix}{i.filename}": engine.blob_id(
                    zf.read(i)) for i in zf.infolist() if i.filename.startswith(f"{pin.name}/")
                    and not i.is_dir()}))
        except (OSError, zipfile.BadZipFile):
            continue
    return out


def _local_commits(inv: wire.InventoryResult,
                   base: BaseTree) -> tuple[list[wire.Commit], list[LeftOut]]:
    """The checkout's commits after the base: local ones are proposed; upstream ones (known
    to the pin's cached repository) and ones that change no package file are left out."""
    if inv.git is None or inv.git.base is None:
        return [], []
    local, left = [], []
    for c in inv.git.commits:
        if _in_upstream(base, c.commit):
            left.append(LeftOut(c.commit, c.subject, "an upstream commit"))
        elif not c.diff.strip():
            left.append(LeftOut(c.commit, c.subject, "changes no file of the package"))
        else:
            local.append(c)
    return local, left


def _in_upstream(base: BaseTree, commit: str) -> bool:
    from .agent.gitenv import LOCAL, run_git
    proc = run_git(["cat-file", "-e", f"{commit}^{{commit}}"], base.repo, mode=LOCAL)
    return proc.returncode == 0


def _from_commit(c: wire.Commit, options: AdoptOptions) -> ProposedPatch:
    return ProposedPatch(interop.slug(c.subject), f"commit {c.commit[:12]}", c.subject,
                         _paths(c.diff), None, [], [], options.tier, options.path, c.diff,
                         c.author or None)


def _hand_edits(read: wire.InventoryResult, edited: list[str], base: BaseTree,
                from_head: bool, options: AdoptOptions) -> list[ProposedPatch]:
    from .upstream import blob_reader
    pristine = blob_reader(base)
    diffs = {}
    for path in edited:
        new = _bytes(read.served.get(path))
        old = _bytes(read.at_head.get(path)) if from_head else pristine(path)
        diffs[path] = engine._file_diff(path, old, new, "100644")
    if not diffs:
        return []
    groups = [[p] for p in edited] if options.split else [edited]
    out = []
    for paths in groups:
        name = f"{HAND_EDITS}-{interop.slug(Path(paths[0]).stem)}" if options.split else HAND_EDITS
        out.append(ProposedPatch(name, "hand edit", f"hand edits in {', '.join(paths)}", paths,
                                 None, [], [], options.tier, options.path,
                                 "".join(diffs[p] for p in paths), options.author))
    return out


def _bytes(text: str | None) -> bytes | None:
    return text.encode("latin-1") if text is not None else None


def _paths(diff: str) -> list[str]:
    return sorted(set(re.findall(r"^diff --git a/(\S+) b/", diff, re.M)))


def _derive(patches: list[ProposedPatch], base: BaseTree, series: Series) -> None:
    """Gates, trace targets and call-path guards, as `show` derives them, in order."""
    from . import guards
    tree = guards.load_tree(base, series.upstream)
    derived = guards.derive_texts(tree, [(p.name, p.diff, ()) for p in patches],
                                  series.upstream.git_prefix)
    known = "\n".join(tree.files.values())
    for i, p in enumerate(patches):
        d = derived.get(p.name)
        patches[i] = ProposedPatch(**{**asdict(p), "gate": proposed_gate(p.diff, known),
                                      "trace_targets": list(d.targets) if d else [],
                                      "guards": sorted({g.fact for g in d.guards}) if d else []})


def proposed_gate(diff: str, known: str) -> dict | None:
    """The first env variable the diff's added lines read that the base never mentions:
    the patch's own switch, proposed as its gate (on when set to 1)."""
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            for name in ENV_READ.findall(line):
                if name not in known:
                    return {"env": name, "on": "1"}
    return None


def _notes(inv: wire.InventoryResult, chosen: BaseEvidence) -> list[str]:
    notes = []
    if not chosen.is_pin:
        notes.append(f"the best base is {chosen.label}, not the pin: run `patchset init` for "
                     "it, or `patchset rebase --onto` it, before adopting")
    if inv.git and inv.git.base is None:
        notes.append(f"local commits not read: {inv.git.base_why}")
    if inv.git and inv.git.dirty:
        notes.append(f"uncommitted in {inv.git.root}: {', '.join(inv.git.dirty[:5])}")
    return notes


# ---------------------------------------------------------------- writing

def write(series: Series, transport: Transport, adopt_plan: AdoptPlan, force: bool = False,
          author: str | None = None, progress: Progress | None = None) -> AdoptPlan:
    """patches.yaml + patches/ from the plan, checked on the pin, then the host's state;
    the manifest and patch files are put back as they were when the host refuses."""
    if series.patches and not force:
        raise UsageError(f"{series.manifest}: already holds a series "
                         f"({len(series.patches)} patches); adopt writes a new one: pass "
                         "--force to replace it")
    if not adopt_plan.base.is_pin:
        raise UsageError(f"{transport.host}: {adopt_plan.notes[0]}")
    if not adopt_plan.patches:
        raise UsageError(f"{transport.host}: nothing to adopt (the served tree is the pin)")
    manifest = Path(series.manifest)
    before = manifest.read_bytes()
    fresh = _emptied(series) if series.patches else series
    written: list[Path] = []
    try:
        result = interop.import_patches(fresh, [_incoming(p) for p in adopt_plan.patches],
                                        interop.ImportMeta(tier=adopt_plan.patches[0].tier,
                                                           path=adopt_plan.patches[0].path,
                                                           author=author),
                                        progress=progress)
        written = [Path(series.root) / e.file for e in result.patches]
        from .manifest import load_series
        new = load_series(manifest)
        _check_reproduces(new, adopt_plan)
        done = _put_under_management(new, transport, adopt_plan)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        manifest.write_bytes(before)
        raise
    adopt_plan.written = done.applied
    adopt_plan.files_hashed = done.files_hashed
    return adopt_plan


def _emptied(series: Series) -> Series:
    """--force: the manifest with an empty series (its upstream pin kept)."""
    from .manifest import load_series
    text = Path(series.manifest).read_text(encoding="utf-8")
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if re.match(r"^series:", line))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^[A-Za-z]", lines[i])),
               len(lines))
    Path(series.manifest).write_text("\n".join(lines[:start] + ["series: []"] + lines[end:]),
                                     encoding="utf-8")
    return load_series(Path(series.manifest))


def _incoming(p: ProposedPatch) -> interop.Incoming:
    header = {"Description": p.summary, **({"Author": p.author} if p.author else {})}
    return interop.Incoming(source=f"{p.source} ({p.name})", name_hint=p.name,
                            header=header, raw_header=None, diff=p.diff,
                            gate=p.gate)


def _check_reproduces(series: Series, adopt_plan: AdoptPlan) -> None:
    """The series on the pin must give exactly the served files, or the state would lie."""
    final: dict[str, str | None] = {}
    for patch in series.patches:
        for change in patch.files:
            final[change.path] = change.post
    wrong = sorted(p for p, b in final.items() if adopt_plan.served.get(p) != b)
    if wrong:
        raise UsageError(f"{adopt_plan.host}: the proposed series does not reproduce the "
                         f"served {', '.join(wrong[:3])} (an upstream commit left out?); "
                         "nothing was changed")


def _put_under_management(series: Series, transport: Transport,
                          adopt_plan: AdoptPlan) -> wire.AdoptResult:
    from .transport import raise_for
    from .upstream import blob_reader, provision
    base_files = api.base_files(series)
    applied = []
    for patch in series.patches:
        spec = api.patch_spec(patch)
        spec.pop("file")
        applied.append(AppliedPatch.from_json(spec))
    state = TreeState(updated=now_stamp(), kind="git" if adopt_plan.layout == "git" else "plain",
                      layout=adopt_plan.layout,
                      upstream={"name": series.upstream.name, "version": series.upstream.version},
                      base={"commit": adopt_plan.base.commit, "files": base_files},
                      applied=applied, tool_version=__version__,
                      files={p: adopt_plan.served.get(p) for p in base_files})
    read = blob_reader(provision(series.upstream))
    with tempfile.TemporaryDirectory(prefix="patchset-adopt-") as tmp:
        files: dict[str, Path] = {}
        for blob in {b for b in base_files.values() if b}:
            path = Path(tmp) / blob
            path.write_bytes(_pristine(read, base_files, blob))
            files[f"base/{blob}"] = path
        for patch in series.patches:
            files[f"keep/{patch.sha256}.patch"] = Path(series.root) / patch.file
        req = wire.AdoptRequest(target=transport.target, state=state.to_json(),
                                expected=adopt_plan.served,
                                patches=[n for n in files if n.startswith("keep/")],
                                base_objects=[n for n in files if n.startswith("base/")],
                                git_prefix=series.upstream.git_prefix,
                                package=series.upstream.name)
        result = raise_for(transport.host, transport.call(req, files))
    assert isinstance(result, wire.AdoptResult)
    return result


def _pristine(read, base_files: dict[str, str | None], blob: str) -> bytes:
    path = next(p for p, b in base_files.items() if b == blob)
    data = read(path)
    if data is None:
        raise UsageError(f"the pin has no {path}")
    return data
