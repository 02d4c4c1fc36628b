"""Rank suspects for a symptom, with reasons, and the cheapest isolation steps first.

Everything a score is made of is data: the patch's tier, path and gate (patches.yaml),
its effective state in each server and the path that server runs (facts), findings that
name it (checks), and the symptom's weights (auditor/data/symptoms.yaml). No patch name
appears in this module. Steps, cheapest first:
  1 toggle a gate (zero code change; the exact command), or restart a stale unit;
  2 revert one unconditional patch (`patchset revert NAME`), apply a fix;
  3 run the symptom's probe.
A bisect by drift's measurement (`--measured FILE`, auditor/measured.py) goes ahead of the
weights for the symptoms it bears on (symptoms.yaml `measured_by`): patches it measured
above the noise rank first, by contribution (the score breaks ties); patches it cleared
rank after every unmeasured suspect and leave the next steps.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from patchset.series.model import Patch

from .checks.base import AuditContext
from .facttable import Context, role
from patchset.agent.lib.staleness import served_paths

from .model import (
    HOW_UNDECIDED,
    Finding,
    HostFacts,
    HostReport,
    Measured,
    MeasuredContribution,
    NextStep,
    PatchState,
    Suspect,
    SymptomReport,
)
from .policy import Symptom

SUSPECT_STATUSES = ("fail", "warn")    # never `waived`: a waived finding implicates nothing


@dataclass
class Access:
    """How a step's command reaches a host: `ssh` argv prefix, or none for localhost;
    and what a suggested `patchset` command needs to find the same files and hosts."""

    ssh: dict[str, list[str]] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)   # host -> address for URLs
    inventory: str | None = None    # --inventory as the audit was given it (None: default)
    series: str | None = None       # --series likewise
    probe_hosts: tuple[str, ...] = ()   # hosts `patchset probe HOST` reaches by name
    measured: tuple[Measured, ...] = ()  # --measured: bisect-by-drift reports of these hosts

    def remote(self, host: str, command: str) -> str:
        prefix = self.ssh.get(host)
        if prefix is None:
            return command
        return shlex.join(prefix) + " " + shlex.quote(command)

    def options(self, series: bool = True) -> str:
        """` --inventory FILE --series FILE`, shell-quoted, for the files the audit was
        given explicitly (a default is found again the same way): appended to a
        suggested command so it acts on the same hosts and series."""
        words = (["--inventory", self.inventory] if self.inventory else []) + (
            ["--series", self.series] if series and self.series else [])
        return " " + shlex.join(words) if words else ""


MEASURED_ABOVE, UNMEASURED, MEASURED_CLEARED = 0, 1, 2     # bands, in rank order


@dataclass
class _Scored:
    """A suspect while it is ranked: its prior score, and what a measurement says."""

    score: float
    kind: str
    name: str
    reasons: list[str]
    steps: list[NextStep]
    hosts: tuple[str, ...] = ()          # a patch: the hosts where it is a suspect
    measured: tuple[MeasuredContribution, ...] = ()
    band: int = UNMEASURED
    lead: float = 0.0                    # band MEASURED_ABOVE: its largest contribution


def rank(ctx: AuditContext, symptom_name: str, access: Access | None = None) -> SymptomReport:
    symptom = ctx.policy.symptom(symptom_name)
    access = access or Access()
    scored: list[_Scored] = []
    for patch in ctx.series.patches:
        item = _patch_suspect(ctx, symptom, patch, access)
        if item:
            scored.append(item)
    scored += _hazard_suspects(ctx, symptom, access)
    scored += _check_suspects(ctx, symptom, access)
    runs = tuple(dataclasses.replace(m, ranks=m.probe in symptom.measured_by)
                 for m in access.measured)
    audited = {h.host for h in ctx.hosts}
    for item in scored:
        _measure(item, [m for m in runs if m.ranks and m.host in audited])
    scored = [s for s in scored if s.score >= ctx.policy.min_score
              or s.band == MEASURED_ABOVE]
    scored.sort(key=lambda s: (s.band, -s.lead, -s.score, s.kind, s.name))
    suspects = tuple(Suspect(rank=i + 1, kind=s.kind, name=s.name, score=round(s.score, 3),
                             reasons=tuple(s.reasons),
                             steps=tuple(sorted(s.steps, key=lambda st: st.cost)),
                             measured=s.measured)
                     for i, s in enumerate(scored))
    bands = {(s.kind, s.name): s.band for s in scored}
    return SymptomReport(symptom.name, symptom.title, suspects,
                         _next_steps(ctx, symptom, suspects, access, bands), runs)


# ---------------------------------------------------------------- measured contributions

def _measure(item: _Scored, runs: list[Measured]) -> None:
    """A patch's contributions in the measurements of its hosts: above the noise on one
    host puts it first; cleared on every host where it is a suspect puts it last. What
    the measurements say goes first in its reasons."""
    if item.kind != "patch":
        return
    found: list[MeasuredContribution] = []
    notes: list[str] = []
    for run in runs:
        c = run.contribution(item.name)
        if c is not None:
            found.append(MeasuredContribution(run.host, run.id, run.source, c.value, c.low,
                                              c.high, c.how,
                                              None if run.recorded else run.threshold,
                                              c.above))
        elif run.host in item.hosts:
            notes.append(f"not measured on {run.host} (bisect {run.id}): it was not among "
                         "that bisect's candidates")
    measured_on = {m.host for m in found}
    if any(m.above for m in found):
        item.band = MEASURED_ABOVE
        item.lead = max(m.value or 0.0 for m in found if m.above)
    elif found and set(item.hosts) <= measured_on and \
            not any(m.how in HOW_UNDECIDED for m in found):
        item.band = MEASURED_CLEARED
    elif any(m.how in HOW_UNDECIDED for m in found):
        notes.append("undecided by a measurement (neither told from the noise nor bounded "
                     "below the tolerance): ranked with the unmeasured suspects")
    elif found:
        notes.append(f"also a suspect on {', '.join(sorted(set(item.hosts) - measured_on))}, "
                     "which no bisect measured: ranked with the unmeasured suspects")
    item.measured = tuple(found)
    item.reasons[:0] = [_measured_why(m, item.band) for m in found] + notes


def _measured_why(m: MeasuredContribution, band: int) -> str:
    where = f"measured on {m.host} (bisect {m.bisect}, {m.source})"
    limit = f"the noise threshold {_g(m.threshold)}" if m.threshold is not None \
        else "the noise"
    interval = f"[{_g(m.low)}, {_g(m.high)}]"
    if m.above:
        return (f"{where}: contribution {_g(m.value)} {interval} ({m.how}), above {limit}: "
                "ranked by it, ahead of the prior weights")
    if m.value is not None:
        said = f"contribution {_g(m.value)} {interval} ({m.how}), not told from {limit}"
    elif m.how in HOW_UNDECIDED:
        said = (f"undecided: at most {_g(m.high)} {interval}, not bounded below the "
                "tolerance and not told from the noise")
    elif m.how == "not-needed":
        said = (f"not needed: the group before it already cleared the drift; at most "
                f"{_g(m.high)} {interval}")
    else:
        said = (f"cleared with its group (the group's A/B drift was bounded, at most "
                f"{_g(m.high)} {interval})")
    after = ": ranked after every unmeasured suspect" if band == MEASURED_CLEARED else ""
    return f"{where}: {said}{after}"


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


# ---------------------------------------------------------------- patches

def _served(ctx: AuditContext, host: HostReport, state: PatchState) -> tuple[str, ...]:
    server = host.facts.server(state.server) if state.server else None
    if server is None:
        return ("prefill", "decode")
    r = role(ctx.context(host, server))
    return served_paths(r.value) if r.known else served_paths(None)


def _patch_suspect(ctx: AuditContext, symptom: Symptom, patch: Patch, access: Access):
    tier = symptom.tier.get(patch.tier, 0.0)
    patch_paths = ("prefill", "decode") if patch.path == "both" else (patch.path,)
    best, best_why = 0.0, ""
    hits: list[tuple[HostReport, PatchState, float]] = []
    for host in ctx.hosts:
        for st in host.states:
            if st.patch != patch.name:
                continue
            served = [p for p in patch_paths if p in _served(ctx, host, st)]
            w_path = max((symptom.paths.get(p, 0.0) for p in served), default=0.0)
            w_state = symptom.states.get(st.state, 0.0)
            seen = st.evidence == "observed" and bool(st.ran)
            score = tier * w_path * w_state * (ctx.policy.observed if seen else 1.0)
            if score <= 0:
                continue
            hits.append((host, st, w_path))
            if score > best:
                where = f"{host.host}/{st.server}" if st.server else host.host
                best = score
                best_why = (f"{st.state}{' (unverified)' if st.state == 'unknown' else ''}"
                            f"{' (observed: it ran)' if seen else ''} "
                            f"in {where}, which runs {'/'.join(served)} "
                            f"(symptom weight {w_path:g}): {st.reason}")
    if best <= 0:
        return None
    reasons = [f"tier {patch.tier} (weight {tier:g}), path {patch.path}", best_why]
    reasons.append(f"gated by {patch.gate.env}={patch.gate.on}: A/B it without a code change"
                   if patch.gate else "unconditional: no gate to A/B; revert it to isolate")
    implicated = [f for h in ctx.hosts for f in h.findings
                  if patch.name in f.patches and f.status in SUSPECT_STATUSES
                  and f.id not in ctx.policy.not_implicating]
    if implicated:
        best *= ctx.policy.implicated
        reasons += [f"{f.id}: {f.message or f.found}" for f in implicated[:3]]
    return _Scored(best, "patch", patch.name, reasons,
                   _patch_steps(ctx, symptom, patch, hits, access),
                   hosts=tuple(sorted({h.host for h, _, _ in hits})))


def _patch_steps(ctx: AuditContext, symptom: Symptom, patch: Patch,
                 hits: list[tuple[HostReport, PatchState, float]],
                 access: Access) -> list[NextStep]:
    steps: list[NextStep] = []
    restart: dict[str, list[str]] = {}
    for host, st, _ in hits:
        server = host.facts.server(st.server) if st.server else None
        unit = server.unit if server else None
        if unit:
            restart.setdefault(host.host, []).append(unit)
        if patch.gate and unit and st.state in ("active", "gated-off"):
            turn_on = st.state == "gated-off"
            steps.append(NextStep(1, "toggle-gate",
                                  f"{'set' if turn_on else 'unset'} {patch.gate.env} in {unit} on "
                                  f"{host.host} ({'on' if turn_on else 'upstream code'}), restart",
                                  access.remote(host.host, _toggle(host, unit, patch, turn_on)),
                                  "zero code change: the same tree, the patch's kernel "
                                  + ("enabled" if turn_on else "replaced by upstream's")))
        elif st.state == "not-applied":
            steps.append(_add_step(ctx, host, patch.name, 2, "apply",
                                   f"add {patch.name} to {host.host}'s selection",
                                   "plan shows the change; apply with the same selection",
                                   access, [unit] if unit else []))
        elif st.state == "inert":
            steps.append(NextStep(2, "fix", f"make {patch.name} reach its code path on "
                                  f"{host.host}", "", st.reason))
    if not patch.gate:
        for host_name, units in sorted(restart.items()):
            revert = (f"patchset revert {patch.name} --host {shlex.quote(host_name)}"
                      + access.options())
            units = sorted(set(units))
            then = access.remote(host_name, "systemctl restart " + " ".join(units))
            if symptom.states.get("active", 0) > 0:
                steps.append(NextStep(2, "revert", f"revert {patch.name} on {host_name}, "
                                      f"restart {', '.join(units)}", f"{revert} && {then}",
                                      "takes one unconditional patch out, exactly; "
                                      "`patchset apply` puts it back"))
    return _dedupe(steps)


def _toggle(host: HostReport, unit_name: str, patch: Patch, on: bool) -> str:
    gate = patch.gate
    assert gate is not None
    unit = host.facts.units.get(unit_name)
    files = [p for p, _ in (unit.show.value.get("environment_files") or [])] \
        if unit and unit.show.known else []
    holding = [p for p in files if unit and unit.env_files.get(p) and
               unit.env_files[p].known and gate.env in unit.env_files[p].value["values"]]
    target = (holding or files or [f"/etc/sglang/{unit_name.split('.')[0]}.env"])[-1]
    q = shlex.quote
    edit = f"sed -i {q('/^' + gate.env + '=/d')} {q(target)}"
    if on:
        edit += f" && echo {q(gate.env + '=' + gate.on)} >> {q(target)}"
    return f"{edit} && systemctl restart {q(unit_name)}"


def _add_step(ctx: AuditContext, host: HostReport, name: str, cost: int, kind: str,
              title: str, why: str, access: Access, units: list[str]) -> NextStep:
    """The step that adds `name` to the host's selection: `plan --only` with the selection
    `plan` itself resolves (the applied patches and `name`, each once, dependencies in,
    series order), so the suggestion is a command that runs. A patch the tree already has
    is never suggested again: the servers that did not load it are restarted instead."""
    applied = _applied(host)
    if name in applied:
        restart = " ".join(shlex.quote(u) for u in sorted(set(units)))
        return NextStep(1, "restart", f"{name} is applied on {host.host} but not loaded: "
                        f"restart {', '.join(sorted(set(units))) or 'its servers'}",
                        access.remote(host.host, f"systemctl restart {restart}")
                        if restart else "", "the tree has it; the running servers do not")
    command = suggested_plan(ctx.series, applied + [name], host.host)
    return NextStep(cost, kind, title, command + access.options() if command else "",
                    why if command else f"{why}; no selection takes {name} with the "
                    f"patches applied on {host.host} (`patchset plan` says why)".lstrip("; "))


def suggested_plan(series, names: list[str], host: str) -> str:
    """`patchset plan --only NAMES HOST` for the selection `plan` makes of `names` (names
    the series no longer has left out), or "" when `plan` would refuse it."""
    from patchset.errors import PatchsetError
    from patchset.series.selection import Selection, plan
    known = series.by_name()
    wanted = tuple(dict.fromkeys(n for n in names if n in known))
    try:
        chosen = plan(series, Selection(only=wanted)).names
    except PatchsetError:
        return ""
    return f"patchset plan --only {','.join(chosen)} {shlex.quote(host)}"


def _units(host: HostReport, servers: set[str]) -> list[str]:
    """The units of the host's servers named in `servers`."""
    found = (host.facts.server(s) for s in servers)
    return sorted({srv.unit for srv in found if srv is not None and srv.unit})


