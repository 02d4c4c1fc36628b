"""Known hazards of the pinned upstream do not hold on any server, or a patch that fixes
them is active there (auditor/data/hazards.yaml).

A hazard is upstream behaviour that is wrong under declared live conditions (e.g. NVFP4
experts through a MoE backend that reaches cutlass_moe_fp4, which skips the model's
swiglu clamp). It is a finding whatever the series holds: the data names the conditions
and the patches that clear it, the check only evaluates them against live facts.
"""

from __future__ import annotations

from ..facttable import resolve
from ..model import Evidence, Finding
from ..states import holds
from .base import AuditContext, Reporter, shown

ID = "hazard"
SEVERITY = "high"
TAGS = ("upstream",)
SUB_TAGS = ()   # each hazard's id (the policy's)
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host, server in ctx.servers():
        c = ctx.context(host, server)
        states = ctx.states(host, server)
        for hz in ctx.policy.hazards:
            subject = f"{server.id}: {hz.title}"
            ev, unknown, off = [], [], []
            for req in hz.when:
                value = resolve(req.fact, c)
                ev.append(Evidence.of(f"{req.fact} {req.op} {shown(req.value)}", value))
                if not value.known:
                    unknown.append(f"{req.fact}: {value.reason}")
                elif not holds(req.op, value.value, req.value):
                    off.append(f"{req.fact}={shown(value.value)}")
            fixes = [p for p in hz.fixed_by if states.get(p) and states[p].state == "active"]
            if off:
                out.append(finding(host.host, subject, "conditions do not all hold",
                                   "; ".join(off), "pass", "not applicable here", ev,
                                   sub=hz.id, severity=hz.severity))
            elif fixes:
                out.append(finding(host.host, subject, f"fixed by {', '.join(hz.fixed_by)}",
                                   f"{', '.join(fixes)} active", "pass", "cleared", ev,
                                   sub=hz.id, severity=hz.severity))
            elif unknown:
                out.append(finding(host.host, subject, "known conditions", "unknown",
                                   "unknown", "; ".join(unknown), ev, sub=hz.id,
                                   severity=hz.severity))
            else:
                missing = ", ".join(f"{p} ({states[p].state})" if p in states else
                                    f"{p} (not in the series)" for p in hz.fixed_by)
                out.append(finding(host.host, subject,
                                   f"fixed by {', '.join(hz.fixed_by) or 'nothing'}",
                                   f"hazard live; fix: {missing or 'none'}", "fail", hz.why,
                                   ev, sub=hz.id, severity=hz.severity))
    return out
