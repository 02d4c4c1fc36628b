"""`patchset adopt HOST`: from an unmanaged fork a server runs to a proposed series, and
with `write` to a managed host, without changing one byte the server imports.

Why: users arrive with a server running upstream plus local commits and hand edits, and no
record of which is which. This reads the served tree through the agent (ops `inventory`
and `adopt`, patchset/agent/adoption.py), finds the base with evidence (the merge-base
with the pin for a git checkout; else the release whose files match best: the pin and the
wheels in the local cache), and proposes one patch per local commit and one for the hand
edits (or one per edited file, `split`), each with a proposed gate (an env switch its diff
introduces), its trace targets and call-path guards (patchset/analysis/guards.py, as `show`
derives them). Writing goes through `import` (patchset/authoring/interop.py: every patch checked on
the pin) and is undone when the host refuses.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from patchset import __version__, api, validate
from patchset.authoring import interop
from patchset.series import patchfile
from patchset.agent.lib import gitblob
from patchset.agent.lib import wire
from patchset.agent.lib.records import AppliedPatch, TreeState, now_stamp
from patchset.errors import ManifestError, UsageError
from patchset.series.model import Series
from patchset.progress import NullProgress, Progress

if TYPE_CHECKING:
    from patchset.transport import Transport
    from patchset.pin.upstream import BaseTree

ENV_READ = re.compile(r"""(?:getenv\(|environ\.get\(|environ\[)\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
HAND_EDITS = "hand-edits"
READ_BATCH = 512                     # paths one inventory request asks the bytes of
# A DEP-3 Author: 'Name <email>', one line, never an option (no leading '-'), bounded.
AUTHOR = validate.Rule(r"[^\s<>\x00-\x1f\x7f-][^<>\x00-\x1f\x7f]{0,126} "
                       r"<[^\s<>\x00-\x1f\x7f]{1,126}>",
                       "'Name <email>' (one line, at most 256 characters, not starting "
                       "with '-')")


def check_author(author: str | None) -> None:
    """--author, before any host is read."""
    if author is not None and not AUTHOR.ok(author):
        shown = author[:40] + ("..." if len(author) > 40 else "")
        raise UsageError(f"--author {shown!r}: expected {AUTHOR.what}")


@dataclass(frozen=True)
class AdoptOptions:
    checkout: str | None = None      # on the host: the git checkout a site-packages came from
    split: bool = False              # hand edits: one patch per file
    tier: str = "risky"
    path: str = "both"
    offline: bool = False
    author: str | None = None        # DEP-3 Author of the hand edits (commits name theirs)

    def __post_init__(self) -> None:
        check_author(self.author)


@dataclass(frozen=True)
class BaseEvidence:
    """One candidate base and how well the served files match it."""

    label: str                       # sglang 0.5.14 (the pin), a cached wheel, a merge-base
    source: str                      # pin | wheel cache | merge-base
    commit: str | None
    compared: int                    # served package files compared
    matching: int | None             # ... identical to the candidate's (None: unknown)
    is_pin: bool                     # the candidate IS the pin (its commit or its files)


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


@dataclass(frozen=True)
class Blocker:
    """Something --write refuses, named: a served entry not compared (a link, a file not
    read), a file or patch that cannot be a patch, commits not listed, a base that is not
    the pin, served files the proposed series does not reproduce."""

    what: str                        # a served path, a patch name, "commits", "base"
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
    pin: dict[str, str] = field(repr=False, default_factory=dict)   # the pin's file map
    notes: list[str] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)   # empty: --write may proceed
    reproduced: int = 0              # served files the pin + the proposed series give exactly
    written: list[str] = field(default_factory=list)     # --write: the patch names
    files_hashed: int = 0                                # --write: served files compared

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("served")
        data.pop("pin")
        for p in data["patches"]:
            p.pop("diff")
        return data


# ---------------------------------------------------------------- the plan

def plan(series: Series, transport: Transport, options: AdoptOptions,
         progress: Progress | None = None) -> AdoptPlan:
    """Read the host and propose a series; nothing is written anywhere. Every served entry
    is accounted for: compared with the pin + the proposed series, or named in `blockers`
    (not compared, cannot be a patch), which --write refuses."""
    from patchset.pin.upstream import provision
    progress = progress or NullProgress()
    pin = series.upstream
    base = provision(pin, progress=progress, offline=options.offline)
    inv = _inventory(transport, series, options, base.commit, [])
    if inv.managed:
        raise UsageError(f"{transport.host}: {inv.target} is already managed by patchset; "
                         "adopt takes an unmanaged tree (see `patchset status`)")
    scope = f"{pin.git_prefix}{pin.name}/"
    pin_tree = _tree_at(base.repo, base.commit, scope)
    if pin_tree is None:
        raise UsageError(f"the pin commit {base.commit[:12]} cannot be listed in the cache "
                         f"({base.repo}): run the command again to fetch it; nothing was "
                         "changed")
    pin_files = {p: blob for p, (_, blob) in pin_tree.items()}
    blockers = [Blocker(_shown(p), f"{what}: not compared (adopt compares regular files "
                        "only)") for p, what in sorted(inv.special.items())]
    chosen, candidates = _choose_base(series, inv, pin_files, base)
    blockers += _base_blockers(inv, chosen, base, pin)
    commits, left_out = _local_commits(inv, base)
    from_head = inv.git is not None and inv.git.base is not None
    expected = {p: b for p, b in inv.git.head_files.items() if _served_path(p)} \
        if from_head and inv.git else pin_files
    edited = sorted(p for p in set(inv.files) | set(expected)
                    if inv.files.get(p) != expected.get(p) and p not in inv.special)
    read = _read_all(transport, series, options, base.commit,
                     [p for p in edited if _nameable(p)])
    patches = [_from_commit(c, options) for c in commits]
    hand, problems = _hand_edits(read, edited, inv, base, from_head, options)
    patches += hand
    blockers += problems
    patches = _unique(patches)
    for p in patches:
        problem = _patch_problem(p, pin.git_prefix)
        if problem:
            blockers.append(Blocker(p.name, problem))
    _derive(patches, base, series)
    refused = {b.what for b in blockers}
    wrong, reproduced = _reproduces(pin_files, [
        c for p in patches if p.name not in refused
        for c in patchfile.parse_diff(p.diff, p.name, 0, pin.git_prefix)], inv.files)
    blockers += [Blocker(_shown(p), "the pin + the proposed series do not give the served "
                         "file (an upstream commit left out, or a file that cannot be a "
                         "patch)") for p in wrong if _shown(p) not in refused]
    return AdoptPlan(transport.host, inv.target, inv.layout, chosen, candidates, patches,
                     left_out, served=inv.files, pin=pin_files,
                     notes=_notes(inv, chosen, pin_tree), blockers=blockers,
                     reproduced=reproduced)


def _served_path(path: str) -> bool:
    """What the agent's served_files reads: bytecode caches are not served files."""
    return "__pycache__" not in path.split("/") and not path.endswith((".pyc", ".pyo"))


def _nameable(path: str) -> bool:
    """A name a patch can carry (patchfile's rule), as UTF-8."""
    return patchfile.SAFE_PATH.fullmatch(path) is not None


def _shown(path: str) -> str:
    """A served name as one line of text: bytes that are not UTF-8 and control characters
    shown escaped, never a crash."""
    text = path.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _tree_at(repo: Path, commit: str, scope: str) -> dict[str, tuple[str, str]] | None:
    """git path -> (mode, blob id) of every served file under `scope` at `commit` in the
    cached upstream repository (ls-tree: ids, no bytes read); None: not there."""
    from patchset.agent.lib.gitenv import LOCAL, run_git
    proc = run_git(["--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", commit, "--",
                    scope], repo, mode=LOCAL)
    if proc.returncode != 0:
        return None
    out = {}
    for record in filter(None, proc.stdout.decode("utf-8", "surrogateescape").split("\0")):
        meta, path = record.split("\t", 1)
        mode, kind, oid = meta.split()
        if kind == "blob" and _served_path(path):
            out[path] = (mode, oid)
    return out


def _inventory(transport: Transport, series: Series, options: AdoptOptions, pin_commit: str,
               read: list[str]) -> wire.InventoryResult:
    from patchset.transport import raise_for
    req = wire.InventoryRequest(target=transport.target,
                                git_prefix=series.upstream.git_prefix,
                                package=series.upstream.name, checkout=options.checkout,
                                pin_commit=pin_commit, read=read)
    result = raise_for(transport.host, transport.call(req))
    assert isinstance(result, wire.InventoryResult)
    return result


@dataclass(frozen=True)
class _Read:
    """The bytes of the edited files, read in batches until all are read or refused."""

    served: dict[str, str | None]    # latin-1 text; None: no such file
    at_head: dict[str, str | None]
    not_read: dict[str, str]         # path -> why the agent refused to read it


def _read_all(transport: Transport, series: Series, options: AdoptOptions, pin_commit: str,
              paths: list[str]) -> _Read:
    served: dict[str, str | None] = {}
    at_head: dict[str, str | None] = {}
    not_read: dict[str, str] = {}
    todo = list(paths)
    while todo:
        batch, todo = todo[:READ_BATCH], todo[READ_BATCH:]
        got = _inventory(transport, series, options, pin_commit, batch)
        served.update(got.served)
        at_head.update(got.at_head)
        not_read.update(got.not_read)
        if got.deferred and len(got.deferred) == len(batch):
            raise UsageError(f"{transport.host}: the agent read none of {len(batch)} files "
                             "asked for; nothing was changed")
        todo = list(got.deferred) + todo
    for path in paths:
        if path not in served and path not in not_read:
            not_read[path] = "the agent did not return it"
    return _Read(served, at_head, not_read)


def _choose_base(series: Series, inv: wire.InventoryResult, pin_files: dict[str, str],
                 base: BaseTree) -> tuple[BaseEvidence, list[BaseEvidence]]:
    """The merge-base where a checkout says it; else the best-matching candidate. A
    candidate is the pin only when it is the pin commit or holds exactly its files; each
    is counted against its own files (unknown where those are not at hand)."""
    pin = series.upstream
    label = f"{pin.name} {pin.version} (the pin)"
    candidates = [_evidence(label, "pin", base.commit, inv.files, pin_files, True)]
    for wheel, files in _cached_wheels(pin):
        same = files == pin_files
        candidates.append(_evidence(wheel, "wheel cache", base.commit if same else None,
                                    inv.files, files, same))
    git = inv.git
    if git and git.base:
        is_pin = git.base == base.commit
        scope = f"{pin.git_prefix}{pin.name}/"
        tree: dict[str, str] | None = pin_files
        if not is_pin:
            found = _tree_at(base.repo, git.base, scope)
            tree = None if found is None else {p: b for p, (_, b) in found.items()}
        matching = None if tree is None else _evidence(
            "", "", None, inv.files, tree, is_pin).matching
        return BaseEvidence(f"merge-base {git.base[:12]} ({git.base_why})", "merge-base",
                            git.base, len(inv.files), matching, is_pin), candidates
    best = max(candidates, key=lambda c: (c.matching or 0, c.is_pin))
    return best, candidates


def _evidence(label: str, source: str, commit: str | None, served: dict[str, str],
              files: dict[str, str], is_pin: bool) -> BaseEvidence:
    matching = sum(1 for p, b in served.items() if files.get(p) == b)
    return BaseEvidence(label, source, commit, len(served), matching, is_pin)


def _cached_wheels(pin) -> list[tuple[str, dict[str, str]]]:
    """Every cached wheel of the package other than the pin's: git path -> blob id."""
    from patchset.pin.upstream import cache_root
    out = []
    mine = pin.pypi.file if pin.pypi else None
    for wheel in sorted((cache_root() / "wheels").glob(f"{pin.name}-*.whl")):
        if wheel.name == mine:
            continue
        try:
            with zipfile.ZipFile(wheel) as zf:
                out.append((wheel.name, {f"{pin.git_prefix}{i.filename}": gitblob.blob_id(
                    zf.read(i)) for i in zf.infolist() if i.filename.startswith(f"{pin.name}/")
                    and not i.is_dir() and _served_path(i.filename)}))
        except (OSError, zipfile.BadZipFile):
            continue
    return out


def _base_blockers(inv: wire.InventoryResult, chosen: BaseEvidence, base: BaseTree,
                   pin) -> list[Blocker]:
    out = []
    if not chosen.is_pin:
        out.append(Blocker("base", f"the base is {chosen.label}, not the pin "
                           f"{pin.name} {pin.version} ({base.commit[:12]})"))
    git = inv.git
    if git is not None and git.base is None and inv.layout == "git":
        out.append(Blocker("base", f"{git.base_why}: a managed git tree needs the pin commit "
                           "in its history (fetch it and rebase onto it)"))
    if git is not None and git.more_commits:
        out.append(Blocker("commits", f"{git.more_commits} more commit(s) after the base "
                           "change package files than one inventory lists "
                           f"({len(git.commits)} listed): not read"))
    return out


def _local_commits(inv: wire.InventoryResult,
                   base: BaseTree) -> tuple[list[wire.Commit], list[LeftOut]]:
    """The checkout's commits after the base that change a package file (the agent lists
    only those): local ones are proposed; upstream ones (known to the pin's cached
    repository) are left out."""
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
    from patchset.agent.lib.gitenv import LOCAL, run_git
    proc = run_git(["cat-file", "-e", f"{commit}^{{commit}}"], base.repo, mode=LOCAL)
    return proc.returncode == 0


def _from_commit(c: wire.Commit, options: AdoptOptions) -> ProposedPatch:
    return ProposedPatch(interop.slug(c.subject), f"commit {c.commit[:12]}", c.subject,
                         sorted(c.files), None, [], [], options.tier, options.path, c.diff,
                         c.author or None)


def _hand_edits(read: _Read, edited: list[str], inv: wire.InventoryResult, base: BaseTree,
                from_head: bool, options: AdoptOptions
                ) -> tuple[list[ProposedPatch], list[Blocker]]:
    """One diff per edited file (added, changed or deleted), or a Blocker naming why the
    file cannot be one: never a deletion for a file that was not read."""
    from patchset.pin.upstream import blob_reader
    pristine = blob_reader(base)
    diffs: dict[str, str] = {}
    blockers: list[Blocker] = []
    for path in edited:
        if not _nameable(path):
            blockers.append(Blocker(_shown(path), "its name has characters a patch cannot "
                                    "carry (allowed: letters, digits, _ . + @ - /)"))
            continue
        if path in read.not_read:
            blockers.append(Blocker(path, f"not read: {read.not_read[path]}"))
            continue
        new = _bytes(read.served.get(path))
        if (new is None) != (path not in inv.files) or (
                new is not None and gitblob.blob_id(new) != inv.files[path]):
            blockers.append(Blocker(path, "changed while it was read: run adopt again"))
            continue
        old = _bytes(read.at_head.get(path)) if from_head else pristine(path)
        if old is None and path in inv.executable:
            blockers.append(Blocker(path, "a new executable file: a patch creates files "
                                    "without the executable bit (cannot be a patch)"))
            continue
        try:
            diffs[path] = gitblob.file_diff(path, old, new, "100644")
        except gitblob.EngineError:
            blockers.append(Blocker(path, "binary or not UTF-8 text: cannot be a patch"))
    if not diffs:
        return [], blockers
    done = [p for p in edited if p in diffs]
    groups = [[p] for p in done] if options.split else [done]
    out = []
    for paths in groups:
        name = interop.slug(f"{HAND_EDITS}-{Path(paths[0]).stem}") if options.split \
            else HAND_EDITS
        out.append(ProposedPatch(name, "hand edit", f"hand edits in {', '.join(paths)}", paths,
                                 None, [], [], options.tier, options.path,
                                 "".join(diffs[p] for p in paths), options.author))
    return out, blockers


def _unique(patches: list[ProposedPatch]) -> list[ProposedPatch]:
    """One name per patch, as import will write them (a second "fix" is "fix-2"): the
    derived gates, trace targets and guards are keyed by name."""
    taken: set[str] = set()
    out = []
    for p in patches:
        name = interop.unique(interop.slug(p.name), taken)
        taken.add(name)
        out.append(dataclasses.replace(p, name=name))
    return out


def _patch_problem(p: ProposedPatch, git_prefix: str) -> str | None:
    """Why --write would refuse this patch (the project's patch validation), or None."""
    bad = [f for f in p.files if not _nameable(f)]
    if bad:
        return (f"{_shown(bad[0])}: its name has characters a patch cannot carry (allowed: "
                "letters, digits, _ . + @ - /)")
    if "\ufffd" in p.diff or not _utf8(p.diff):
        return "a file it changes is not UTF-8 text: cannot be a patch"
    try:
        patchfile.check_raw_diff(p.diff.split("\n"), 0, p.name)
        patchfile.parse_diff(p.diff, p.name, 0, git_prefix)
    except ManifestError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reproduces(pin_files: dict[str, str], changes: list, served: dict[str, str]
                ) -> tuple[list[str], int]:
    """The class of evidence --write rests on: the pin's WHOLE file map with each patch's
    post-images laid over it (added, changed, deleted) against the WHOLE served map. The
    paths that differ, and how many served files it gives exactly."""
    final: dict[str, str | None] = dict(pin_files)
    for change in changes:                    # model.FileChange, in series order
        final[change.path] = change.post
    paths = set(served) | {p for p, b in final.items() if b is not None}
    wrong = sorted(p for p in paths if served.get(p) != final.get(p))
    return wrong, len(served) - len([p for p in wrong if p in served])


def _bytes(text: str | None) -> bytes | None:
    return text.encode("latin-1") if text is not None else None


def _derive(patches: list[ProposedPatch], base: BaseTree, series: Series) -> None:
    """Gates, trace targets and call-path guards, as `show` derives them, in order."""
    from patchset.analysis import guards
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


def _notes(inv: wire.InventoryResult, chosen: BaseEvidence,
           pin_tree: dict[str, tuple[str, str]]) -> list[str]:
    notes = []
    if not chosen.is_pin:
        notes.append(f"the best base is {chosen.label}, not the pin: run `patchset init` for "
                     "it, or `patchset rebase --onto` it (or rebase the checkout onto the "
                     "pin), before adopting")
    if inv.git and inv.git.base is None:
        notes.append(f"local commits not read: {inv.git.base_why}")
    if inv.git and inv.git.dirty:
        notes.append(f"uncommitted in {inv.git.root}: {', '.join(inv.git.dirty[:5])}")
    executable = set(inv.executable)
    modes = sorted(p for p, (mode, _) in pin_tree.items() if p in inv.files
                   and (mode == "100755") != (p in executable))
    if modes:
        notes.append(f"executable bit differs from the pin's (not compared: patches carry "
                     f"content, and a mode is kept as it is): {', '.join(modes[:5])}"
                     + (f" and {len(modes) - 5} more" if len(modes) > 5 else ""))
    return notes


# ---------------------------------------------------------------- writing

def write(series: Series, transport: Transport, adopt_plan: AdoptPlan, force: bool = False,
          author: str | None = None, progress: Progress | None = None) -> AdoptPlan:
    """patches.yaml + patches/ from the plan, built and checked on the pin (and the whole
    served file map reproduced) before anything is written; then the host's state. A host
    that refuses puts every local file back as it was; a kill after the local write leaves
    a series that the next `adopt --write` finds already written and resumes from."""
    check_author(author)
    if adopt_plan.blockers:
        first = adopt_plan.blockers[0]
        more = len(adopt_plan.blockers) - 1
        raise UsageError(f"{transport.host}: --write refused: {first.what}: {first.why}"
                         + (f" (and {more} more: see the dry run)" if more else "")
                         + "; nothing was changed")
    if not adopt_plan.patches:
        raise UsageError(f"{transport.host}: nothing to adopt (the served tree is the pin)")
    fresh = dataclasses.replace(series, patches=())
    meta = interop.ImportMeta(tier=adopt_plan.patches[0].tier, path=adopt_plan.patches[0].path,
                              author=author)
    taken = UsageError(f"{series.manifest}: already holds a series ({len(series.patches)} "
                       "patches); adopt writes a new one: pass --force to replace it")
    try:
        built = interop.build_patches(fresh, [_incoming(p) for p in adopt_plan.patches],
                                      meta, progress=progress)
    except (ManifestError, UsageError):
        if series.patches and not force:
            raise taken from None
        raise
    resumed = interop.holds(series, built)        # a write killed before the host took it
    if series.patches and not force and not resumed:
        raise taken
    changes = [c for b in built for c in interop.parse_built(
        b.text, interop.Incoming(b.entry.source, b.entry.name, {}, None, ""),
        series.upstream.git_prefix).files]
    _check_reproduces(changes, adopt_plan)
    root = Path(series.root)
    kept = _snapshot(root, [Path(series.manifest), *(root / b.entry.file for b in built)])
    try:
        if not resumed:
            interop.write_entries(series, built, replace=True)
        from patchset.series.manifest import load_series
        new = load_series(Path(series.manifest))
        _check_reproduces([c for patch in new.patches for c in patch.files], adopt_plan)
        done = _put_under_management(new, transport, adopt_plan)
    except BaseException as exc:
        problem = _restore(root, kept)
        if problem and isinstance(exc, UsageError):
            raise UsageError(f"{exc}; and putting the series back failed: {problem}") from exc
        raise
    _drop_replaced(root, series, new)
    adopt_plan.written = done.applied
    adopt_plan.files_hashed = done.files_hashed
    return adopt_plan


def _snapshot(root: Path, paths: list[Path]) -> dict[Path, bytes | None]:
    """The bytes of every local file the write may replace or create (None: absent)."""
    return {p: (p.read_bytes() if p.is_file() else None) for p in paths}


def _restore(root: Path, kept: dict[Path, bytes | None]) -> str:
    """Each file as it was; a failure is returned, not raised (the first error stays)."""
    from patchset.agent.lib import safewrite
    problems = []
    for path, data in kept.items():
        try:
            if data is None:
                if path.is_file() and not path.is_symlink():
                    safewrite.remove_file(path, root)
            elif not path.is_file() or path.read_bytes() != data:
                safewrite.write_file(path, data, root=root)
        except OSError as exc:
            problems.append(f"{path}: {exc}")
    return "; ".join(problems)


def _drop_replaced(root: Path, old: Series, new: Series) -> None:
    """--force: the old series' patch files the new series does not name (after the host
    took the new one; left behind by a kill, they are named by no manifest)."""
    from patchset.agent.lib import safewrite
    keep = {p.file for p in new.patches}
    for patch in old.patches:
        if patch.file not in keep:
            try:
                safewrite.remove_file(root / patch.file, root)
            except OSError:
                pass


def _incoming(p: ProposedPatch) -> interop.Incoming:
    header = {"Description": p.summary, **({"Author": p.author} if p.author else {})}
    return interop.Incoming(source=f"{p.source} ({p.name})", name_hint=p.name,
                            header=header, raw_header=None, diff=p.diff,
                            gate=p.gate)


def _check_reproduces(changes: list, adopt_plan: AdoptPlan) -> None:
    """The pin's whole file map + the series' post-images must be the WHOLE served file
    map (added, changed, deleted files, all of them), or the state would lie."""
    wrong, _ = _reproduces(adopt_plan.pin, changes, adopt_plan.served)
    if wrong:
        raise UsageError(f"{adopt_plan.host}: the proposed series does not reproduce the "
                         f"served {', '.join(_shown(p) for p in wrong[:3])} (an upstream "
                         "commit left out?); nothing was changed")


def _put_under_management(series: Series, transport: Transport,
                          adopt_plan: AdoptPlan) -> wire.AdoptResult:
    from patchset.transport import raise_for
    from patchset.pin.upstream import blob_reader, provision
    base_files = api.base_files(series)
    applied = []
    for patch in series.patches:
        applied.append(AppliedPatch.from_spec(api.patch_spec(patch)))
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
