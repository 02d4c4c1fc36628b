"""Is a server stale? The agent's one rule (patchset/agent/lib/staleness.py), on gathered facts.

`patchset status` judges the units on the host with the same `judge`, from the same
inputs (the main process's start, its PATCHSET_PATCHES, the tree's state), so the two
cannot disagree.
"""

from __future__ import annotations

from patchset.agent.lib.staleness import PATCHES_VAR, epoch, iso, judge, role_patch_ids

from .model import Server

__all__ = ["PATCHES_VAR", "epoch", "iso", "role_patch_ids", "stale"]


def stale(server: Server, status: dict, role: str | None) -> tuple[bool | None, str]:
    """(True: runs other code than the tree / False: runs it / None: cannot tell, why)."""
    environ = server.main.environ
    started_with = environ.value.get(PATCHES_VAR) if environ.known else None
    return judge(server.main.started, started_with, status.get("applied") or [],
                 status.get("updated"), role, server.main.pid)
