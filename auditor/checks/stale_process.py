"""Servers run the code and settings on disk: started after the last apply and after the
last change to their unit and env files, with no pending daemon-reload.

Python imports the tree once, at startup: a server started before `patchset apply` (or
revert) still runs the previous patches, and one started before its env file changed
still runs the previous gates. Either way what the state says is live is not.
"""

from __future__ import annotations

from ..facttable import role
from ..model import Evidence, Finding
from ..staleness import iso as _iso
from ..staleness import stale
from .base import AuditContext, Reporter

ID = "stale-process"
SEVERITY = "high"
TAGS = ("process", "restart")
SUB_TAGS = ("apply", "changed", "daemon-reload")
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host, server in ctx.servers():
        started = server.main.started
        subject = f"{server.id} (pid {server.main.pid})"
        if started is None:
            out.append(finding(host.host, subject, "start time known", "unknown", "unknown",
                               "the process start time could not be read"))
            continue
        ev = [Evidence("process start", _iso(started), f"read /proc/{server.main.pid}/stat")]
        problems: list[tuple[str, str, str, str]] = []   # (sub, found, message, status)
        tree = host.facts.tree
        if tree.known and tree.value.get("updated"):
            ev.append(Evidence.of("last apply (state.json updated)", tree, tree.value["updated"]))
            served = role(ctx.context(host, server))
            is_stale, why = stale(server, tree.value, str(served.value) if served.known
                                  else None)
            if is_stale:
                problems.append(("apply", f"started {_iso(started)}", why, "fail"))
        unit = host.facts.units.get(server.unit or "")
        if unit is not None:
            files = [("unit file", unit.file)] + [(f"env file {p}", f)
                                                   for p, f in unit.env_files.items()]
            for label, fact in files:
                if fact is None or not fact.known or not fact.value.get("stat"):
                    continue
                mtime = fact.value["stat"]["mtime"]
                ev.append(Evidence.of(f"{label} mtime", fact, _iso(mtime)))
                if mtime > started + 1:
                    problems.append(("changed", f"{label} changed {_iso(mtime)}",
                                     (f"{label} changed at {_iso(mtime)}, after the "
                                      f"server started at {_iso(started)}"), "warn"))
            if unit.show.known and unit.show.value.get("NeedDaemonReload") == "yes":
                problems.append(("daemon-reload", "NeedDaemonReload=yes",
                                 (f"{unit.name} changed on disk and systemd has not reloaded "
                                  "it (systemctl daemon-reload)"), "warn"))
        if not problems:
            out.append(finding(host.host, subject, "started after apply and unit changes",
                               f"started {_iso(started)}", "pass", "", ev))
        for sub, found, message, status in problems:
            out.append(finding(host.host, subject, "started after apply and unit changes",
                               found, status, message, ev, sub=sub))
    return out