def _applied(host: HostReport) -> list[str]:
    tree = host.facts.tree
    if not tree.known:
        return []
    return [a["name"] for a in tree.value.get("applied") or []]


# ---------------------------------------------------------------- hazards and checks

def _hazard_suspects(ctx: AuditContext, symptom: Symptom, access: Access):
    if symptom.hazard <= 0:
        return []
    out = []
    for hz in ctx.policy.hazards:
        fired = [f for h in ctx.hosts for f in h.findings
                 if f.id == f"hazard[{hz.id}]" and f.status == "fail"]
        if not fired:
            continue
        paths = ("prefill", "decode") if hz.path == "both" else (hz.path,)
        w_path = max(symptom.paths.get(p, 0.0) for p in paths)
        score = ctx.policy.severity_weight.get(hz.severity, 0.0) * symptom.hazard * w_path
        where = sorted({f"{f.host}/{f.subject.split(':')[0]}" for f in fired})
        reasons = [f"upstream hazard, severity {hz.severity}, path {hz.path}",
                   f"live in {', '.join(where)}", hz.why]
        steps = []
        for m in hz.mitigations:
            command = ""
            fix = [p for p in hz.fixed_by if p in ctx.series.by_name()]
            if m.kind == "fix" and fix and fix[0] in m.title:
                host = next(h for h in ctx.hosts if h.host == fired[0].host)
                units = _units(host, {f.subject.split(":")[0] for f in fired
                                      if f.host == host.host})
                steps.append(_add_step(ctx, host, fix[0], m.cost, m.kind, m.title, "",
                                       access, units))
                continue
            steps.append(NextStep(m.cost, m.kind, m.title, command))
        out.append(_Scored(score, "hazard", hz.id, reasons, steps))
    return out


