"""Only the series is on the tree: no commits on top of it, no applied patch the series
does not know, no applied patch in another version than the series'.

A foreign commit or an unknown patch is code nobody reviews with the series; a patch
applied in an older version is not the one whose evidence the series records.
"""

from __future__ import annotations

from ..model import Evidence, Finding
from .base import AuditContext, Reporter

ID = "foreign-commits"
SEVERITY = "medium"
TAGS = ("tree", "series")
SUB_TAGS = ("commit", "unknown-patch", "version")
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    known = ctx.series.by_name()
    for host in ctx.hosts:
        tree = host.facts.tree
        if not tree.known or not tree.value.get("managed"):
            continue
        status = tree.value
        where = status.get("target", "tree")
        ev = [Evidence.of("patchset status", tree, "read")]
        bad = 0
        for line in status.get("foreign_commits") or []:
            bad += 1
            out.append(finding(host.host, where, "HEAD = the last applied patch", line, "fail",
                               "a commit on top of the patchset series", ev, sub="commit"))
        for applied in status.get("applied") or []:
            patch = known.get(applied["name"])
            if patch is None:
                bad += 1
                out.append(finding(host.host, f"{where}:{applied['name']}", "a series patch",
                                   "not in the series", "warn", f"{applied['name']} is applied "
                                   "but not in this series (another patches.yaml?)", ev,
                                   sub="unknown-patch"))
            elif applied.get("sha256") and applied["sha256"] != patch.sha256:
                bad += 1
                out.append(finding(host.host, f"{where}:{patch.name}", patch.sha256[:12],
                                   applied["sha256"][:12], "warn", f"{patch.name} is applied "
                                   "in another version than the series has: re-apply", ev,
                                   sub="version", patches=[patch.name]))
        if not bad:
            out.append(finding(host.host, where, "only the series", "only the series", "pass",
                               "", ev))
    return out
