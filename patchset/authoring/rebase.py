"""`patchset rebase --onto REF`: move the series to another upstream release.

Every patch, in series order, is replayed on the new release with the already-rebased
earlier patches applied, and gets one outcome:

  clean     its recorded pre-images are the new tree's files: the file is kept byte for byte;
  3way      a per-file 3-way merge (ancestor: the file before the patch on the old pin with
            the earlier patches; ours: the new tree; theirs: the patch's post-image on the old
            pin) merged without conflict: the patch is re-diffed with full index lines;
  upstream  the new release already has the change (every file's merge leaves the new tree
            as it is): dropped from `series:` and recorded under `upstreamed:`;
  conflict  a merge conflicted: the hunks are reported;
  blocked   only after a conflict: a file it changes was left unresolved by that conflict,
            so it cannot be tried.

Any conflict means nothing is written (exit 1). Otherwise the new manifest and patch files
are validated in a copy (the strict loader, then every selection applied by the real engine
on the new base, as `patchset check` does) before any file is replaced. git runs with
interop's hermetic environment and merges are pure functions of the blobs, so the same
inputs always give the same bytes, and a second rebase onto the same release is all clean.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

import yaml

from patchset import api
from patchset.analysis import guards
from patchset.authoring import interop
from patchset.pin import pinrules
from patchset.agent.lib import safewrite
from patchset.agent.lib.gitenv import LOCAL, run_git
from patchset.errors import Exit, PatchsetError, UsageError
from patchset.series.manifest import load_series
from patchset.series.model import Patch, Series
from patchset.pin.model import UpstreamPin
from patchset.progress import NullProgress, Progress
from patchset.pin.upstream import (RAW_ATTRIBUTES, BaseTree, MissingRef, blob_reader,
                                   cache_root, pin_for_commit, pin_for_version, provision)

OUTCOMES = ("clean", "3way", "upstream", "conflict", "blocked")
RELEASE = re.compile(r"v?([0-9]+(?:\.[0-9]+)+(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?"
                     r"(?:\.dev[0-9]+)?)")                 # fullmatch
UPSTREAMED_COMMENT = "# patches upstream took (patchset rebase); no longer carried"


# ---------------------------------------------------------------- data between stages

@dataclass(frozen=True)
class Hunk:
    """One conflict of a 3-way merge, as `git merge-file` writes it."""

    path: str
    lines: tuple[int, int]          # first, last line of the block in the merge result
    upstream: tuple[int, int]       # start, count of the new release's lines it covers
    text: str                       # the block, conflict markers included


@dataclass(frozen=True)
class PatchOutcome:
    name: str
    outcome: str                    # one of OUTCOMES
    files: tuple[str, ...]
    notes: tuple[str, ...] = ()
    hunks: tuple[Hunk, ...] = ()


@dataclass(frozen=True)
class RebaseResult:
    manifest: str
    old: str                        # "sglang 0.5.14"
    new: str
    upstream: dict                  # the new pin, as written to patches.yaml
    dry_run: bool
    ok: bool                        # no conflict: the series moved (or would move)
    changed: bool                   # some file was (or would be) written or removed
    patches: tuple[PatchOutcome, ...]
    written: tuple[str, ...] = ()   # relative to the manifest's directory
    removed: tuple[str, ...] = ()
    guards: tuple[guards.GuardChange, ...] = ()   # per carried patch, on the new release

    @property
    def exit_code(self) -> int:
        return Exit.OK if self.ok else Exit.FINDINGS


@dataclass(frozen=True)
class _Merged:
    """One file of one patch on the new release."""

    path: str
    outcome: str                    # clean | 3way | upstream | conflict
    result: bytes | None = None     # the file after the patch (clean, 3way)
    mode: str = "100644"
    note: str = ""
    hunks: tuple[Hunk, ...] = ()


@dataclass(frozen=True)
class _Moved:
    patch: Patch
    outcome: PatchOutcome
    text: str | None                # the patch file to carry; None when not carried


@dataclass(frozen=True)
class _Plan:
    """Everything rebase would write, relative to the series directory."""

    writes: dict[str, bytes] = field(default_factory=dict)
    removes: tuple[str, ...] = ()
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)   # per patch name


# ---------------------------------------------------------------- entry point

def parse_ref(ref: str) -> str | None:
    """REF as a release version (`0.5.15` or the tag `v0.5.15`); None for any other ref,
    which names an upstream commit (a commit id, a branch or another tag)."""
    match = RELEASE.fullmatch(ref)
    if match:
        return match.group(1)
    problem = pinrules.git_ref_problem(ref)
    if problem:
        raise UsageError(f"--onto {ref!r}: expected a release like 0.5.15, or an upstream "
                         f"commit, branch or tag ({problem})")
    return None


def new_pin_for(pin: UpstreamPin, ref: str, cache: Path, progress: Progress,
                offline: bool) -> UpstreamPin:
    """Where `--onto REF` moves the pin: a release (its wheel learnt, the git ref moved
    alike) or an upstream commit of the pin's git url (no wheel: a commit has none)."""
    version = parse_ref(ref)
    if version is not None:
        return pin_for_version(pin, version, cache, progress, offline)
    if pin.git is None:
        raise UsageError(f"--onto {ref!r}: moving to a commit needs upstream.git in the "
                         "manifest (the repository to take it from)")
    try:
        return pin_for_commit(pin.git.url, ref, pin.git_prefix, cache, progress, offline)
    except MissingRef as e:
        raise UsageError(f"--onto {ref!r}: {e.why}") from e