def _check_suspects(ctx: AuditContext, symptom: Symptom, access: Access):
    groups: dict[tuple[str, str], list[Finding]] = {}
    for host in ctx.hosts:
        for f in host.findings:
            base = f.id.split("[")[0]
            if base in symptom.checks and f.status in SUSPECT_STATUSES:
                groups.setdefault((base, host.host), []).append(f)
    out = []
    for (base, host_name), findings in sorted(groups.items()):
        weight = symptom.checks[base]
        score = weight * max(ctx.policy.severity_weight.get(f.severity, 0.0) for f in findings)
        reasons = [f"{f.subject}: {f.message or f'expected {f.expected}, found {f.found}'}"
                   for f in findings[:4]]
        steps = _remedies(ctx, base, host_name, findings, access)
        out.append(_Scored(score, "check", f"{base} on {host_name}", reasons, steps))
    return out


def _remedies(ctx: AuditContext, check_id: str, host_name: str, findings: list[Finding],
              access: Access) -> list[NextStep]:
    spec = ctx.policy.remedies.get(check_id)
    if not spec:
        return []
    units = sorted({f.subject.split(" ")[0] for f in findings
                    if f.subject.split(" ")[0].endswith(".service")}) or [""]
    steps = []
    for unit in units:
        values = {"unit": shlex.quote(unit) if unit else "UNIT", "host": shlex.quote(host_name),
                  "options": access.options()}
        title = spec["title"].format(unit=unit or "the unit", host=host_name)
        if spec.get("remote"):
            command = access.remote(host_name, spec["remote"].format(**values))
        else:
            command = (spec.get("local") or "").format(**values)
        steps.append(NextStep(int(spec.get("cost", 2)), spec.get("kind", "fix"), title,
                              command))
    return _dedupe(steps)


