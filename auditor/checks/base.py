"""What every check gets (AuditContext) and gives back (Finding records, via `make`).

A check is one module (ansible-lint style): `ID`, `SEVERITY`, `TAGS`, `SUB_TAGS` (the
`sub=` of its findings: `ID[SUB]` is what a waiver names, auditor/waivers.py), a docstring
that is its description, and `check(ctx) -> list[Finding]`. Checks never print and never
raise for a missing fact: a fact that cannot be had is a finding with status `unknown` and
the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from patchset.series.model import Series

from patchset.agent.lib.facts.base import FactValue
from ..cohorts import CohortSpec
from ..facttable import Context
from ..model import Evidence, Finding, HostReport, PatchState, Server
from ..policy import Policy
from ..values import shown  # noqa: F401 - the checks' one way to show a value


@dataclass
class AuditContext:
    series: Series
    policy: Policy
    hosts: list[HostReport]
    cohorts: tuple[CohortSpec, ...] = ()     # from the inventory (check cohort-parity)

    def states(self, host: HostReport, server: Server | None) -> dict[str, PatchState]:
        sid = server.id if server else None
        return {s.patch: s for s in host.states if s.server == sid}

    def context(self, host: HostReport, server: Server | None) -> Context:
        states = self.states(host, server)

        def patch_state(name: str) -> FactValue:
            st = states.get(name)
            if st is None:
                return FactValue.unknown(f"no patch {name!r} in the series")
            return FactValue(st.state, source=f"patch {name}: {st.reason}")
        return Context(host.facts, server, patch_state=patch_state)

    def servers(self) -> Iterable[tuple[HostReport, Server]]:
        for host in self.hosts:
            if not host.facts.reachable or host.facts.error:
                continue
            for server in host.facts.sglang_servers:
                yield host, server

    def gate_envs(self) -> dict[str, list[str]]:
        """Gate env name -> the patches it gates."""
        out: dict[str, list[str]] = {}
        for p in self.series.patches:
            if p.gate:
                out.setdefault(p.gate.env, []).append(p.name)
        return out


class Reporter:
    """Makes one check's findings: `finding = Reporter(ID, SEVERITY)`, then
    `finding(host, subject, expected, found, status, message, evidence, sub=...)`."""

    def __init__(self, check_id: str, severity: str) -> None:
        self.id, self.severity = check_id, severity

    def __call__(self, host: str, subject: str, expected: Any, found: Any, status: str,
                 message: str = "", evidence: Iterable[Evidence] = (), sub: str | None = None,
                 severity: str | None = None, patches: Iterable[str] = ()) -> Finding:
        return Finding(id=f"{self.id}[{sub}]" if sub else self.id, host=host,
                       subject=subject, expected=expected, found=found, status=status,
                       severity=severity or self.severity, message=message,
                       evidence=tuple(evidence), patches=tuple(patches))
