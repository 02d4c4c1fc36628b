"""`patchset rebase --check START..END`: what each upstream commit would do to the series.

Why: users who follow upstream main need to know, before they move, which patches an
upstream change breaks (conflict), makes redundant (taken upstream) or may silently make
inert (a call-path guard or trace target appears or goes away), and which commit did it.
Each first-parent commit of the range is a candidate base: the series is moved onto it
exactly as `rebase` would (same replay, same 3-way merges, nothing written) and compared
with the commit before it; a change of a patch's outcome, guards or targets is charged
to the commit where it first shows. The first commit is compared with the series moved
onto START (not with the pin): what already breaks on START is reported as such
(`at_start`), never charged to a commit of the range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from patchset.analysis import guards
from patchset.authoring import rebase
from patchset.pin import upstream
from patchset.errors import Exit, UsageError
from patchset.pin.model import GitPin, UpstreamPin
from patchset.series.model import Series
from patchset.progress import NullProgress, Progress


@dataclass(frozen=True)
class PatchAtCommit:
    """One patch on one candidate base."""

    name: str
    outcome: str                                    # rebase.OUTCOMES
    guards: tuple[str, ...] = ()                    # `fact (file:line)` of each guard
    targets: tuple[str, ...] = ()                   # `module:qualname`


@dataclass(frozen=True)
class Break:
    """What a commit changed for one patch, against the commit before it."""

    commit: str
    patch: str
    what: str                        # conflict | upstream | blocked | outcome | guard | target
    detail: str


@dataclass(frozen=True)
class CheckReport:
    range: str
    commits: tuple[str, ...]                        # oldest first
    breaks: tuple[Break, ...]
    final: tuple[PatchAtCommit, ...]                 # the series on the last commit
    subjects: dict[str, str] = field(default_factory=dict)
    start: str = ""                                  # START's commit
    # What is already broken on START itself, against the pin (the pin and START differ):
    # charged to START (`commit` is START), never to a commit of the range.
    at_start: tuple[Break, ...] = ()

    @property
    def exit_code(self) -> int:
        return Exit.FINDINGS if self.breaks or self.at_start else Exit.OK


def check_range(series: Series, spec: str, progress: Progress | None = None,
                offline: bool = False, cache: Path | None = None) -> CheckReport:
    """Walk START..END of the pin's upstream (git url) and report per commit; writes
    nothing but the cache."""
    progress = progress or NullProgress()
    start, sep, end = spec.partition("..")
    if not sep or not start or not end:
        raise UsageError(f"--check {spec!r}: expected START..END (upstream commits, tags or "
                         "branches)")
    if series.upstream.git is None:
        raise UsageError("--check walks upstream's git history: the pin needs upstream.git")
    found = upstream.history(series.upstream.git.url, start, end, cache, progress, offline)
    if not found.commits:
        raise UsageError(f"--check {spec}: no commit between them (END is not after START)")
    old_base = upstream.provision(series.upstream, cache, progress, offline)
    pinned = _on(series, old_base, series.upstream)
    at_start: list[Break] = []
    if found.start == old_base.commit:
        before = pinned
    else:                           # the baseline is the series moved onto START
        with progress.task(f"check START {found.start[:12]}", None):
            before = _move(series, old_base, _tree(found.repo, found.start),
                           _pin_at(series.upstream, found.start), progress)
        at_start = _changes(found.start, pinned, before)
    breaks: list[Break] = []
    for commit in found.commits:
        with progress.task(f"check {commit[:12]}", None):
            now = _move(series, old_base, _tree(found.repo, commit),
                        _pin_at(series.upstream, commit), progress)
        breaks += _changes(commit, before, now)
        before = now
    return CheckReport(spec, tuple(found.commits), tuple(breaks), tuple(before.values()),
                       found.subjects, found.start, tuple(at_start))


def _tree(repo: Path, commit: str) -> upstream.BaseTree:
    return upstream.BaseTree(repo=repo, commit=commit, source="git", ref=commit)


def _pin_at(pin: UpstreamPin, commit: str) -> UpstreamPin:
    assert pin.git is not None          # check_range refuses a pin without upstream.git
    return UpstreamPin(pin.name, f"{pin.version}+g{commit[:12]}",
                       GitPin(pin.git.url, commit), None, pin.git_prefix)


def _on(series: Series, base: upstream.BaseTree, pin: UpstreamPin) -> dict[str, PatchAtCommit]:
    """The series as it is, on its own pin: every patch clean."""
    texts = [(p.name, (Path(series.root) / p.file).read_text(encoding="utf-8"), p.trace)
             for p in series.patches]
    derived = guards.derive_texts(guards.load_tree(base, pin), texts, pin.git_prefix)
    return {p.name: _at(p.name, "clean", derived.get(p.name)) for p in series.patches}


def _move(series: Series, old_base: upstream.BaseTree, base: upstream.BaseTree,
          pin: UpstreamPin, progress: Progress) -> dict[str, PatchAtCommit]:
    moved = rebase.move_series(series, old_base, base, pin, progress)
    carried = [(m.patch.name, m.text, m.patch.trace) for m in moved if m.text is not None]
    derived = guards.derive_texts(guards.load_tree(base, pin), carried, pin.git_prefix) \
        if carried else {}
    return {m.patch.name: _at(m.patch.name, m.outcome.outcome, derived.get(m.patch.name))
            for m in moved}


def _at(name: str, outcome: str, found: guards.PatchGuards | None) -> PatchAtCommit:
    if found is None:
        return PatchAtCommit(name, outcome)
    return PatchAtCommit(name, outcome,
                         tuple(sorted({f"{g.fact} ({g.file}:{g.line})" for g in found.guards})),
                         found.targets)


def _changes(commit: str, before: dict[str, PatchAtCommit], now: dict[str, PatchAtCommit]
             ) -> list[Break]:
    out = []
    for name, new in now.items():
        old = before[name]
        if new.outcome != old.outcome and new.outcome in ("conflict", "upstream", "blocked"):
            out.append(Break(commit, name, new.outcome, f"{old.outcome} -> {new.outcome}"))
            continue
        if new.outcome not in ("clean", "3way"):
            continue                    # not carried here: no guards or targets to compare
        lost = [t for t in old.targets if t not in new.targets]
        gained = [t for t in new.targets if t not in old.targets]
        if lost:
            out.append(Break(commit, name, "target", f"trace target(s) gone: {', '.join(lost)}"
                             + (f"; now {', '.join(gained)}" if gained else "")))
        old_facts = {g.split(" (")[0] for g in old.guards}
        new_facts = {g.split(" (")[0] for g in new.guards}
        if old_facts != new_facts:
            parts = [f"+{f}" for f in sorted(new_facts - old_facts)] + \
                    [f"-{f}" for f in sorted(old_facts - new_facts)]
            out.append(Break(commit, name, "guard", "call-path guards " + " ".join(parts)))
    return out