# ---------------------------------------------------------------- next steps

def _next_steps(ctx: AuditContext, symptom: Symptom, suspects: tuple[Suspect, ...],
                access: Access, bands: dict[tuple[str, str], int]) -> tuple[NextStep, ...]:
    """The leading suspects' steps (score >= next_steps_fraction of the top score, or
    measured above the noise), cheapest first, then measured before unmeasured, then by
    score; a suspect the measurement cleared has no step here."""
    probed = _probe_findings(ctx, symptom)
    reproduced = [f for f in probed if f.status == "fail"]
    if not suspects and not reproduced:
        return ()
    live = [(bands.get((s.kind, s.name), UNMEASURED), s) for s in suspects]
    live = [(band, s) for band, s in live if band != MEASURED_CLEARED]
    floor = max((s.score for _, s in live), default=0.0) * ctx.policy.next_steps_fraction
    ordered = sorted(((step.cost, band, -s.score, s.rank, step) for band, s in live
                      if s.score >= floor or band == MEASURED_ABOVE for step in s.steps),
                     key=lambda t: t[:4])
    steps = _dedupe([t[4] for t in ordered])
    if symptom.probe:
        host, url = _probed(reproduced or probed) or ("", "")
        if host not in access.probe_hosts and not url.startswith(("http://", "https://")):
            host, url = _probe_url(ctx, access)
        target = (shlex.quote(host) + access.options(series=False)
                  if host in access.probe_hosts else f"--url {shlex.quote(url)}")
        command = symptom.probe.get("command", "").format(url=shlex.quote(url), target=target)
        steps.append(NextStep(3, "probe", symptom.probe.get("title", "probe"), command,
                              _probe_why(probed, reproduced)))
    return tuple(steps)


