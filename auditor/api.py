"""The audit as one library call: gather on every host (in parallel, one round trip each),
parse, evaluate patch states, run the checks, rank a symptom, return a Report."""

from __future__ import annotations

import time
from typing import Any

from patchset import __version__
from patchset.api import on_hosts
from patchset.errors import HostUnreachable
from patchset.model import Series

from . import hostfacts, remote
from . import policy as policy_mod
from .checks import AuditContext, run_all
from .model import HostFacts, HostReport, Report
from .rank import Access, rank
from .states import evaluate_host

SCHEMA_VERSION = "1.0"
EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNREACHABLE = 0, 1, 3


def gather_request(series: Series, pol: policy_mod.Policy) -> dict:
    """What the gatherer needs: the layout of the tree and which tensors to read."""
    pin = series.upstream
    return {"op": "audit", "format": 1, "git_prefix": pin.git_prefix, "package": pin.name,
            "tensors": [dict(p) for p in pol.patterns]}


def collect(series: Series, transports: list[Any], pol: policy_mod.Policy) -> list[HostFacts]:
    request = gather_request(series, pol)

    def one(transport: Any) -> HostFacts:
        try:
            result = remote.gather_on(transport, request)
        except HostUnreachable as exc:
            return HostFacts(host=transport.host, reachable=False, error=str(exc))
        return hostfacts.build(transport.host, result)
    return on_hosts(transports, one)


def evaluate(series: Series, facts: list[HostFacts], symptom: str | None = None,
             access: Access | None = None, pol: policy_mod.Policy | None = None) -> Report:
    """Everything after gathering: pure, so tests feed it fixture facts directly."""
    pol = pol or policy_mod.load()
    if symptom:
        pol.symptom(symptom)              # a bad symptom is bad input, before any work
    hosts = [HostReport(host=f.host, facts=f,
                        states=evaluate_host(series, f) if f.reachable and not f.error else [])
             for f in facts]
    ctx = AuditContext(series, pol, hosts)
    run_all(ctx)
    report = Report(schema_version=SCHEMA_VERSION, tool_version=__version__,
                    generated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    series={"manifest": series.manifest, "upstream": {
                        "name": series.upstream.name, "version": series.upstream.version},
                        "patches": [p.name for p in series.patches]},
                    hosts=hosts)
    if symptom:
        report.symptom = rank(ctx, symptom, access)
    return report


def audit(series: Series, transports: list[Any], symptom: str | None = None,
          access: Access | None = None, pol: policy_mod.Policy | None = None) -> Report:
    pol = pol or policy_mod.load()
    if symptom:
        pol.symptom(symptom)
    return evaluate(series, collect(series, transports, pol), symptom, access, pol)


def exit_code(report: Report) -> int:
    """3 if a host was unreachable, else 1 if a check did not pass (fail, warn or unknown;
    `info` findings are notes and never count), else 0."""
    if any(not h.facts.reachable for h in report.hosts):
        return EXIT_UNREACHABLE
    if any(h.facts.error for h in report.hosts):
        return EXIT_FINDINGS
    if any(f.status != "pass" and f.severity != "info" for f in report.findings):
        return EXIT_FINDINGS
    return EXIT_CLEAN
