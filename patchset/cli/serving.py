"""The serving commands: deploy (systemd units), and the unit side of apply/status."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import BisectPending, Exit
from .app import (AcceptNewOpt, HealthTimeoutOpt, InventoryOpt, JsonOpt, LockWaitOpt, SeriesOpt,
                  TargetOpt, app, emit_json, esc, load, resolver_for, result_line, say, summary, term)



# ---------------------------------------------------------------- deploy (systemd units)

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
    from deploy.deploy import channel_for, deploy as run_deploy
    from ..selection import parse_names
    s = load(series)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        spec = resolver.inventory.resolve(host)
        transport = resolver.transport(host, provision_local=False)
        with DeployView(spec.name) as view:
            def run_once():
                return run_deploy(spec, channel_for(transport), str(transport.target),
                                  roles=list(parse_names(role)) or None, dry_run=dry_run,
                                  timeout=health_timeout, lock_wait=lock_wait,
                                  on_event=view.event, git_prefix=s.upstream.git_prefix,
                                  package=s.upstream.name,
                                  source=resolver.inventory.path or "hosts.yaml")
            try:
                result = run_once()
            except BisectPending as exc:
                from .bisect import finish_abandoned
                if not finish_abandoned(s, resolver, host, exc.record):
                    raise
                result = run_once()
    if as_json:
        emit_json([result.to_json()])
    _render_deploy(result, as_json)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


class DeployView:
    """Deploy progress on stderr: a rich bar per /health wait on a TTY, plain lines when
    piped (the first wait, then one line every PLAIN_EVERY seconds, then the outcome)."""

    PLAIN_EVERY = 30.0

    def __init__(self, host: str | None = None) -> None:
        self.tty = sys.stderr.isatty()
        self.host = host               # prefixes every line (several hosts in a row)
        self.bar = None
        self.task = None
        self.printed: dict[tuple, float] = {}

    def __enter__(self) -> "DeployView":
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def event(self, ev: dict) -> None:
        kind, role = ev.get("event"), ev.get("role", "")
        rollback = " (rollback)" if ev.get("phase") == "rollback" else ""
        if kind == "step":
            self._line(str(ev.get("message")))
        elif kind == "restart":
            self._stop()
            self.printed.clear()
            self._line(f"{role}: restarting {ev.get('unit')} ({ev.get('reason')})")
        elif kind == "healthy":
            self._stop()
            self._line(f"{role}: healthy after {float(ev.get('elapsed', 0)):.1f}s{rollback}")
        elif kind == "wait":
            self._wait(ev, role, rollback)

    def _wait(self, ev: dict, role: str, rollback: str) -> None:
        elapsed, timeout = float(ev.get("elapsed", 0)), float(ev.get("timeout", 0))
        what = (f"{self.host}: " if self.host else "") + (
            f"{role}: waiting for /health{rollback} ({ev.get('detail')})")
        if self.tty:
            if self.bar is None:
                from rich.progress import (BarColumn, Progress, SpinnerColumn, TextColumn,
                                           TimeElapsedColumn)
                self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                    BarColumn(), TextColumn("{task.completed:.0f}/"
                                                            "{task.total:.0f}s"),
                                    TimeElapsedColumn(), console=term(stderr=True),
                                    transient=True)
                self.bar.start()
                self.task = self.bar.add_task(what, total=timeout)
            self.bar.update(self.task, completed=min(elapsed, timeout), description=what)
            return
        key = (role, ev.get("phase"))
        last = self.printed.get(key)
        if last is None:
            self._line(f"{role}: waiting for {ev.get('url')}{rollback} (timeout {timeout:.0f}s)")
            self.printed[key] = elapsed
        elif elapsed - last >= self.PLAIN_EVERY:
            self._line(f"{role}: still waiting after {elapsed:.0f}s ({ev.get('detail')})")
            self.printed[key] = elapsed

    def _line(self, text: str) -> None:
        text = f"{self.host}: {text}" if self.host else text
        if self.bar is not None:
            self.bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def _stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar, self.task = None, None


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


def finish_with_restarts(results, restarts, as_json: bool) -> None:
    if as_json:
        emit_json([dict(asdict(r), restart=x.to_json() if x else None)
                    for r, x in zip(results, restarts)])
    codes = set()
    for r, x in zip(results, restarts):
        say(result_line(r, "apply"))
        if r.details and not as_json:
            say(r.details)
        codes.add(r.exit_code)
        if x is None:
            continue
        codes.add(x.exit_code)
        if x.ok and not x.roles:
            say(f"{r.host}: restart: nothing to restart ({'; '.join(x.notes)})")
        elif x.ok:
            done = ", ".join(f"{p.role} {'restarted' if 'restarted' in p.actions else 'unchanged'}"
                             for p in x.roles)
            say(f"{r.host}: restart: {done}")
        else:
            say(f"{r.host}: restart FAILED: {x.error}")
            if x.details and not as_json:
                say(x.details)
    if len(results) > 1:
        say(summary(results))
    code = Exit.combine(codes)
    if code:
        raise typer.Exit(code)


def stale_units(st: dict) -> list[dict]:
    return [u for u in st.get("units") or [] if u.get("stale")]


def render_units(console, st: dict) -> None:
    """The units that serve this tree (prefill, decode order); stale ones say how to fix."""
    order = {"prefill": 0, "decode": 1}
    for u in sorted(st.get("units") or [], key=lambda u: (order.get(u.get("role"), 9),
                                                          u["unit"])):
        state = f"{u.get('active')}/{u.get('sub')}"
        pid = f", pid {u['main_pid']}, started {u['started']}" if u.get("main_pid") else ""
        console.print(f"  unit {u['unit']} ({u['role']}): {state}{pid}", markup=False)
        if u.get("stale"):
            console.print(f"  [red]STALE[/red]: {esc(u['unit'])} started before the tree "
                          f"changed ({esc(u['tree_changed'])}) and runs other patches than "
                          f"its role now has; run `patchset apply --restart` or `patchset "
                          f"deploy {esc(st['host'])} --role {esc(u['role'])}`")
        if u.get("need_daemon_reload"):
            console.print(f"  [yellow]{esc(u['unit'])} changed on disk since systemd loaded it "
                          "(daemon-reload pending)[/yellow]")


def restart_after_apply(series, resolver, specs, transports, results, timeout, lock_wait):
    """apply --restart: redeploy the roles the apply changed, with progress here."""
    from deploy.deploy import restart_after_apply as restart
    with DeployView() as view:
        return restart(series, resolver.inventory, specs, transports, results, timeout,
                       lock_wait, on_event=view.event,
                       on_host=lambda name: setattr(view, "host", name))
