"""The tree sits on the series' pinned upstream: the state's upstream and per-file base
hashes are the pin's.

Patches are made against exact pre-images; a tree on another base may apply by luck and
still run different code around them.
"""

from __future__ import annotations

from patchset.api import base_files

from ..model import Evidence, Finding
from .base import AuditContext, Reporter

ID = "pinned-base"
SEVERITY = "high"
TAGS = ("tree", "upstream")
SUB_TAGS = ("version", "files")
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    pin = ctx.series.upstream
    want = base_files(ctx.series)
    for host in ctx.hosts:
        tree = host.facts.tree
        if not tree.known or not tree.value.get("managed"):
            continue
        status = tree.value
        ev = [Evidence.of("state.json upstream/base", tree, "read")]
        up = status.get("upstream") or {}
        expected = f"{pin.name} {pin.version}"
        found = f"{up.get('name', '?')} {up.get('version', '?')}"
        if found != expected:
            out.append(finding(host.host, status.get("target", "tree"), expected, found, "fail",
                               "the tree was applied against another upstream", ev,
                               sub="version"))
            continue
        have = (status.get("base") or {}).get("files") or {}
        wrong = sorted(p for p in set(want) & set(have) if want[p] != have[p])
        if wrong:
            out.append(finding(host.host, status.get("target", "tree"),
                               f"pin pre-images of {len(want)} file(s)",
                               f"{len(wrong)} differ: {', '.join(wrong[:3])}", "fail",
                               "the recorded base is not the pin's", ev, sub="files"))
            continue
        commit = (status.get("base") or {}).get("commit")
        out.append(finding(host.host, status.get("target", "tree"), expected,
                           found + (f" @ {commit[:12]}" if commit else ""), "pass", "", ev))
    return out