def rebase(series: Series, ref: str, dry_run: bool = False, progress: Progress | None = None,
           offline: bool = False, cache: Path | None = None) -> RebaseResult:
    """Move `series` onto release REF: classify every patch, and unless a patch conflicts
    or `dry_run`, write the validated result (all files, or none)."""
    progress = progress or NullProgress()
    cache = Path(cache) if cache is not None else cache_root()
    new_pin = new_pin_for(series.upstream, ref, cache, progress, offline)
    old_base = provision(series.upstream, cache, progress, offline)
    new_base = provision(new_pin, cache, progress, offline)
    moved = move_series(series, old_base, new_base, new_pin, progress)
    ok = not any(m.outcome.outcome in ("conflict", "blocked") for m in moved)
    with progress.task(f"derive the call-path guards on {_label(new_pin)}", None):
        changes = _guard_changes(series, old_base, new_base, new_pin, moved, cache)
    plan = _plan(series, new_pin, moved) if ok else _Plan()
    if ok and (plan.writes or plan.removes):
        with progress.task(f"validate the series on {new_pin.name} {new_pin.version}", None):
            _validate(series, plan, new_base)
        if not dry_run:
            _write(Path(series.root), plan)
    outcomes = tuple(dataclasses.replace(m.outcome, notes=m.outcome.notes
                                         + plan.notes.get(m.patch.name, ())) for m in moved)
    return RebaseResult(
        manifest=series.manifest, old=_label(series.upstream), new=_label(new_pin),
        upstream=dataclasses.asdict(new_pin), dry_run=dry_run, ok=ok,
        changed=bool(plan.writes or plan.removes), patches=outcomes,
        written=tuple(sorted(plan.writes)), removed=plan.removes, guards=changes)


def _guard_changes(series: Series, old_base: BaseTree, new_base: BaseTree,
                   new_pin: UpstreamPin, moved: list[_Moved], cache: Path
                   ) -> tuple[guards.GuardChange, ...]:
    """Each carried patch's call-path guards, re-derived on the new release (the carried
    patches replayed there in order, as written), against the old pin's: which appeared,
    vanished or moved. A guard that moved is a condition the `requires` may cite by line."""
    carried = [(m.patch, m.text) for m in moved if m.text is not None]
    if not carried:
        return ()
    old = guards.stored(series, old_base, cache) or {}
    new = guards.derive_texts(guards.load_tree(new_base, new_pin),
                              [(patch.name, text, patch.trace) for patch, text in carried],
                              new_pin.git_prefix)
    return tuple(guards.compare(old[patch.name], new[patch.name]) for patch, _ in carried
                 if patch.name in old and patch.name in new)


