"""The audit command."""

import sys
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import UsageError
from .app import (app, audit_access, load, load_waivers, output_file, resolver_for,
                  write_output)
from .options import (AcceptNewOpt, ApiKeyEnvOpt, AuditProbeOpt, ForksOpt, InventoryOpt,
                      JsonOpt, NoWaiversOpt, ProbeTimeoutOpt, SeriesOpt, SizesOpt, TargetOpt,
                      WaiversOpt)
from .render import emit_json, esc, host_error, say, term


def _audit(series, transports, symptom, inventory, specs, probes=None, inventory_file=None,
           series_file=None, measured=(), waivers=None, forks=None):
    """One library call (auditor.api.audit) for `audit` and `trace`: the report, its JSON
    form and its exit code. The transports come from the resolver (audit_transport) and
    the `--probe` probes from isolate (audit_probes): the CLI passes both in, so the
    read-only auditor imports neither."""
    from patchset.auditor import api
    from patchset.auditor.cohorts import from_inventory
    from patchset.auditor.report import to_dict
    steps = audit_access(inventory, specs, inventory_file, series_file)
    steps.measured = tuple(measured)          # --measured (auditor/measured.py load_all)
    report = api.audit(series, transports, symptom, steps, probes=probes, waivers=waivers,
                       cohorts=from_inventory(inventory, series),
                       forks=api.DEFAULT_FORKS if forks is None else forks)
    return report, to_dict(report), api.exit_code(report)


def _summary_line(data: dict) -> str:
    c = data["summary"]["checks"]
    down = data["summary"]["unreachable"]
    waived, notes = data["summary"].get("waived"), data["summary"].get("notes")
    return (f"{data['summary']['hosts']} host(s): {c['fail']} failed, {c['warn']} warnings, "
            f"{c['unknown']} unknown, {c['pass']} passed"
            + (f", {waived} waived" if waived else "")
            + (f", unreachable: {', '.join(down)}" if down else "")
            + (f"; {notes} info note(s), not counted" if notes else ""))


# ---------------------------------------------------------------- audit (live facts, checks)

@app.command()
def audit(hosts: List[str] = typer.Argument(..., help="inventory name, user@host[:port] or "
                                            "localhost; several run in parallel"),
          symptom: Optional[str] = typer.Option(None, "--symptom", help="rank suspects for "
                                                "context-loss | decode-quality | throughput"),
          fmt: str = typer.Option("terminal", "--format", help="terminal | md | html | json "
                                  "| junit | prometheus"),
          output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the "
                                                "report to FILE instead of stdout",
                                                callback=output_file),
          probe: Optional[str] = AuditProbeOpt,
          probe_sizes: Optional[str] = SizesOpt("--probe-sizes"),
          api_key_env: Optional[str] = ApiKeyEnvOpt, probe_timeout: float = ProbeTimeoutOpt,
          measured: Optional[List[Path]] = typer.Option(None, "--measured", help="a "
                                                        "`patchset bisect HOST --probe "
                                                        "drift` report of an audited host: "
                                                        "its measured contributions rank "
                                                        "the --symptom's suspects "
                                                        "(repeatable)"),
          waivers: Optional[Path] = WaiversOpt, no_waivers: bool = NoWaiversOpt,
          target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
          accept_new: bool = AcceptNewOpt, forks: int = ForksOpt,
          series: Optional[Path] = SeriesOpt) -> None:
    """Gather live facts (one round trip per host), give every patch its effective state,
    run the checks (and with --probe the fidelity probes of `patchset probe`), apply the
    waivers, rank suspects for a symptom. Exit 0 clean (waived findings aside), 1 findings
    (a failed probe too), 3 unreachable."""
    from patchset.auditor.measured import load_all as load_measured
    from patchset.auditor.render import FORMATS, render
    from patchset.isolate.measure.probe import audit_probes
    s = load(series)
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    runs = load_measured(measured or [], hosts, s, symptom)     # before any host is contacted
    waived = load_waivers(waivers, no_waivers)                  # likewise
    with resolver_for(s, inventory, target, accept_new) as resolver:
        plan = audit_probes(probe, probe_sizes, api_key_env, probe_timeout,
                            resolver.inventory, hosts, resolver.endpoint)
        transports = [resolver.audit_transport(h) for h in hosts]
        report, data, code = _audit(s, transports, symptom, resolver.inventory, hosts, plan,
                                    inventory_file=inventory, series_file=series,
                                    measured=runs, waivers=waived, forks=forks)
    color = fmt == "terminal" and output is None and sys.stdout.isatty()
    text = render(data, fmt, color=color)
    if output is not None:
        write_output(output, text)
        say(f"{_summary_line(data)}; report written to {output}")
    else:
        sys.stdout.write(text)
    if code:
        raise typer.Exit(code)