def _probe_findings(ctx: AuditContext, symptom: Symptom) -> list[Finding]:
    """Findings of the audit's own probes that bear on the symptom (`probe.reproduced_by`
    in symptoms.yaml); a failed one reproduced it."""
    ids = symptom.probe.get("reproduced_by") or ()
    return [f for h in ctx.hosts for f in h.findings if f.id in ids]


def _probed(findings: list[Finding]) -> tuple[str, str] | None:
    """(host, endpoint) the audit's probes were sent to, so the probe step repeats them
    (the endpoint is a URL, or what an endpoint reached through SSH describes itself as)."""
    return next(((f.host, str(ev.value["url"])) for f in findings for ev in f.evidence
                 if isinstance(ev.value, dict) and ev.value.get("url")), None)


def _probe_why(probed: list[Finding], reproduced: list[Finding]) -> str:
    """Whether this audit's probes already reproduced the symptom, so the probe step says
    so: a failing probe is evidence that corroborates the suspects, not a suspect."""
    compare = "run before and after each step above and compare"
    if reproduced:
        shown = "; ".join(f"{f.subject} on {f.host}: {f.message}" for f in reproduced[:3])
        more = f" (and {len(reproduced) - 3} more)" if len(reproduced) > 3 else ""
        return f"reproduced by this audit's probes: {shown}{more}; {compare}"
    if probed and all(f.status == "pass" for f in probed):
        return f"not reproduced: this audit's {len(probed)} probe(s) passed; {compare}"
    return compare


def _probe_url(ctx: AuditContext, access: Access) -> tuple[str, str]:
    """(host, URL) where a client's request enters, over all hosts (the first host's,
    on a tie)."""
    found = [(url[0], host.host, url[1]) for host in ctx.hosts
             if (url := entry_url(host.facts, access.addresses.get(host.host)))]
    best = min(found, key=lambda t: t[0]) if found else (0, "", "http://HOST:PORT")
    return best[1], best[2]


def entry_url(facts: HostFacts, address: str | None = None) -> tuple[int, str] | None:
    """(preference, URL) where a client's request enters this host: a server without P/D,
    else the prefill server, else the decode server (the gatherer saw it on the host's
    loopback; from here it is the host's `address`). `patchset audit --probe` sends its
    probes here when the inventory names no router or decode port."""
    order = {"null": 0, "prefill": 1, "decode": 2}
    best: tuple[int, str] | None = None
    for server in facts.sglang_servers:
        key = order.get(str(role(Context(facts, server)).value), 9)
        url = server.base_url or ""
        if address and url:
            url = url.replace("127.0.0.1", address, 1)
        if url and (best is None or key < best[0]):
            best = (key, url)
    return best


def _dedupe(steps: list[NextStep]) -> list[NextStep]:
    seen: set[tuple[str, str]] = set()
    out = []
    for step in steps:
        key = (step.kind, step.command or step.title)
        if key not in seen:
            seen.add(key)
            out.append(step)
    return out
