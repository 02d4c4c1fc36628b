"""Turn SELECTION flags into a plan: which patches go in, which stay out, and why.

Rules: --tier is cumulative (safe; safe+moderate; all), --path keeps patches for that
path (a `both` patch serves every path), --only/--exclude narrow by name, `depends` are
pulled in (and marked so) even when another rule would leave them out, `conflicts`
between two selected patches refuse the selection, and series order is always kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from patchset.errors import SelectionError
from patchset.series.model import PATHS, TIERS, Patch, Series


@dataclass(frozen=True)
class Selection:
    """The selection flags of a command: --tier, --path, --only, --exclude."""

    tier: str | None = None
    path: str | None = None
    only: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """Whether one patch is in the plan, and why (`plan` shows it)."""

    name: str
    selected: bool
    reason: str
    pulled_in: bool = False


@dataclass(frozen=True)
class Plan:
    """A selection resolved against a series: a decision per patch, the chosen ones."""

    selection: Selection
    decisions: tuple[Decision, ...]
    patches: tuple[Patch, ...] = field(default=())   # the selected ones, series order

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.patches)


def parse_names(values: list[str] | tuple[str, ...] | None,
                flag: str = "a name list") -> tuple[str, ...]:
    """Accept `--only a,b --only c` as well as repeated flags. A value that names nothing
    (`--only ''`, `--only ,`) is bad input: read as no names, it would widen `--only` to
    every patch, risky ones included, the opposite of what was typed."""
    names: list[str] = []
    for value in values or ():
        parts = [part.strip() for part in value.split(",") if part.strip()]
        if not parts:
            raise SelectionError(f"{flag} {value!r}: names nothing (give names, A,B, or "
                                 "leave the option out)")
        names.extend(parts)
    return tuple(names)


def list_patches(series: Series, tier: str | None = None, path: str | None = None) -> list[Patch]:
    """`list`: the patches --tier/--path keep, series order. A listing, not a selection:
    two patches that conflict are both listed (`check` passes such a series; `plan` and
    `apply` refuse taking both)."""
    return list(_resolve(series, Selection(tier=tier, path=path)).patches)


def plan(series: Series, selection: Selection) -> Plan:
    resolved = _resolve(series, selection)
    _refuse_conflicts(series, set(resolved.names))
    return resolved


def _resolve(series: Series, selection: Selection) -> Plan:
    """The plan of `selection`, its conflicts not yet refused."""
    _validate(series, selection)
    chosen: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for patch in series.patches:
        reason = _excluded_by(patch, selection)
        if reason:
            reasons[patch.name] = reason
        else:
            chosen[patch.name] = _included_because(patch, selection)
    pulled = _pull_dependencies(series, chosen, selection)
    decisions = tuple(
        Decision(p.name, p.name in chosen, chosen.get(p.name) or reasons[p.name], p.name in pulled)
        for p in series.patches
    )
    return Plan(selection, decisions, tuple(p for p in series.patches if p.name in chosen))


def _validate(series: Series, selection: Selection) -> None:
    if selection.tier is not None and selection.tier not in TIERS:
        raise SelectionError(f"--tier {selection.tier!r}: expected one of {', '.join(TIERS)}")
    if selection.path is not None and selection.path not in PATHS:
        raise SelectionError(f"--path {selection.path!r}: expected one of {', '.join(PATHS)}")
    known = series.by_name()
    for flag, names in (("--only", selection.only), ("--exclude", selection.exclude)):
        for name in names:
            if name not in known:
                raise SelectionError(f"{flag} {name!r}: no such patch in {series.manifest} "
                                     f"(see `patchset list`)")
    both = set(selection.only) & set(selection.exclude)
    if both:
        raise SelectionError(f"{', '.join(sorted(both))} both in --only and --exclude")


def _excluded_by(patch: Patch, selection: Selection) -> str:
    if selection.only and patch.name not in selection.only:
        return "not named in --only"
    if patch.name in selection.exclude:
        return "named in --exclude"
    if selection.tier and TIERS.index(patch.tier) > TIERS.index(selection.tier):
        return f"tier {patch.tier} is above --tier {selection.tier}"
    if selection.path and selection.path != "both" and patch.path not in (selection.path, "both"):
        return f"path {patch.path} does not serve --path {selection.path}"
    return ""


def _included_because(patch: Patch, selection: Selection) -> str:
    if selection.only:
        return "named in --only"
    parts = []
    if selection.tier:
        parts.append(f"tier {patch.tier} within --tier {selection.tier}")
    if selection.path and selection.path != "both":
        parts.append(f"path {patch.path} serves {selection.path}")
    return "; ".join(parts) or "whole series (no selection flags)"


def _pull_dependencies(series: Series, chosen: dict[str, str], selection: Selection) -> set[str]:
    """Add every dependency of a chosen patch, transitively; refuse one that is --exclude'd."""
    known = series.by_name()
    pulled: set[str] = set()
    stack = [name for name in chosen]
    while stack:
        name = stack.pop()
        for dep in known[name].depends:
            if dep in chosen:
                continue
            if dep in selection.exclude:
                raise SelectionError(f"{name} depends on {dep}, which --exclude removes; "
                                     f"exclude {name} too or keep {dep}")
            chosen[dep] = f"pulled in: {name} depends on it"
            pulled.add(dep)
            stack.append(dep)
    return pulled


def _refuse_conflicts(series: Series, chosen: set[str]) -> None:
    for patch in series.patches:
        if patch.name not in chosen:
            continue
        for other in patch.conflicts:
            if other in chosen:
                raise SelectionError(f"{patch.name} conflicts with {other}; "
                                     f"--exclude one of them")
