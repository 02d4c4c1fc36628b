"""Does a running server run the code the tree holds now? One rule, used everywhere.

Python imports the tree once, at startup. When the unit was rendered by `patchset deploy`,
the process's own environment says exactly which patches it started with
(PATCHSET_PATCHES=`name:sha12 ...`, the patches of its role); compared with the tree's
state that is exact, even across an apply and a revert back. Without it, only time can
tell: a process started before the last apply may run other patches.

The engine's `status` (on the host), the deploy runner's restart decision and the audit
(on the controller, from gathered facts) all call `judge`, so they cannot disagree.
Standard library only: it ships to hosts with the agent.
"""

from __future__ import annotations

import calendar
import time
from typing import Any, Iterable

PATCHES_VAR = "PATCHSET_PATCHES"
# which patch paths (prefill / decode / both) run in a process of each role: a router runs
# no SGLang model code; any other role (a plain server, not disaggregated: `null`; not
# known) runs every patch
ROLE_PATHS: dict[str, tuple[str, ...]] = {"prefill": ("prefill",), "decode": ("decode",),
                                          "router": ()}


def served_paths(role: Any) -> tuple[str, ...]:
    """The paths a server of `role` serves."""
    return ROLE_PATHS.get(str(role), ("prefill", "decode"))


def runs_in(path: Any, role: Any) -> bool:
    """Does the code of a patch with this `path` tag run in a server of `role`?"""
    paths = served_paths(role)
    return bool(paths) and (path in (None, "both") or path in paths)


def role_applied(applied: Iterable[dict[str, Any]], role: Any) -> list[dict[str, Any]]:
    """The applied patches whose code runs in `role`, in order."""
    return [a for a in applied if runs_in(a.get("path"), role)]


def role_patch_ids(applied: Iterable[dict[str, Any]], role: Any) -> list[str]:
    """`name:sha12` of each applied patch that runs in `role`: the words of
    PATCHSET_PATCHES that a process started now would have."""
    return [f"{a['name']}:{str(a.get('sha256') or '')[:12]}" for a in role_applied(applied, role)]


def epoch(stamp: Any) -> float | None:
    """The state's `updated` stamp as epoch seconds: `2026-12-01T14:00:00.123Z` (state
    format 2) or `2026-12-01T14:00:00Z` (format 1)."""
    if not isinstance(stamp, str) or not stamp.endswith("Z"):
        return None
    whole, dot, frac = stamp[:-1].partition(".")
    if dot and not (frac.isascii() and frac.isdigit()):
        return None
    try:
        seconds = float(calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None
    return seconds + (float(f"0.{frac}") if frac else 0.0)


def iso(value: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))


def judge(started: float | None, started_with: str | None, applied: list[dict[str, Any]],
          updated: str | None, role: Any, pid: int | None) -> tuple[bool | None, str]:
    """(True: runs other code than the tree / False: runs it / None: cannot tell), why.

    `started`: the main process's start (epoch s); `started_with`: its PATCHSET_PATCHES
    (None when unknown); `applied`, `updated`: the tree's state now."""
    if started_with is not None:
        had = started_with.split()
        now = role_patch_ids(applied, role)
        if had == now:
            return False, f"runs the patches the tree has ({PATCHES_VAR})"
        gone = [p.split(":")[0] for p in had if p not in now]
        new = [p.split(":")[0] for p in now if p not in had]
        parts = ([f"started with {', '.join(gone)} no longer applied"] if gone else []) + \
            ([f"started without {', '.join(new)}"] if new else [])
        return True, (f"{'; '.join(parts) or 'started with another patch order'} "
                      f"({PATCHES_VAR} of pid {pid}; last apply {updated})")
    applied_at = epoch(updated)
    if started is None or applied_at is None:
        return None, "no start time or no apply time to compare"
    if started < applied_at:
        return True, (f"started {iso(started)}, before the last apply at {updated}: it runs "
                      "the code of an earlier apply")
    return False, f"started {iso(started)}, after the last apply at {updated}"
