"""Every SGLang unit is active and its server answers /health with 200.

Everything else the audit says about a server is about a process that should be
serving; a unit that is failed, restarting or unhealthy is the first finding to fix.
"""

from __future__ import annotations

from ..model import Evidence, Finding
from .base import AuditContext, Reporter

ID = "server-health"
SEVERITY = "high"
TAGS = ("systemd", "http")
SUB_TAGS = ("unit", "health")
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host in ctx.hosts:
        running = {s.unit for s in host.facts.servers if s.unit}
        for unit in host.facts.units.values():
            if not unit.show.known:
                out.append(finding(host.host, unit.name, "active", "unknown", "unknown",
                                   unit.show.reason, [Evidence.of("systemctl show", unit.show)]))
                continue
            props = unit.show.value
            state = f"{props.get('ActiveState')}/{props.get('SubState')}"
            ev = [Evidence.of("systemctl show", unit.show, state)]
            if props.get("ActiveState") != "active":
                out.append(finding(host.host, unit.name, "active/running", state, "fail",
                                   f"result {props.get('Result')}, restarts "
                                   f"{props.get('NRestarts')}", ev, sub="unit"))
            elif unit.name not in running and props.get("Id", "").startswith("sglang"):
                out.append(finding(host.host, unit.name, "an SGLang process", "none found",
                                   "warn", "the unit is active but no sglang process runs in "
                                   "it", ev, sub="unit", severity="medium"))
            else:
                out.append(finding(host.host, unit.name, "active/running", state, "pass", "",
                                   ev, sub="unit"))
        for server in host.facts.sglang_servers:
            health = server.health
            ev = [Evidence.of("GET /health", health)]
            if not health.known:
                out.append(finding(host.host, f"{server.id} /health", "200", "unknown",
                                   "unknown", health.reason, ev, sub="health"))
            elif not health.value["ok"]:
                out.append(finding(host.host, f"{server.id} /health", "200",
                                   str(health.value.get("error") or health.value["status"]),
                                   "fail", "the server does not answer healthy", ev,
                                   sub="health"))
            else:
                out.append(finding(host.host, f"{server.id} /health", "200", "200", "pass", "",
                                   ev, sub="health"))
    return out
