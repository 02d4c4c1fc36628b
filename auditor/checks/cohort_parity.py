"""Servers of one cohort (inventory `cohort`) run the same patches: the same applied set
with the same hashes, the same tree, the same gates in their processes and the same
patches loaded by the running process (not just on disk).

A hotfix on one host of a prefill/decode pair and not on the other serves subtly wrong
output; a patch that changes the wire between roles (`wire: true` in patches.yaml) must
never be mixed, so its mismatch is high severity. A mismatch is accepted when it is
declared compatible: `parity: any` on the patch, or the patch in the cohort's
`compatible` list. A server whose fact is unknown leaves the comparison unknown.
"""

from __future__ import annotations

from ..cohorts import Aspect, ServerRun, patch_value, runs
from ..model import Evidence, Finding
from .base import AuditContext, Reporter

ID = "cohort-parity"
SEVERITY = "medium"
TAGS = ("cohort", "fleet")
SUB_TAGS = ("tree",)   # and a patch name each (not waivable yet)
finding = Reporter(ID, SEVERITY)
ASPECTS = ("applied", "loaded", "gates")     # per patch; the tree is compared on its own
Key = tuple[str, str, str]                     # (server, aspect, what it is compared within)


def check(ctx: AuditContext) -> list[Finding]:
    found = runs(ctx.series, ctx.hosts, ctx.cohorts)
    out: list[Finding] = []
    for spec in ctx.cohorts:
        members = [r for r in found if r.cohort == spec.name]
        if len(members) < 2:
            continue                       # nothing to compare in this audit
        out.append(_tree(spec.name, members))
        for patch in ctx.series.patches:
            allowed = patch.parity == "any" or patch.name in spec.compatible
            out.append(_patch(spec.name, members, patch, allowed))
    return out


def _tree(cohort: str, members: list[ServerRun]) -> Finding:
    values = {(r.label, "tree", ""): r.tree for r in members}
    return _verdict(cohort, members, "tree", "the tree", values, False, "medium", ())


def _patch(cohort: str, members: list[ServerRun], patch, allowed: bool) -> Finding:
    values: dict[Key, Aspect] = {}
    for aspect in ASPECTS:
        for r in members:
            v = patch_value(r, aspect, patch)
            if v is not None:
                # gates are compared between servers of one role: a prefill server may
                # rightly run a `both` patch with its gate off where decode has it on
                values[(r.label, aspect, r.role if aspect == "gates" else "")] = v
    return _verdict(cohort, members, patch.name, f"patch {patch.name}", values, allowed,
                    "high" if patch.wire else SEVERITY, (patch.name,), patch.wire)


def _verdict(cohort: str, members: list[ServerRun], sub: str, what: str,
             values: dict[Key, Aspect], allowed: bool, severity: str,
             patches: tuple[str, ...], wire: bool = False) -> Finding:
    """fail: two known values differ in one aspect (named per server); unknown: they
    agree but one could not be read; pass: all agree, or the mismatch is declared
    compatible (said so)."""
    ev = [Evidence(f"{k[0]} {k[1]}", v.value if v.known else f"unknown: {v.reason}")
          for k, v in values.items()]
    subject = f"cohort {cohort} {what}"
    servers = ", ".join(r.label for r in members)
    differ = _differing(values)
    unknown = [k for k, v in values.items() if not v.known]
    host = members[0].host
    if differ:
        shown = "; ".join(f"{k[0]} {k[1]} {values[k].value}" for k in differ)
        if allowed:
            return finding(host, subject, "equal, or declared compatible", shown, "pass",
                           f"{what} differs in cohort {cohort}, declared compatible", ev,
                           sub=sub, severity=severity, patches=patches)
        why = " (it changes a wire between roles: never mix it)" if wire else ""
        return finding(host, subject, f"the same on {servers}", shown, "fail",
                       f"{what} differs between servers of cohort {cohort}: {shown}{why}",
                       ev, sub=sub, severity=severity, patches=patches)
    if unknown:
        reasons = "; ".join(f"{k[0]} {k[1]}: {values[k].reason}" for k in unknown)
        return finding(host, subject, f"the same on {servers}", "unknown", "unknown",
                       f"cannot compare {what} in cohort {cohort}: {reasons}", ev, sub=sub,
                       severity=severity, patches=patches)
    return finding(host, subject, f"the same on {servers}", "the same", "pass", "", ev,
                   sub=sub, severity=severity, patches=patches)


def _differing(values: dict[Key, Aspect]) -> list[Key]:
    """The (server, aspect) keys of every aspect (applied, loaded, gates, tree) whose
    known values are not all equal across the servers."""
    by_aspect: dict[tuple[str, str], dict[Key, Aspect]] = {}
    for key, v in values.items():
        by_aspect.setdefault(key[1:], {})[key] = v
    out: list[Key] = []
    for group in by_aspect.values():
        known = [v.value for v in group.values() if v.known]
        if any(k != known[0] for k in known[1:]):
            out += [k for k, v in group.items() if v.known]
    return out
