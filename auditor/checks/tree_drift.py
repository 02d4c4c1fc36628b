"""The managed tree is what the state says: no hand edits to patched files, nothing
uncommitted on a git tree, no interrupted transaction.

A hand edit means the code that runs is neither upstream nor any patch in the series;
`status` shows the diff, `apply` refuses to touch it until it is restored or captured.
"""

from __future__ import annotations

from ..model import Evidence, Finding
from .base import AuditContext, Reporter

ID = "tree-drift"
SEVERITY = "high"
TAGS = ("tree",)
SUB_TAGS = ("unmanaged", "hand-edit", "dirty", "interrupted")
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host in ctx.hosts:
        tree = host.facts.tree
        if host.facts.error:
            continue
        if not tree.known:
            out.append(finding(host.host, "tree", "managed and clean", "unknown", "unknown",
                               tree.reason, [Evidence.of("tree", tree)]))
            continue
        status = tree.value
        where = status.get("target", "tree")
        if not status.get("managed"):
            out.append(finding(host.host, where, "managed by patchset", "not managed", "warn",
                               "no .patchset/state.json: nothing applied here yet",
                               [Evidence.of("state", tree, "absent")], sub="unmanaged",
                               severity="medium"))
            continue
        ev = [Evidence.of("patchset status", tree, "read")]
        files = {c.path: p.name for p in ctx.series.patches for c in p.files}
        bad = 0
        for item in status.get("drift") or []:
            bad += 1
            out.append(finding(host.host, f"{where}:{item['path']}",
                               (item.get("expected") or "absent")[:12],
                               (item.get("found") or "absent")[:12], "fail",
                               f"{item['path']} was edited by hand since the apply", ev,
                               sub="hand-edit", patches=[files[item["path"]]]
                               if item["path"] in files else []))
        for path in status.get("dirty") or []:
            bad += 1
            out.append(finding(host.host, f"{where}:{path}", "committed", "uncommitted change",
                               "fail", "uncommitted change in the git tree", ev, sub="dirty"))
        if status.get("interrupted"):
            bad += 1
            i = status["interrupted"]
            out.append(finding(host.host, where, "no transaction in progress",
                               f"interrupted {i['op']} ({i['id']})", "fail", i.get("next", ""),
                               ev, sub="interrupted"))
        if not bad:
            out.append(finding(host.host, where, "no drift", "no drift", "pass", "", ev))
    return out