def _label(pin: UpstreamPin) -> str:
    return f"{pin.name} {pin.version}"


# ---------------------------------------------------------------- replaying the series

class _Tree:
    """A scratch clone whose HEAD is the state after the patches replayed so far.

    Only the files the series touches are checked out (sparse, objects shared with the
    cache repo): a full checkout of the release costs more than the whole rebase."""

    def __init__(self, base: BaseTree, dest: Path, paths: list[str]) -> None:
        self.path = dest
        interop.git_bytes(dest.parent, "clone", "-q", "--no-checkout", "--shared", "--",
                           str(base.repo), str(dest), what=str(base.repo))
        # Blobs are the files' exact bytes, whatever .gitattributes the release ships.
        (dest / ".git" / "info").mkdir(parents=True, exist_ok=True)
        (dest / ".git" / "info" / "attributes").write_text(RAW_ATTRIBUTES)
        self.git("sparse-checkout", "set", "--no-cone", *(f"/{path}" for path in paths))
        self.git("checkout", "-q", "-B", "patchset-rebase", base.commit)

    def git(self, *args: str, stdin: bytes | None = None) -> bytes:
        return interop.git_bytes(self.path, *args, what="rebase scratch tree", stdin=stdin)

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").decode().strip()

    def entry(self, path: str, commit: str = "HEAD") -> tuple[str, str] | None:
        """(mode, blob id) of `path` at `commit`, or None where it does not exist."""
        out = self.git("ls-tree", "--full-tree", commit, "--", path).decode()
        if not out:
            return None
        mode, _kind, rest = out.split(" ", 2)
        return mode, rest.split("\t", 1)[0]

    @overload
    def blob(self, oid: str) -> bytes: ...
    @overload
    def blob(self, oid: None) -> None: ...

    def blob(self, oid: str | None) -> bytes | None:
        return None if oid is None else self.git("cat-file", "blob", oid)

    def commit(self, name: str, files: list[_Merged]) -> None:
        """Write the merged files into the tree and commit them as patch `name`."""
        for merged in files:
            disk = self.path / merged.path
            if merged.result is None:
                self.git("rm", "-q", "--", merged.path)
                continue
            disk.parent.mkdir(parents=True, exist_ok=True)
            disk.write_bytes(merged.result)
            disk.chmod(0o755 if merged.mode == "100755" else 0o644)
            self.git("add", "--", merged.path)
        self.git("commit", "-q", "--allow-empty", "-m", name)


def move_series(series: Series, old_base: BaseTree, new_base: BaseTree, new_pin: UpstreamPin,
                 progress: Progress) -> list[_Moved]:
    """Replay every patch on the old pin (for its exact blobs) and onto the new release."""
    with tempfile.TemporaryDirectory(prefix="patchset-rebase-") as tmp:
        paths = sorted({change.path for patch in series.patches for change in patch.files})
        old = _Tree(old_base, Path(tmp) / "old", paths)
        new = _Tree(new_base, Path(tmp) / "new", paths)
        labels = (_label(new_pin), f"{_label(series.upstream)} + series")
        blocked: dict[str, str] = {}          # path -> the conflicting patch that left it
        moved = []
        for patch in series.patches:
            with progress.task(f"rebase {patch.name}", None):
                moved.append(_move(series, patch, old, new, blocked, labels + (patch.name,),
                                   Path(tmp)))
        return moved


