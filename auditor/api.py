"""The audit as one library call: gather on every host (in parallel, one round trip each),
run the fidelity probes against its endpoint when asked, parse, evaluate patch states,
run the checks, rank a symptom, return a Report.

The probes are passed in (`HostProbes`, filled by isolate.probe.AuditProbes, which opens
endpoints through the resolver the CLI holds): this package is read-only and never imports
the code that sends requests to a server; it says where each host's facts find a server,
calls the probes, and turns their records (model.ProbeResult) into findings."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol
from urllib.parse import urlsplit

from patchset import __version__
from patchset.agent.lib import wire
from patchset.api import DEFAULT_FORKS, on_hosts
from patchset.errors import Exit, PatchsetError, TargetError, Unreachable
from patchset.transport import Transport
from patchset.series.model import Series

from . import hostfacts
from . import policy as policy_mod
from . import waivers as waivers_mod
from .checks import AuditContext, run_all
from .cohorts import CohortSpec, runs
from .model import (PROBE_EVIDENCE, CohortMember, Evidence, Finding, HostFacts, HostReport,
                    ProbeResult, Report, counted)
from .rank import Access, entry_url, rank
from .states import evaluate_host

SCHEMA_VERSION = "1.7"          # 1.1: probes, probe[...]; 1.2: states[].evidence, trace[...]; 1.3: probes[].drift
                                # 1.4: waivers, findings[].waiver, status waived, waiver[...]
                                # 1.5: symptom.measured[].recorded; 1.6: states[].observation, modes
                                # 1.7: cohorts[] (host, server, role, cohort, hash), cohort-parity
PROBE_CHECK = "probe"           # finding ids probe[recall], probe[needle]
PROBE_SEVERITY = "high"         # a server that loses context serves wrong answers
PROBE_PATHS = {"drift": "/generate"}   # where a probe POSTs (else a chat completion)


class HostProbes(Protocol):
    """What `audit --probe` runs against each host (isolate.probe.AuditProbes). An endpoint
    is opaque here: something the plan opened and sends requests to (an HTTP endpoint on
    the host's SSH connection)."""

    def endpoint(self, host: str, at: tuple[str, int] | None) -> Any | None:
        """Where `host`'s probes go: its inventory role when that has a port (as `patchset
        probe HOST`), else `at`, the address and port its facts say a client's request
        enters (listen_at), as seen from the host; None when neither. Bad input (an
        address the endpoint refuses) is a PatchsetError."""

    def run(self, host: str, endpoint: Any) -> list[ProbeResult]:
        """Every probe asked for, against `endpoint` (closed after); failures are records,
        not exceptions."""

    def not_run(self, host: str, reason: str) -> list[ProbeResult]:
        """Every probe asked for, as a record that could not be sent (and why)."""


def gather_request(series: Series, pol: policy_mod.Policy) -> wire.AuditRequest:
    """What the gatherer needs: the layout of the tree and which tensors to read."""
    pin = series.upstream
    return wire.AuditRequest(git_prefix=pin.git_prefix, package=pin.name,
                             tensors=list(pol.patterns))


@dataclasses.dataclass(frozen=True)
class Gathered:
    """One host's part of an audit: its facts and, with --probe, its probe records. The
    checks run on every host's together (evaluate_gathered): pd-consistency pairs servers
    across hosts and a waiver is unused only when no host used it."""

    facts: HostFacts
    probes: list[ProbeResult] | None = None


def collect(series: Series, transports: list[Transport], pol: policy_mod.Policy) -> list[HostFacts]:
    return [g.facts for g in _collect(series, transports, pol, None)]


def _collect(series: Series, transports: list[Transport], pol: policy_mod.Policy,
             probes: HostProbes | None, forks: int = DEFAULT_FORKS) -> list[Gathered]:
    """Facts of every host in parallel (`forks` at once); each host's probes run right
    after its facts (they need them to find its endpoint), so a slow probe never holds up
    another host."""
    request = gather_request(series, pol)
    return on_hosts(transports, lambda t: gather(t, request, probes), forks)


def gather(transport: Transport, request: wire.AuditRequest, probes: HostProbes | None = None) -> Gathered:
    """One host's facts (one round trip), then its probes. An unreachable host or an
    agent that gave no result is a record, not an exception (the report says so)."""
    try:
        result = transport.call(request)
    except Unreachable as exc:
        return Gathered(HostFacts(host=transport.host, reachable=False, error=str(exc)))
    except TargetError as exc:             # the agent gave no result
        return Gathered(HostFacts(host=transport.host, reachable=True, error=str(exc)))
    assert isinstance(result, (wire.AuditResult, wire.Failure))    # decoded as the op's
    facts = hostfacts.build(transport.host, result)
    return Gathered(facts, probe_host(facts, probes) if probes else None)


def probe_host(facts: HostFacts, plan: HostProbes) -> list[ProbeResult] | None:
    """The plan's probes against this host's endpoint; none for a host whose facts could
    not be gathered (that is already the finding, and its server is likely down too)."""
    if not facts.reachable or facts.error:
        return None
    try:
        endpoint = plan.endpoint(facts.host, listen_at(facts))
    except PatchsetError as exc:
        return plan.not_run(facts.host, f"no endpoint to probe: {exc}")
    if endpoint is None:
        return plan.not_run(facts.host, "no endpoint to probe: the inventory gives "
                            f"{facts.host} no router or decode port and no SGLang server "
                            "runs there")
    return plan.run(facts.host, endpoint)


def listen_at(facts: HostFacts) -> tuple[str, int] | None:
    """(address, port) where a client's request enters the host (rank.entry_url: a server
    without P/D, else the prefill, else the decode), as the host itself dials it: the
    gatherer saw the server's bind address there, so a server on the host's loopback is
    127.0.0.1 and is reached through the host's SSH connection."""
    found = entry_url(facts)
    if found is None:
        return None
    parts = urlsplit(found[1])
    try:
        port = parts.port
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname and port else None


def probe_findings(host: str, results: list[ProbeResult]) -> list[Finding]:
    """One finding per probe, so a failed probe counts like a failing check (summary, exit
    code, every renderer); its evidence is the probe's whole record, the same record
    `patchset probe --json` prints. An endpoint that could not be reached is `unknown`:
    the context was not tested (server-health says why the server is down)."""
    out = []
    for r in results:
        status = "pass" if r.ok else "unknown" if r.unreachable or r.inconclusive else "fail"
        out.append(Finding(
            id=f"{PROBE_CHECK}[{r.probe}]", host=host, subject=f"{r.name} {r.url}".strip(),
            expected=r.expected or "a chat completion", found=r.error or r.answer,
            status=status, severity=PROBE_SEVERITY, message=r.reason,
            evidence=(Evidence(PROBE_EVIDENCE, dataclasses.asdict(r), _sent(r), None,
                               r.latency_ms),)))
    return out


def _sent(r: ProbeResult) -> str | None:
    """The request a probe record stands for: `POST URL/PATH` for a direct endpoint,
    `POST PATH to HOST ADDRESS:PORT via ssh` for one reached through the host."""
    if not r.url:
        return None
    path = PROBE_PATHS.get(r.probe, "/v1/chat/completions")
    return f"POST {r.url}{path}" if r.url.startswith(("http://", "https://")) \
        else f"POST {path} to {r.url}"


def probe_records(host: HostReport) -> list[dict]:
    """The probe records of a host (the `probes` list of the report), from its findings."""
    return [dict(ev.value) for f in host.findings if f.id.startswith(PROBE_CHECK + "[")
            for ev in f.evidence if ev.what == PROBE_EVIDENCE]


def evaluate(series: Series, facts: list[HostFacts], symptom: str | None = None,
             access: Access | None = None, pol: policy_mod.Policy | None = None,
             probes: dict[str, list[ProbeResult]] | None = None,
             waivers: waivers_mod.WaiverFile | None = None,
             clock: waivers_mod.Clock | None = None,
             cohorts: tuple[CohortSpec, ...] = ()) -> Report:
    """Everything after gathering: pure, so tests feed it fixture facts (and probe
    results) directly. `cohorts` (cohorts.from_inventory) groups the audited hosts for
    the check cohort-parity, which compares servers across hosts. Probe findings go in before ranking, which reads them; the waivers
    apply after both, before the ranking, the summary and the exit code (`clock` gives
    the day their expiry is judged by)."""
    pol = pol or policy_mod.load()
    if symptom:
        pol.symptom(symptom)              # a bad symptom is bad input, before any work
    hosts = [HostReport(host=f.host, facts=f,
                        states=evaluate_host(series, f) if f.reachable and not f.error else [])
             for f in facts]
    ctx = AuditContext(series, pol, hosts, tuple(cohorts))
    run_all(ctx)
    for h in hosts:
        if probes and h.host in probes:
            h.findings += probe_findings(h.host, probes[h.host])
    report = Report(schema_version=SCHEMA_VERSION, tool_version=__version__,
                    generated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    series={"manifest": series.manifest, "upstream": {
                        "name": series.upstream.name, "version": series.upstream.version},
                        "patches": [p.name for p in series.patches]},
                    hosts=hosts, cohorts=[CohortMember(r.host, r.server, r.role, r.cohort,
                                                       r.digest())
                                          for r in runs(series, hosts, tuple(cohorts))])
    if waivers is not None:
        report.waivers = waivers_mod.apply(hosts, waivers, clock)
    if symptom:
        report.symptom = rank(ctx, symptom, access)
    return report


def audit(series: Series, transports: list[Transport], symptom: str | None = None,
          access: Access | None = None, pol: policy_mod.Policy | None = None,
          probes: HostProbes | None = None,
          waivers: waivers_mod.WaiverFile | None = None,
          cohorts: tuple[CohortSpec, ...] = (), forks: int = DEFAULT_FORKS) -> Report:
    pol = pol or policy_mod.load()
    if symptom:
        pol.symptom(symptom)
    return evaluate_gathered(series, _collect(series, transports, pol, probes, forks), symptom,
                             access, pol, waivers, cohorts=cohorts)


def evaluate_gathered(series: Series, gathered: list[Gathered], symptom: str | None = None,
                      access: Access | None = None, pol: policy_mod.Policy | None = None,
                      waivers: waivers_mod.WaiverFile | None = None,
                      clock: waivers_mod.Clock | None = None,
                      cohorts: tuple[CohortSpec, ...] = ()) -> Report:
    """`evaluate` of hosts gathered apart (`patchset serve` gathers each on its own
    schedule): the same report as one audit of all of them."""
    runs = {g.facts.host: g.probes for g in gathered if g.probes is not None}
    return evaluate(series, [g.facts for g in gathered], symptom, access, pol, runs,
                    waivers, clock, cohorts)


def exit_code(report: Report) -> int:
    """UNREACHABLE if a host was unreachable, else FINDINGS if a host's facts could not be
    gathered or a check did not pass (fail, warn or unknown; `info` findings are notes and
    a `waived` finding is accepted: neither counts), else OK."""
    hosts = [Exit.UNREACHABLE if not h.facts.reachable else Exit.FINDINGS if h.facts.error
             else Exit.OK for h in report.hosts]
    checks = [Exit.FINDINGS for f in report.findings if counted(f.status, f.severity)]
    return Exit.combine(hosts + checks)
