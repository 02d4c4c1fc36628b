"""Patch gates agree across the env file, the unit and the running processes.

systemd builds the server's environment from the unit's Environment= and its
EnvironmentFile= files (a file overrides Environment=); SGLang's main process hands it on
to the scheduler children, where the gated kernels read it at import. A gate that differs
between what the unit declares and what the processes hold means the unit was edited but
not restarted, or the gate is set somewhere else: the A/B you think you are running is
not the one that runs. A gate set for a patch that is not applied does nothing.
"""

from __future__ import annotations

from patchset.agent.lib.facts.base import FactValue
from ..model import Evidence, Finding, Unit
from .base import AuditContext, Reporter, shown

ID = "gate-env"
SEVERITY = "high"
TAGS = ("env", "systemd", "gates")
SUB_TAGS = ("children", "process", "unused")
finding = Reporter(ID, SEVERITY)


def declared(unit: Unit) -> tuple[dict[str, str] | None, str, list[Evidence]]:
    """The environment the unit gives its main process, or None with why not."""
    if not unit.show.known:
        return None, f"systemctl show {unit.name}: {unit.show.reason}", []
    env = dict(unit.show.value.get("environment") or {})
    evidence = [Evidence.of(f"{unit.name} Environment=", unit.show, env or "(none)")]
    for path, optional in unit.show.value.get("environment_files") or []:
        fact = unit.env_files.get(path) or FactValue.unknown("not read")
        if not fact.known:
            if optional:
                continue
            return None, f"EnvironmentFile {path}: {fact.reason}", evidence
        env.update(fact.value["values"])
        evidence.append(Evidence.of(f"EnvironmentFile {path}", fact, "read"))
    return env, "", evidence


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    gates = ctx.gate_envs()
    for host, server in ctx.servers():
        states = ctx.states(host, server)
        unit = host.facts.units.get(server.unit or "")
        want, why, evidence = declared(unit) if unit else (None, "not under systemd", [])
        main = server.main.environ
        hidden = [c.title for c in server.schedulers if c.environ.known and not c.environ.value]
        if hidden:
            out.append(finding(host.host, f"{server.id} scheduler environ", "readable",
                               "overwritten by the process title", "unknown",
                               f"{', '.join(hidden)}: setproctitle reuses the environ area, so "
                               "the gates were read from the main process (which passes them "
                               "on unchanged); SPT_NOENV=1 in the env file keeps them readable",
                               sub="children", severity="info"))
        for gate, patches in sorted(gates.items()):
            subject = f"{server.id} {gate}"
            if not main.known:
                out.append(finding(host.host, subject, "readable", "unknown", "unknown",
                                main.reason, [Evidence.of("main environ", main)]))
                continue
            live = main.value.get(gate)
            ev = evidence + [Evidence.of(main.source, main, shown(live))]
            if want is not None:
                expected = want.get(gate)
                if expected != live:
                    assert unit is not None         # want was declared by it
                    out.append(finding(host.host, subject, shown(expected), shown(live),
                                    "fail", f"{unit.name} declares {gate}={shown(expected)} "
                                    f"but the running server has {shown(live)}: restart the "
                                    "unit, or find where else it is set", ev, sub="process",
                                    patches=patches))
                    continue
            elif unit is not None:
                out.append(finding(host.host, subject, "declared", "unknown", "unknown",
                                why, ev))
                continue
            odd = [(c.title, c.environ.value.get(gate)) for c in server.schedulers
                   if c.environ.known and c.environ.value and
                   c.environ.value.get(gate) != live]
            if odd:
                ev += [Evidence.of(c.environ.source, c.environ, shown(c.environ.value.get(gate)))
                       for c in server.schedulers if c.environ.known]
                out.append(finding(host.host, subject, shown(live),
                                ", ".join(f"{t}={shown(v)}" for t, v in odd), "warn",
                                "the scheduler children do not hold the main process's value "
                                "(something edits it at startup)", ev, sub="children",
                                patches=patches))
                continue
            unused = [p for p in patches if live is not None and
                      states.get(p) is not None and states[p].state == "not-applied"]
            if unused:
                out.append(finding(host.host, subject, "gate of an applied patch",
                                f"{gate}={live}", "warn", f"{gate} is set but "
                                f"{', '.join(unused)} is not applied: it changes nothing", ev,
                                sub="unused", severity="low", patches=unused))
                continue
            out.append(finding(host.host, subject, shown(live), shown(live), "pass",
                            "unit, env file and processes agree", ev))
    return out