def _move(series: Series, patch: Patch, old: _Tree, new: _Tree, blocked: dict[str, str],
          labels: tuple[str, str, str], scratch: Path) -> _Moved:
    source = str(Path(series.root) / patch.file)
    text = Path(source).read_text(encoding="utf-8")
    interop.apply_diff(old.path, text, 1, source, patch.name)   # its post blobs exist now
    paths = tuple(c.path for c in patch.files)
    stuck = sorted({blocked[p] for p in paths if p in blocked})
    if stuck:
        blocked.update(dict.fromkeys(paths, patch.name))
        return _Moved(patch, PatchOutcome(patch.name, "blocked", paths, (
            f"not tried: {', '.join(stuck)} left a file it changes unresolved",)), None)
    merges = [_merge_change(change, old, new, labels, scratch) for change in patch.files]
    kinds = {m.outcome for m in merges}
    mixed = len(kinds) > 1                    # then every file says what happened to it
    notes = tuple(m.note or f"{m.path}: {m.outcome}" for m in merges if m.note or mixed)
    if kinds == {"clean"}:
        interop.apply_diff(new.path, text, 1, source, patch.name)
        return _Moved(patch, PatchOutcome(patch.name, "clean", paths), text)
    if "conflict" in kinds:
        blocked.update(dict.fromkeys(paths, patch.name))
        hunks = tuple(h for m in merges for h in m.hunks)
        return _Moved(patch, PatchOutcome(patch.name, "conflict", paths, notes, hunks), None)
    if kinds == {"upstream"}:
        return _Moved(patch, PatchOutcome(patch.name, "upstream", paths, notes), None)
    before = new.head()
    new.commit(patch.name, [m for m in merges if m.outcome != "upstream"])
    body = interop.git_out(new.path, *interop.DIFF_ARGS, before, "HEAD", what=source)
    first = re.search(r"^diff --git ", text, re.MULTILINE)
    assert first is not None                # git apply took it: it changes files
    header = text[:first.start()]
    return _Moved(patch, PatchOutcome(patch.name, "3way", paths, notes), header + body)


def _merge_change(change, old: _Tree, new: _Tree, labels: tuple[str, str, str],
                  scratch: Path) -> _Merged:
    """One file: the patch's pre/post blobs (old pin) against the new tree's file."""
    path = change.path
    ours_entry = new.entry(path)
    ours = ours_entry[1] if ours_entry else None
    theirs_entry = old.entry(path)
    mode = ours_entry[0] if ours_entry else theirs_entry[0] if theirs_entry else "100644"
    if ours == change.pre:
        return _Merged(path, "clean", old.blob(change.post), mode)
    if ours == change.post:
        return _Merged(path, "upstream", note=f"{path}: already in {labels[0]}")
    if ours is None:
        return _Merged(path, "conflict", note=f"{path}: not in {labels[0]} (removed or moved)")
    if change.post is None:
        return _Merged(path, "conflict", note=f"{path}: the patch deletes it and "
                       f"{labels[0]} changed it")
    mine = new.blob(ours)
    merged, conflicts = _merge_file(mine, old.blob(change.pre) or b"", old.blob(change.post),
                                    labels, scratch)
    if conflicts:
        hunks = _hunks(path, mine, merged, labels)
        return _Merged(path, "conflict", note=f"{path}: {len(hunks)} conflicting hunk(s)",
                       hunks=hunks)
    if merged == mine:
        return _Merged(path, "upstream", note=f"{path}: the merge changes nothing in "
                       f"{labels[0]}")
    return _Merged(path, "3way", merged, mode)


def _merge_file(ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str],
                scratch: Path) -> tuple[bytes, int]:
    """`git merge-file -p` (default conflict style, no user config): (result, conflicts)."""
    names = []
    for kind, data in zip(("ours", "base", "theirs"), (ours, base, theirs)):
        (scratch / f"merge.{kind}").write_bytes(data)
        names.append(str(scratch / f"merge.{kind}"))
    args = [arg for label in labels for arg in ("-L", label)]
    proc = run_git(["merge-file", "-p", *args, *names], scratch, mode=LOCAL,
                   extra=interop.IDENTITY)
    if not 0 <= proc.returncode < 128:
        reason = proc.stderr.decode(errors="replace").strip() or f"exit {proc.returncode}"
        raise UsageError(f"git merge-file failed: {reason.splitlines()[0]}")
    return proc.stdout, proc.returncode


