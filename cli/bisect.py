"""`patchset bisect`: A/B gates, then revert suspects one at a time, re-probing after each,
until the probe flips; the host always ends as it started (the library: isolate/search/bisect.py,
which also holds the recovery by which the next apply/revert/deploy finishes the restore
of a bisect whose run is gone)."""

from pathlib import Path
from typing import Optional

import typer

from ..errors import Exit
from .app import app, load, output_file, resolver_for
from .options import (AcceptNewOpt, ApiKeyEnvOpt, BudgetOpt, ConfidenceOpt, HealthTimeoutOpt,
                      InventoryOpt, JsonOpt, OutputTokensOpt, ProbeTimeoutOpt, RepeatsOpt,
                      SeriesOpt, SigmasOpt, SizesOpt, TargetOpt, ToleranceOpt, UrlOpt)
from .render import DeployView, emit_json, esc, say, term


@app.command()
def bisect(host: str = typer.Argument(..., help="inventory host whose units serve the tree"),
           probe: str = typer.Option("recall", "--probe", help="recall | needle | all | "
                                     "drift (measured: group testing, fewer restarts)"),
           sizes: Optional[str] = SizesOpt("--sizes"),
           repeats: int = RepeatsOpt("the starting state"),
           output_tokens: int = OutputTokensOpt,
           sigmas: float = SigmasOpt,
           tolerance: float = ToleranceOpt,
           confidence: float = ConfidenceOpt,
           budget: int = BudgetOpt,
           symptom: str = typer.Option("context-loss", "--symptom", help="which ranking "
                                       "orders the suspects"),
           url: Optional[str] = UrlOpt,
           api_key_env: Optional[str] = ApiKeyEnvOpt, probe_timeout: float = ProbeTimeoutOpt,
           restore: bool = typer.Option(False, "--restore", help="only finish the restore of "
                                        "an unfinished bisect on HOST (even one started "
                                        "elsewhere), then stop"),
           output: Optional[Path] = typer.Option(None, "-o", "--output", help="save the "
                                                 "report here [default: $XDG_STATE_HOME/"
                                                 "patchset/bisect/HOST-ID.json]",
                                                 callback=output_file),
           health_timeout: Optional[float] = HealthTimeoutOpt,
           target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
           accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
           series: Optional[Path] = SeriesOpt) -> None:
    """Find the smallest change of the series that makes a failing probe pass. Exit 0 found
    (or nothing to find), 1 no change flips it, 4 stopped or not restored, 5 some
    suspects stay undecided (drift: neither told from the noise nor bounded below the
    tolerance, never cleared; recall/needle: the probe could not judge a state), 130
    Ctrl-C."""
    from patchset.isolate.search import bisect as bisector
    from patchset.isolate.measure.probe import parse_kinds, parse_sizes, parse_url
    s = load(series)
    kinds = parse_kinds(probe, "--probe") if probe != "drift" else ("drift",)
    sizes_checked, url_checked = parse_sizes(sizes), parse_url(url) if url else None
    with resolver_for(s, inventory, target, accept_new) as resolver:
        t = bisector.bisect_host(s, resolver, host, health_timeout)
        if restore:
            bisector.restore_pending(t, say)
            return
        if probe == "drift":
            from patchset.isolate.measure.drift import DriftSpec
            from patchset.isolate.measure.probe import client_for
            plan: bisector.DriftProbe | bisector.BisectProbe = bisector.DriftProbe(
                client_for(host, url_checked, None, api_key_env, resolver=resolver),
                DriftSpec(sizes=sizes_checked, output_tokens=output_tokens, repeats=repeats,
                          timeout=probe_timeout, k=sigmas, tolerance=tolerance,
                          confidence=confidence, budget=budget))
        else:
            from patchset.isolate.measure.probe import direct
            plan = bisector.BisectProbe(kinds=kinds, sizes=sizes_checked,
                                        endpoint=direct(url_checked) if url_checked
                                        else resolver.endpoint(host),
                                        api_key_env=api_key_env, timeout=probe_timeout)
        with DeployView(t.host.name) as view:      # restarts and /health waits, live
            t.on_event = view.event
            report = bisector.bisect(t, plan, symptom, say=say)
    saved = bisector.save(report, output)
    if as_json:
        emit_json(report.to_json())
    else:
        _render(report)
    say(f"report saved to {saved}")
    code = report.exit_code or (Exit.OK if report.culprit or (
        report.steps and report.steps[0].probe_ok) else Exit.FINDINGS)
    if code:
        raise typer.Exit(code)


def _render(report) -> None:
    console = term()
    console.print(f"{report.host}: bisect {report.id}, probe {report.probe} at {report.url}",
                  markup=False)
    for c in report.candidates:
        console.print(f"  suspect #{c.rank} {c.patch} ({c.score:g}): {c.plan}: {c.why}",
                      markup=False)
    for step in report.steps:
        verdict = "-" if step.probe_ok is None else "pass" if step.probe_ok else "FAIL"
        restarted = f", restarted {', '.join(step.restarted)}" if step.restarted else ""
        console.print(f"  step {step.number} {step.action:<8} {verdict:<4} {step.change}"
                      f"{restarted} ({step.seconds:.1f} s)", markup=False)
    for c in report.contributions:
        value = "-" if c["value"] is None else f"{c['value']:.3g}"
        console.print(f"  contribution {c['suspect']}: {value} [{c['low']:.3g}, "
                      f"{c['high']:.3g}] ({c['how']})", markup=False)
    console.print(f"  verdict: {report.verdict}", markup=False)
    console.print(f"  {report.states} test state(s), {report.unit_restarts} unit restarts "
                  "(the restore's included)", markup=False)
    if report.restore_error:
        console.print(f"  [red]NOT restored: {esc(report.restore_error)}[/red]")
    elif report.restored:
        console.print("  host restored to its starting state", markup=False)
