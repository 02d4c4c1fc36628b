"""`patchset rollout`: one change through hosts in steps (a canary, then batches), gated
after each step on health, the audit, throughput and the drift A/B; a failing gate rolls
the changed hosts back (the library: isolate/rollout/rollout.py, its gates isolate/rollout/rolloutgates.py)."""

# No `from __future__ import annotations` in a command module (cli/__init__.py says why).

import os
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import UsageError
from .app import app, load, resolver_for, selection
from .options import (AcceptNewOpt, ApiKeyEnvOpt, ConfidenceOpt, ExcludeOpt, HealthTimeoutOpt,
                      InventoryOpt, JsonOpt, OnlyOpt, OutputTokensOpt, PathOpt, ProbeTimeoutOpt,
                      RepeatsOpt, SeriesOpt, SigmasOpt, TierOpt, ToleranceOpt, within)
from .render import DeployView, emit_json, say, term


# What --resume may be given: the rest is the logged plan's (a resumed rollout changes
# and gates as it started), so an option beside --resume would be silently ignored.
WITH_RESUME = {"resume", "log", "inventory", "accept_new", "as_json", "series"}
GIVEN = ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


@app.command()
def rollout(ctx: typer.Context, hosts: Optional[List[str]] = typer.Argument(None, help="inventory hosts, in "
                                                        "order [default: every host of the "
                                                        "inventory]"),
            tier: Optional[str] = TierOpt, path: Optional[str] = PathOpt,
            only: Optional[List[str]] = OnlyOpt, exclude: Optional[List[str]] = ExcludeOpt,
            revert: Optional[List[str]] = typer.Option(None, "--revert", help="the change: "
                                                       "take these patches (and their "
                                                       "dependents) out (A,B or repeated)"),
            gate_off: Optional[List[str]] = typer.Option(None, "--gate-off", help="the "
                                                         "change: run these applied patches "
                                                         "with their gate unset"),
            cohort: Optional[str] = typer.Option(None, "--cohort", help="the change goes "
                                                 "through this cohort's hosts (hosts.yaml "
                                                 "`cohort:`) instead of HOSTS"),
            canary: Optional[str] = typer.Option(None, "--canary", help="HOST or HOST:ROLE "
                                                 "changed first [default: the first host]"),
            batch: int = typer.Option(1, "--batch", min=1, help="hosts a step after the "
                                      "canary"),
            baseline: Optional[Path] = typer.Option(None, "--baseline", help="a saved drift "
                                                    "run (`patchset probe --kind drift "
                                                    "--save`): the drift gate replays it"),
            on_unknown: str = typer.Option("stop", "--on-unknown", help="stop | continue: "
                                           "what a gate that could not decide does"),
            max_drop: float = typer.Option(0.5, "--max-throughput-drop",
                                           callback=within(0.0, 1.0, "a share"),
                                           help="throughput may fall by this share"),
            parallel: int = typer.Option(4, "--load", min=1, max=64, help="concurrent "
                                         "requests of the throughput gate's short load"),
            output_tokens: int = OutputTokensOpt, sigmas: float = SigmasOpt,
            tolerance: float = ToleranceOpt, confidence: float = ConfidenceOpt,
            repeats: int = RepeatsOpt("the baseline's tokens"),
            resume: bool = typer.Option(False, "--resume", help="continue the last "
                                        "unfinished rollout (or --log's) after its last "
                                        "finished step"),
            log: Optional[Path] = typer.Option(None, "--log", help="the log to resume "
                                               "[default: the newest unfinished under "
                                               "$XDG_STATE_HOME/patchset/rollout]"),
            dry_run: bool = typer.Option(False, "--dry-run", help="print the plan; change "
                                         "nothing"),
            api_key_env: Optional[str] = ApiKeyEnvOpt, probe_timeout: float = ProbeTimeoutOpt,
            health_timeout: Optional[float] = HealthTimeoutOpt,
            inventory: Optional[Path] = InventoryOpt, accept_new: bool = AcceptNewOpt,
            as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Roll one change (a selection, --revert or --gate-off) through hosts: a canary, then
    batches; after each step the gates (health, audit, throughput, drift A/B against
    --baseline) must pass, else every changed host is rolled back and the rollout stops.
    Exit 0 every step passed; 1 a gate stopped it (rolled back); 2 bad input (nothing
    changed); 4 the rollback failed (`--resume` retries it) or another process drives the
    rollout; 5 every step done but some gate could not decide (--on-unknown continue)."""
    from patchset.isolate.rollout import rollout as ro
    _refuse_misplaced(ctx, resume, dry_run)
    if on_unknown not in ("stop", "continue"):
        raise UsageError(f"--on-unknown {on_unknown!r}: stop or continue")
    s = load(series)
    with resolver_for(s, inventory, None, accept_new) as resolver:
        with DeployView("rollout") as view:
            def fleet_for(names, settings):
                _in_inventory(resolver.inventory, names)
                return _watched(_fleet(s, resolver, names, settings, on_unknown), view)
            if resume:
                run = ro.resume(fleet_for, _log_to_resume(log, ro), s, say)
            else:
                settings = _settings(ro, baseline, max_drop, parallel, api_key_env,
                                     health_timeout, output_tokens, repeats, probe_timeout,
                                     sigmas, tolerance, confidence)
                change = _change(s, tier, path, only, exclude, revert, gate_off)
                names = _hosts(resolver.inventory, hosts, cohort)
                hosts_of = {n: resolver.inventory.resolve(n) for n in names}
                steps = ro.make_plan(names, canary, batch,
                                     lambda n: [r for r in ("prefill", "decode")
                                                if r in hosts_of[n].roles])
                fleet = None if dry_run else fleet_for(names, settings)
                run = ro.start(fleet, change, steps, ro.state_dir(), dry_run, say, settings)
    if as_json:
        emit_json(run.to_json())
    else:
        _render(run, ro)
    if run.exit_code:
        raise typer.Exit(run.exit_code)


def _refuse_misplaced(ctx: typer.Context, resume: bool, dry_run: bool) -> None:
    """--resume takes its change, hosts and gate settings from the log: any of them given
    beside it would be silently ignored, so it is refused, named."""
    if resume and dry_run:
        raise UsageError("--resume goes on changing hosts; --dry-run is for a new "
                         "rollout's plan (the log shows a started one's)")
    # by the source's name: typer's click is its own, not the `click` package
    given = [p for p in ctx.command.params if p.name is not None and
             (source := ctx.get_parameter_source(p.name)) is not None and source.name in GIVEN]
    if resume:
        extra = [p for p in given if p.name not in WITH_RESUME]
        if extra:
            raise UsageError(f"--resume: {', '.join(_flag(p) for p in extra)}: the resumed "
                             "rollout's change, hosts and gates are its log's; give only "
                             "--log, --inventory, --series, --accept-new, --json")
    elif any(p.name == "log" for p in given):
        raise UsageError("--log: the log of a rollout to resume: give it with --resume")


def _flag(param) -> str:
    return param.opts[0] if param.param_type_name == "option" else param.name.upper()


def _log_to_resume(log: Optional[Path], ro) -> Path:
    if log is not None:
        return log
    found = ro.latest_unfinished(say=say)
    if found is None:
        raise UsageError(f"--resume: no unfinished rollout under {ro.state_dir()}")
    return found


def _settings(ro, baseline, max_drop, parallel, api_key_env, health_timeout, output_tokens,
              repeats, probe_timeout, sigmas, tolerance, confidence):
    """The gate settings of a new rollout through THE validator a resumed log's go
    through (isolate/rollout/rolloutplan.py), the baseline read and pinned by its sha256 and the
    API key's variable checked: all before any host is contacted, --dry-run included."""
    from patchset.isolate.measure.probe import api_key
    from patchset.isolate.rollout.rolloutgates import load_baseline
    where, sha = None, None
    if baseline is not None:
        where = os.path.abspath(baseline)
        sha = load_baseline(Path(where))[1]
    api_key(api_key_env)
    return ro.Settings.from_json({
        "baseline": where, "baseline_sha256": sha, "max_drop": max_drop,
        "parallel": parallel, "api_key_env": api_key_env, "health_timeout": health_timeout,
        "drift": {"output_tokens": output_tokens, "repeats": repeats,
                  "timeout": probe_timeout, "k": sigmas, "tolerance": tolerance,
                  "confidence": confidence}})


def _in_inventory(inventory, names) -> None:
    """A rollout's hosts are the inventory's (their roles say what to gate)."""
    unknown = [n for n in names if n not in inventory.hosts]
    if unknown:
        raise UsageError(f"{', '.join(unknown)}: not in the inventory "
                         f"({inventory.path or 'hosts.yaml'})")


def _hosts(inventory, hosts: Optional[List[str]], cohort: Optional[str]) -> list[str]:
    """The hosts in order: those named, a cohort's, or every host of the inventory."""
    if cohort is None:
        _in_inventory(inventory, hosts or [])
        return list(hosts or inventory.hosts)
    if hosts:
        raise UsageError("--cohort: give the cohort or HOSTS, not both")
    if cohort not in inventory.cohorts:
        known = ", ".join(sorted(inventory.cohorts)) or "none"
        where = inventory.path or "the inventory"
        raise UsageError(f"--cohort {cohort!r}: no host of {where} names it "
                         f"(cohorts: {known})")
    return list(inventory.cohorts[cohort].hosts)


def _watched(fleet, view):
    for t in fleet.hosts.values():
        t.on_event = view.event
    return fleet


def _fleet(s, resolver, names, settings, on_unknown):
    """The hosts and the real gates, from the gate settings (the options', or those a
    resumed rollout logged, both already validated): the baseline must still be the
    content the rollout started with, the API key's variable set."""
    from dataclasses import asdict

    from patchset.isolate.measure import drift
    from patchset.isolate.search.hoststate import DrivenHost
    from patchset.isolate.measure.probe import api_key
    from patchset.isolate.rollout.rollout import Fleet
    from patchset.isolate.rollout.rolloutgates import FleetGates, load_baseline
    baseline = Path(settings.baseline) if settings.baseline else None
    saved = load_baseline(baseline, settings.baseline_sha256)[0] if baseline else None
    api_key(settings.api_key_env)
    driven = {n: DrivenHost(s, resolver.inventory.resolve(n),
                            resolver.transport(n, provision_local=False),
                            health_timeout=settings.health_timeout) for n in names}
    gates = FleetGates(s, resolver, {n: t.transport for n, t in driven.items()}, saved,
                       baseline, drift.DriftSpec(**asdict(settings.drift)),
                       parallel=settings.parallel, max_drop=settings.max_drop,
                       api_key_env=settings.api_key_env)
    return Fleet(driven, gates, on_unknown)


def _change(s, tier, path, only, exclude, revert, gate_off):
    """The one change of a new rollout, checked by the validator a logged one goes
    through (isolate/rollout/rolloutplan.py Change.check)."""
    from patchset.isolate.rollout.rollout import Change
    from patchset.series.selection import parse_names, plan
    reverted, gated = parse_names(revert, "--revert"), parse_names(gate_off, "--gate-off")
    chosen = selection(tier, path, only, exclude)
    picked = any((tier, path, chosen.only, chosen.exclude))
    if sum((picked, bool(reverted), bool(gated))) != 1:
        raise UsageError("give one change: a selection (--tier/--path/--only/--exclude), "
                         "--revert or --gate-off")
    if picked:
        names = plan(s, chosen).names
        return Change(select=names, label=f"apply {', '.join(names) or 'no patches'}"
                      ).check(s)
    if reverted:
        return Change(revert=reverted, label=f"revert {', '.join(reverted)}").check(s)
    return Change(gate_off=gated, label=f"gate off {', '.join(gated)}").check(s)


def _render(run, ro) -> None:
    console = term()
    for line in ro.describe(run):
        console.print(line, markup=False)
    if run.dry_run:
        console.print("  dry run: nothing changed, no log written", markup=False)
        return
    for g in run.gates:
        console.print(f"  step {g['step']} {g['host']} {g['gate']:<10} {g['verdict']:<7} "
                      f"{g['why']}", markup=False)
    if run.stopped:
        console.print(f"  STOPPED: {run.stopped}", markup=False)
        console.print(f"  rolled back: {', '.join(run.rolled_back) or 'nothing'}",
                      markup=False)
    if run.rollback_error:
        console.print(f"  ROLLBACK FAILED: {run.rollback_error}", markup=False)
    if run.rollback_error:
        console.print(f"  the rollout stays open: `patchset rollout --resume --log "
                      f"{run.log}` retries the rollback", markup=False)
    if run.finished and run.unknown_accepted:
        console.print(f"  {len(run.done)} step(s) done, {run.unknown_accepted} gate(s) "
                      "unknown (accepted by --on-unknown continue): not shown safe",
                      markup=False)
    elif run.finished:
        console.print(f"  every step passed: {len(run.done)} step(s)", markup=False)
    console.print(f"  log: {run.log}", markup=False)