def _hunks(path: str, ours: bytes, merged: bytes, labels: tuple[str, str, str]
           ) -> tuple[Hunk, ...]:
    """The conflict blocks of a merge result, each with where it sits in the new file."""
    start, middle, stop = f"<<<<<<< {labels[0]}", "=======", f">>>>>>> {labels[2]}"
    lines = merged.decode("utf-8", "replace").split("\n")
    mine = ours.decode("utf-8", "replace").split("\n")
    where: dict[int, int] = {}                # merged line -> the new file's line (0-based)
    matcher = difflib.SequenceMatcher(None, mine, lines, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        where.update((b + k, a + k) for k in range(size))
    out, i = [], 0
    while i < len(lines):
        if lines[i] != start:
            i += 1
            continue
        sep = lines.index(middle, i + 1)
        end = lines.index(stop, sep + 1)
        side = [where[j] for j in range(i + 1, sep) if j in where]
        if side:
            upstream = (side[0] + 1, side[-1] - side[0] + 1)
        else:                                 # ours has nothing there: the line it follows
            upstream = (next((where[j] for j in range(end + 1, len(lines)) if j in where),
                             len(mine)), 0)
        out.append(Hunk(path, (i + 1, end + 1), upstream, "\n".join(lines[i:end + 1]) + "\n"))
        i = end + 1
    return tuple(out)


# ---------------------------------------------------------------- what to write

def _plan(series: Series, new_pin: UpstreamPin, moved: list[_Moved]) -> _Plan:
    """The new manifest text and patch files (only those whose bytes change)."""
    root = Path(series.root)
    dropped = {m.patch.name: m.patch for m in moved if m.outcome.outcome == "upstream"}
    manifest = Path(series.manifest)
    old_text = manifest.read_text(encoding="utf-8")
    new_text, notes = _edit_manifest(old_text, new_pin, dropped)
    carried = {m.patch.file: m.text.encode("utf-8") for m in moved if m.text is not None}
    writes = {rel: data for rel, data in carried.items() if data != (root / rel).read_bytes()}
    if new_text != old_text:
        writes[manifest.name] = new_text.encode("utf-8")
    removes = tuple(sorted(p.file for p in dropped.values() if (root / p.file).exists()))
    return _Plan(writes=writes, removes=removes, notes=notes)


def _validate(series: Series, plan: _Plan, new_base: BaseTree) -> None:
    """Load the new series strictly and apply every selection on the new base with the
    real engine (what `patchset check` does), in a copy: the files are replaced only if
    this passes."""
    root = Path(series.root)
    with tempfile.TemporaryDirectory(prefix="patchset-rebase-check-") as tmp:
        check = Path(tmp)
        (check / "patches").mkdir()
        for patch in series.patches:
            shutil.copyfile(root / patch.file, check / patch.file)
        shutil.copyfile(series.manifest, check / Path(series.manifest).name)
        for rel in plan.removes:
            (check / rel).unlink()
        for rel, data in plan.writes.items():
            (check / rel).write_bytes(data)
        rebased = load_series(check / Path(series.manifest).name)
        report = api.check(rebased, blob_reader(new_base), new_base.commit)
    bad = [f"{p.path}: recorded pre-image {p.recorded}, the base has {p.found}"
           for p in report.preimages if not p.ok]
    bad += [f"{','.join(s.names)}: {s.error}" for s in report.selections if not s.ok]
    if bad:
        raise PatchsetError(f"rebase: the rebased series does not check on "
                            f"{_label(rebased.upstream)} ({bad[0]}); nothing was written")


def _write(root: Path, plan: _Plan) -> None:
    """Stage every file beside its target, then rename them in (the manifest last), then
    remove the dropped patch files: a failure while staging changes nothing. Staged and
    put in by safewrite: never through a link planted in the series."""
    order = sorted(plan.writes, key=lambda rel: (not rel.startswith("patches/"), rel))
    staged: list[safewrite.Staged] = []
    try:
        for rel in order:
            staged.append(safewrite.stage(root / rel, plan.writes[rel], root))
    except OSError as exc:
        for item in staged:
            safewrite.discard(item)
        where = f" {exc.filename}" if exc.filename else ""
        raise PatchsetError(f"rebase: cannot write{where}: {exc.strerror or exc}; nothing "
                            "was changed") from None
    for item in staged:
        safewrite.commit(item)
    for rel in plan.removes:
        (root / rel).unlink(missing_ok=True)


# ---------------------------------------------------------------- patches.yaml text edits
#
# The manifest is edited as text at the positions PyYAML's composer reports, so comments,
# key order, quoting and layout of everything else stay exactly as they were.

Edit = tuple[int, int, str]          # replace text[start:end] with the string


def _edit_manifest(text: str, pin: UpstreamPin, dropped: dict[str, Patch]
                   ) -> tuple[str, dict[str, tuple[str, ...]]]:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    assert root is not None                 # the series was loaded from it: not empty
    edits = _pin_edits(root, pin)
    series_edits, notes = _series_edits(text, root, set(dropped))
    text = _splice(text, edits + series_edits)
    if dropped:
        records = [{"name": p.name, "summary": p.summary, "upstream_status": "accepted",
                    "since": pin.version} for p in dropped.values()]
        text = _add_upstreamed(text, records)
    return text, notes


def _child(node: yaml.Node | None, key: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        return next((v for k, v in node.value if k.value == key), None)
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int):
        return node.value[key] if key < len(node.value) else None
    return None


def _key(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((k for k, _ in node.value if k.value == key), None)


def _pin_edits(root: yaml.Node, pin: UpstreamPin) -> list[Edit]:
    upstream = _child(root, "upstream")
    wanted: list[tuple[tuple[str, ...], str]] = [(("version",), pin.version)]
    drop = _drop_key(upstream, "pypi") if pin.pypi is None else []
    if pin.git:
        wanted.append((("git", "ref"), pin.git.ref))
    if pin.pypi:
        wanted += [(("pypi", key), getattr(pin.pypi, key))
                   for key in ("requirement", "file", "sha256")]
    edits = []
    for path, value in wanted:
        node = upstream
        for key in path:
            node = _child(node, key)
        if isinstance(node, yaml.ScalarNode) and node.value != value:
            edits.append((node.start_mark.index, node.end_mark.index, _scalar(value, node.style)))
    return edits + drop


def _drop_key(mapping: yaml.Node | None, key: str) -> list[Edit]:
    """Remove `key:` and its block from a block mapping, whole lines (a pin moved to a
    commit has no wheel: its `pypi:` goes)."""
    if not isinstance(mapping, yaml.MappingNode):
        return []
    for k, v in mapping.value:
        if k.value == key:
            start = k.start_mark.index - k.start_mark.column
            end = v.end_mark.index - v.end_mark.column if v.end_mark.column else v.end_mark.index
            return [(start, end, "")]
    return []


def _scalar(value: str, style: str | None) -> str:
    """`value` as a YAML scalar in the style the old one had (plain where that reads back
    as the same string)."""
    if style == "'":
        return "'" + value.replace("'", "''") + "'"
    if style is None and yaml.safe_load(value) == value and ": " not in value:
        return value
    return json.dumps(value)


def _series_edits(text: str, root: yaml.Node, dropped: set[str]
                  ) -> tuple[list[Edit], dict[str, tuple[str, ...]]]:
    """Drop the upstreamed entries, and every reference the others make to them."""
    series = _child(root, "series")
    if not dropped or not isinstance(series, yaml.SequenceNode):
        return [], {}
    gone = [i for i, entry in enumerate(series.value)
            if getattr(_child(entry, "name"), "value", None) in dropped]
    edits = _drop_items(text, _key(root, "series"), series, gone)
    notes: dict[str, tuple[str, ...]] = {}
    for i, entry in enumerate(series.value):
        if i in gone:
            continue
        mine: list[str] = []
        for key in ("depends", "conflicts", "requires"):
            seq = _child(entry, key)
            if not isinstance(seq, yaml.SequenceNode):
                continue
            refs = [(j, _reference(key, item)) for j, item in enumerate(seq.value)]
            hits = [(j, ref) for j, ref in refs if ref in dropped]
            edits += _drop_items(text, _key(entry, key), seq, [j for j, _ in hits])
            mine += [f"{key}: dropped {ref} (upstream)" for _, ref in hits]
        if mine:
            name = _child(entry, "name")
            assert name is not None         # a loaded series names every entry
            notes[name.value] = tuple(mine)
    return edits, notes


def _reference(key: str, item: yaml.Node) -> str | None:
    """The patch an item of depends/conflicts/requires names (requires: `patch.NAME`)."""
    if key != "requires":
        return getattr(item, "value", None)
    fact = getattr(_child(item, "fact"), "value", "")
    return fact.partition(".")[2] if isinstance(fact, str) and fact.startswith("patch.") else None


def _drop_items(text: str, key: yaml.Node | None, seq: yaml.SequenceNode,
                drop: list[int]) -> list[Edit]:
    """Edits removing items `drop` of a sequence: in place for a flow list, whole lines for
    a block list (`key: []` when none is left)."""
    if not drop:
        return []
    keep = [item for j, item in enumerate(seq.value) if j not in drop]
    if seq.flow_style:
        kept = ", ".join(text[item.start_mark.index:item.end_mark.index] for item in keep)
        return [(seq.start_mark.index, seq.end_mark.index, f"[{kept}]")]
    spans = [_item_span(text, seq, j) for j in range(len(seq.value))]
    if not keep:
        assert key is not None              # the key `seq` was found under
        return [(key.end_mark.index, spans[-1][1], ": []\n")]
    return [spans[j] + ("",) for j in drop]


def _item_span(text: str, seq: yaml.SequenceNode, j: int) -> tuple[int, int]:
    """[start, end) of block list item j: its lines up to the next item, or for the last
    item up to its last line that is not a blank or a comment (those belong to what
    follows)."""
    starts = _line_starts(text)
    item = seq.value[j]
    start = starts[item.start_mark.line]
    if j + 1 < len(seq.value):
        return start, starts[seq.value[j + 1].start_mark.line]
    end_mark = item.end_mark
    lines = text.split("\n")
    # A block mapping ends where the next token starts: after the indent of a later line.
    indent_only = end_mark.line >= len(lines) or not lines[end_mark.line][:end_mark.column].strip()
    last = end_mark.line - 1 if indent_only else end_mark.line
    while last > item.start_mark.line and (not lines[last].strip()
                                           or lines[last].lstrip().startswith("#")):
        last -= 1
    return start, starts[last + 1] if last + 1 < len(starts) else len(text)


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for match in re.finditer("\n", text):
        starts.append(match.end())
    return starts


def _splice(text: str, edits: list[Edit]) -> str:
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _add_upstreamed(text: str, records: list[dict]) -> str:
    """Append records to the top-level `upstreamed:` list (created at the end if absent),
    in the list's own style."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    key, node = _key(root, "upstreamed"), _child(root, "upstreamed")
    lines = yaml.safe_dump(records, default_flow_style=None, sort_keys=False,
                           width=1000).splitlines()
    if key is None:
        text = text if text.endswith("\n") else text + "\n"
        return text + f"upstreamed:  {UPSTREAMED_COMMENT}\n" + "".join(f"  {l}\n" for l in lines)
    if isinstance(node, yaml.SequenceNode) and node.flow_style:
        items = [text[i.start_mark.index:i.end_mark.index] for i in node.value]
        items += [line[2:] for line in lines]
        return _splice(text, [(node.start_mark.index, node.end_mark.index,
                               f"[{', '.join(items)}]")])
    if isinstance(node, yaml.SequenceNode) and node.value:
        end = _item_span(text, node, len(node.value) - 1)[1]
        dash = " " * (node.value[0].start_mark.column - 2)
        head = text[:end] if text[:end].endswith("\n") else text[:end] + "\n"
        return head + "".join(dash + line + "\n" for line in lines) + text[end:]
    starts = _line_starts(text)                 # `upstreamed:` with no value yet
    end = starts[key.start_mark.line + 1] if key.start_mark.line + 1 < len(starts) else len(text)
    head = text[:end] if text[:end].endswith("\n") else text[:end] + "\n"
    return head + "".join(f"  {line}\n" for line in lines) + text[end:]
