"""Does a running server run the code the tree holds now?

Python imports the tree once, at startup. When the unit was rendered by `patchset deploy`,
the process's own environment says exactly which patches it started with
(PATCHSET_PATCHES=`name:sha12 ...`, the patches of its role); compared with the tree's
state that is exact, even across an apply and a revert back. Without it, only time can
tell: a process started before the last apply may run other patches.
"""

from __future__ import annotations

import calendar
import time
from typing import Any

from .model import ROLE_PATHS, Server

PATCHES_VAR = "PATCHSET_PATCHES"


def epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def iso(value: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))


def role_patch_ids(applied: list[dict], role: str | None) -> list[str]:
    """`name:sha12` of each applied patch that runs in `role`: the words of PATCHSET_PATCHES
    a process started now would have."""
    paths = ROLE_PATHS.get(str(role), ("prefill", "decode"))
    return [f"{a['name']}:{str(a.get('sha256') or '')[:12]}" for a in applied
            if a.get("path") in (None, "both") or a.get("path") in paths]


def stale(server: Server, status: dict, role: str | None) -> tuple[bool | None, str]:
    """(True: runs other code than the tree / False: runs it / None: cannot tell, why)."""
    updated = status.get("updated")
    applied_at = epoch(updated)
    started = server.main.started
    environ = server.main.environ
    started_with = environ.value.get(PATCHES_VAR) if environ.known else None
    if started_with is not None:
        had = started_with.split()
        now = role_patch_ids(status.get("applied") or [], role)
        if had == now:
            return False, f"runs the patches the tree has ({PATCHES_VAR})"
        gone = [p.split(":")[0] for p in had if p not in now]
        new = [p.split(":")[0] for p in now if p not in had]
        parts = ([f"started with {', '.join(gone)} no longer applied"] if gone else []) + \
            ([f"started without {', '.join(new)}"] if new else [])
        return True, (f"{'; '.join(parts) or 'started with another patch order'} "
                      f"({PATCHES_VAR} of pid {server.main.pid}; last apply {updated})")
    if started is None or applied_at is None:
        return None, "no start time or no apply time to compare"
    if started < applied_at:
        return True, (f"started {iso(started)}, before the last apply at {updated}: it runs "
                      "the code of an earlier apply")
    return False, f"started {iso(started)}, after the last apply at {updated}"
