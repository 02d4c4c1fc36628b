"""`patchset bisect`: A/B gates, then revert suspects one at a time, re-probing after each,
until the probe flips; the host always ends as it started. Also the hook by which the
next apply/revert/deploy finishes the restore of a bisect whose run is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import typer

from ..errors import Exit
from .app import (AcceptNewOpt, HealthTimeoutOpt, InventoryOpt, JsonOpt, SecondsOpt, SeriesOpt,
                  TargetOpt,
                  app, emit_json, esc, load, resolver_for, say, term)


@app.command()
def bisect(host: str = typer.Argument(..., help="inventory host whose units serve the tree"),
           probe: str = typer.Option("recall", "--probe", help="recall | needle | all"),
           sizes: Optional[str] = typer.Option(None, "--sizes", help="needle sizes "
                                               "[8k,16k,32k]"),
           symptom: str = typer.Option("context-loss", "--symptom", help="which ranking "
                                       "orders the suspects"),
           url: Optional[str] = typer.Option(None, "--url", help="probe this endpoint "
                                             "[default: the host's router, else decode port]"),
           api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="read the "
                                                     "API key from this environment variable"),
           probe_timeout: float = SecondsOpt(600.0, "--probe-timeout", help="seconds per "
                                               "probe request"),
           restore: bool = typer.Option(False, "--restore", help="only finish the restore of "
                                        "an unfinished bisect on HOST (even one started "
                                        "elsewhere), then stop"),
           output: Optional[Path] = typer.Option(None, "-o", "--output", help="save the "
                                                 "report here [default: $XDG_STATE_HOME/"
                                                 "patchset/bisect/HOST-ID.json]"),
           health_timeout: Optional[float] = HealthTimeoutOpt,
           target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
           accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
           series: Optional[Path] = SeriesOpt) -> None:
    """Find the smallest change of the series that makes a failing probe pass. Exit 0 found
    (or nothing to find), 1 no change flips it, 4 stopped or not restored, 130 Ctrl-C."""
    from auditor import bisector
    from auditor.probe import endpoint, parse_kinds, parse_sizes, parse_url
    s = load(series)
    kinds = parse_kinds(probe, "--probe")
    sizes_checked, url_checked = parse_sizes(sizes), parse_url(url) if url else None
    with resolver_for(s, inventory, target, accept_new) as resolver:
        t = _target(s, resolver, host, health_timeout)
        if restore:
            _restore_only(s, t)
            return
        plan = bisector.ProbePlan(kinds=kinds, sizes=sizes_checked,
                                  url=url_checked or endpoint(host, resolver.inventory.path
                                                              ).rstrip("/"),
                                  api_key_env=api_key_env, timeout=probe_timeout)
        from .serving import DeployView
        with DeployView(t.host.name) as view:      # restarts and /health waits, live
            t.on_event = view.event
            report = bisector.bisect(t, plan, symptom, say=say)
    saved = bisector.save(report, output)
    if as_json:
        emit_json(report.to_json())
    else:
        _render(report)
    say(f"report saved to {saved}")
    code = report.exit_code or (Exit.OK if report.culprit or report.steps[0].probe_ok
                                else Exit.FINDINGS)
    if code:
        raise typer.Exit(code)


def _target(series, resolver, spec: str, health_timeout: float | None = None):
    from auditor.bisector import Target
    from deploy.deploy import channel_for
    host = resolver.inventory.resolve(spec)
    transport = resolver.transport(spec, provision_local=False)
    return Target(series=series, host=host, transport=transport,
                  channel=channel_for(transport), source=resolver.inventory.path or "hosts.yaml",
                  health_timeout=health_timeout)


def _restore_only(series, t) -> None:
    from auditor.bisector import restore_abandoned
    from .. import api
    record = api.status(series, t.transport).get("bisect")
    if not record:
        say(f"{t.host.name}: no unfinished bisect there; nothing to restore")
        return
    restarted = restore_abandoned(t, record, say, force=True)
    say(f"{t.host.name}: restored {', '.join(record.get('starting') or []) or 'no patches'}"
        + (f"; restarted {', '.join(restarted)}" if restarted else ""))


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
    console.print(f"  verdict: {report.verdict}", markup=False)
    if report.restore_error:
        console.print(f"  [red]NOT restored: {esc(report.restore_error)}[/red]")
    elif report.restored:
        console.print("  host restored to its starting state", markup=False)


# ---------------------------------------------------------------- the next command restores

def finish_abandoned(series, resolver, spec: str, record: dict) -> bool:
    """Restore an abandoned bisect on `spec` so the command that found it can go on.
    False (with the reason said) when its run is still alive or was started elsewhere."""
    from auditor.bisector import restore_abandoned
    from ..errors import BisectPending
    t = _target(series, resolver, spec)
    try:
        restore_abandoned(t, record, say)
    except BisectPending as exc:
        say(str(exc))
        return False
    return True


def retry_pending(series, resolver, specs: list[str], results: list[Any],
                  again: Callable[[int], Any]) -> list[Any]:
    """Results refused by an abandoned bisect are retried once its restore is finished."""
    out = list(results)
    for i, result in enumerate(results):
        record = getattr(result, "bisect", None)
        if record and finish_abandoned(series, resolver, specs[i], record):
            out[i] = again(i)
    return out