# ---------------------------------------------------------------- trace (what ran)

@app.command()
def trace(hosts: List[str] = typer.Argument(..., help="inventory name, user@host[:port] or "
                                            "localhost; several run in parallel"),
          target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
          accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
          series: Optional[Path] = SeriesOpt) -> None:
    """Which patched functions ran, per server and process (patchset's tracer, started
    by deploy): per patch the targets that ran (first call) and those that did not. Exit
    0, 1 when what ran contradicts what is declared, 3 unreachable, 5 nothing observed on
    a host (no server there traced: no verdict, never a pass)."""
    from patchset.auditor import traceview
    from patchset.errors import Exit
    s = load(series)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        transports = [resolver.audit_transport(h) for h in hosts]
        report, data, _ = _audit(s, transports, None, resolver.inventory, hosts)
    views = traceview.view(report)
    if as_json:
        emit_json(traceview.to_json(views))
    else:
        _render_trace(report, views)
    down = [h for h in report.hosts if not h.facts.reachable]
    failed = [h for h in report.hosts if h.facts.reachable and h.facts.error]
    unseen = traceview.unobserved(report, views)
    for host in unseen:
        say(f"{host}: nothing observed (no traced server): trace could not judge it")
    code = Exit.combine([Exit.UNREACHABLE] * bool(down) + [Exit.FINDINGS] * bool(
        failed or any(v.contradictions for v in views)) + [Exit.INCONCLUSIVE] * bool(unseen))
    if code:
        raise typer.Exit(code)


def _trace_row(row) -> str:
    """`ran`, `raised X`, `entered` (never returned), `watched` (not called) or
    `unwatched`, then the target, the modes it ran in and its patches."""
    mark = "ran" if row.ran else f"raised {row.raised}" if row.raised else \
        "entered" if row.first is not None else "watched" if row.watched else "unwatched"
    via = f" via {row.via}" if row.via else ""
    modes = f" in {'/'.join(m if m != '-' else 'no forward' for m in row.modes)}" \
        if row.modes else ""
    why = f" ({row.why})" if not row.watched and row.why else ""
    owner = ",".join(p.split(":")[0] for p in row.patches)
    return f"{mark} {row.target}{via}{modes}  [{owner}]{why}"


def _render_trace(report, views) -> None:
    console = term()
    for host in report.hosts:
        if not host.facts.reachable or host.facts.error:
            host_error(host.host, host.facts.error or "unreachable")
    for v in views:
        console.print(f"[bold]{esc(v.host)}[/bold] {esc(v.server)}")
        if not v.traced:
            console.print(f"  not traced: {esc(v.why)}; states are declared only")
        for proc in v.processes:
            ran = sum(r.ran for r in proc.targets)
            forwards = ", ".join(f"{n} {m}" for m, n in proc.forwards.items()) or "none"
            console.print(f"  pid {proc.pid} {proc.title} ({proc.mode}): {ran} of "
                          f"{len(proc.targets)} targets ran; forward passes: {forwards}",
                          markup=False)
            for row in proc.targets:
                console.print(f"    {_trace_row(row)}", markup=False)
            for why in proc.unavailable:
                console.print(f"    [yellow]unavailable: {esc(why)}[/yellow]")
        for p in v.patches:
            if p.observation:
                console.print(f"  {p.patch}: {p.observation}", markup=False)
            if p.contradiction:
                console.print(f"  [red]{esc(p.patch)}: {esc(p.contradiction)}[/red]: "
                              f"{esc(p.reason)}")

