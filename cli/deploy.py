"""`patchset deploy`: render a host's systemd units (gates from its tree), install,
restart, wait (the library: deploy/deploy.py)."""

from pathlib import Path
from typing import List, Optional

import typer

from .app import app, load, resolver_for
from .options import (AcceptNewOpt, HealthTimeoutOpt, InventoryOpt, JsonOpt, LockWaitOpt,
                      SeriesOpt, TargetOpt)
from .render import DeployView, emit_json, say, term


@app.command("deploy")
def deploy_cmd(host: str = typer.Argument(..., help="inventory name (its roles say what to "
                                          "deploy), or localhost"),
               role: Optional[List[str]] = typer.Option(None, "--role", help="prefill | "
                                                        "decode | router (A,B or repeated) "
                                                        "[default: every role of the host]"),
               dry_run: bool = typer.Option(False, "--dry-run", help="show the diff against "
                                            "the installed units and what would restart"),
               health_timeout: Optional[float] = HealthTimeoutOpt,
               target: Optional[Path] = TargetOpt, lock_wait: float = LockWaitOpt,
               inventory: Optional[Path] = InventoryOpt, accept_new: bool = AcceptNewOpt,
               as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Render the host's systemd units (gates from its tree), install, restart, wait."""
    from patchset.deploy.deploy import deploy_units
    from patchset.isolate.search.bisect import run_restoring
    from patchset.series.selection import parse_names
    roles = list(parse_names(role, "--role")) or None      # bad input before any host
    s = load(series)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        spec = resolver.inventory.resolve(host)
        transport = resolver.transport(host, provision_local=False)
        with DeployView(spec.name) as view:
            def run_once():
                return deploy_units(spec, transport, str(transport.target),
                                    roles=roles, dry_run=dry_run,
                                    timeout=health_timeout, lock_wait=lock_wait,
                                    on_event=view.event, git_prefix=s.upstream.git_prefix,
                                    package=s.upstream.name)
            result = run_restoring(s, resolver, host, run_once, say)
    if as_json:
        emit_json([result.to_json()])
    _render_deploy(result, as_json)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _render_deploy(result, as_json: bool = False) -> None:
    """Per-role lines on stderr (the dry-run diff on stdout, unless --json)."""
    if result.dry_run and not as_json:
        out = term()
        for r in result.roles:
            if r.diff:
                out.print(r.diff, markup=False, highlight=False, end="")
        for r in result.roles:
            verb = ("would install and restart" if r.changed else
                    f"would restart ({r.restart})" if r.restart else "unchanged")
            out.print(f"{result.host}: {r.role} {r.unit}: {verb}", markup=False)
    elif not result.dry_run:
        for r in result.roles:
            done = ", ".join(r.actions) or "unchanged"
            if r.actions and "restarted" in r.actions and result.ok:
                done += ", healthy"
            say(f"{result.host}: {r.role} {r.unit}: {done}")
    for r in result.roles:
        for note in r.notes:
            say(f"{result.host}: {r.role}: note: {note}")
    for note in result.notes:
        say(f"{result.host}: note: {note}")
    if result.error:
        say(f"{result.host}: deploy FAILED: {result.error.split(': ', 1)[-1]}")
        if result.details:
            say(result.details)
