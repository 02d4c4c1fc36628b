"""The checks, one module each (id, severity, tags, sub-tags, docstring = description,
`check(ctx)`): CHECKS is their registry."""

from __future__ import annotations

from types import ModuleType

from . import (
    checkpoint_dtypes,
    cohort_parity,
    foreign_commits,
    gate_env,
    gpu_arch,
    hazards,
    imported_tree,
    pd_consistency,
    pinned_base,
    resolved_args,
    secrets,
    server_health,
    stale_process,
    trace,
    tree_drift,
)
from .base import AuditContext

CHECKS: tuple[ModuleType, ...] = (
    server_health, tree_drift, foreign_commits, pinned_base, imported_tree, stale_process,
    trace, gate_env, gpu_arch, pd_consistency, resolved_args, checkpoint_dtypes, hazards,
    secrets, cohort_parity,
)


def run_all(ctx: AuditContext) -> None:
    """Run every check; each host's findings land in its HostReport, in check order."""
    by_host = {h.host: h for h in ctx.hosts}
    for module in CHECKS:
        for finding in module.check(ctx):
            by_host[finding.host].findings.append(finding)


def describe() -> list[dict]:
    """id, severity, tags and description of every check (for docs and --help)."""
    return [{"id": m.ID, "severity": m.SEVERITY, "tags": list(m.TAGS),
             "description": (m.__doc__ or "").strip()} for m in CHECKS]


__all__ = ["CHECKS", "AuditContext", "describe", "run_all"]
