"""The `patchset` command: parse options, call one library function, render.

Results go to stdout (a table, or JSON with --json, never both); progress, messages and
errors go to stderr, so `--json | jq` is never polluted. Heavy libraries (git, fabric,
paramiko) are imported only inside the commands that need them.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, List, Optional

import typer

from . import __version__
from .errors import (EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_UNREACHABLE, PatchsetError,
                     UsageError)
from .model import Series

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="A quilt-style patch queue for SGLang: strict series, atomic apply, "
                       "exact revert, status and drift.")

SeriesOpt = typer.Option(None, "--series", help="patches.yaml to use "
                         "[default: ./patches.yaml or $PATCHSET_SERIES]")
TierOpt = typer.Option(None, "--tier", help="safe | moderate | risky (cumulative)")
PathOpt = typer.Option(None, "--path", help="prefill | decode | both")
OnlyOpt = typer.Option(None, "--only", help="only these patches (A,B or repeated)")
ExcludeOpt = typer.Option(None, "--exclude", help="leave these patches out (A,B or repeated)")
JsonOpt = typer.Option(False, "--json", help="machine-readable output on stdout")
TargetOpt = typer.Option(None, "--target", help="tree to manage on localhost "
                         "[default: the provisioned tree under $PATCHSET_HOME]")
LockWaitOpt = typer.Option(0.0, "--lock-wait", help="seconds to wait for another patchset "
                           "run on the same target")
HealthTimeoutOpt = typer.Option(None, "--health-timeout", help="seconds to wait for each "
                                "unit's /health [the role's health_timeout, else its "
                                "TimeoutStartSec]")


# ---------------------------------------------------------------- rendering helpers

def _console(stderr: bool = False):
    """Rich on a terminal; plain, uncoloured and never truncated when piped."""
    from rich.console import Console
    tty = (sys.stderr if stderr else sys.stdout).isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=True,
                   width=None if tty else 1000, no_color=not tty)


def _emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def _say(message: str) -> None:
    _console(stderr=True).print(message, markup=False)


class RichProgress:
    """Progress on a TTY (stderr); one plain line per task when piped."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def task(self, description: str, total: int | None = None):
        from contextlib import contextmanager

        @contextmanager
        def _task():
            if not self.tty:
                print(f"{description} ...", file=sys.stderr, flush=True)
                yield lambda n: None
                return
            from rich.progress import (BarColumn, DownloadColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn)
            columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                       TimeElapsedColumn()]
            with Progress(*columns, console=_console(stderr=True), transient=True) as bar:
                task = bar.add_task(description, total=total)
                yield lambda n: bar.advance(task, n)
        return _task()


# ---------------------------------------------------------------- shared plumbing

def _series(path: Optional[Path]) -> Series:
    from .manifest import load_series
    from .paths import default_series
    return load_series(path or default_series())


def _selection(tier, path, only, exclude):
    from .selection import Selection, parse_names
    return Selection(tier=tier, path=path, only=parse_names(only), exclude=parse_names(exclude))


class Hosts:
    """HOST arguments -> transports, through the inventory; closes connections at the end."""

    def __init__(self, series: Series, inventory: Optional[Path], target: Optional[Path],
                 accept_new: bool = False) -> None:
        from deploy import inventory as inv
        self.series, self.target, self.accept_new = series, target, accept_new
        self.inventory = inv.load(inventory)
        self.opened: list = []

    def default(self) -> str:
        return self.inventory.default or "localhost"

    def transport(self, spec: str, provision_local: bool = True):
        from deploy import inventory as inv
        host = self.inventory.resolve(spec)
        if host.local:
            from deploy.local import LocalTransport
            tree = self.target or (Path(host.tree) if host.tree else None)
            return LocalTransport(tree or _local_default(self.series, provision_local))
        if self.target is not None and not inv.REMOTE_PATH.match(str(self.target)):
            raise UsageError(f"--target {str(self.target)!r}: use an absolute path (or ~/...) "
                             f"of letters, digits and _./+@- on {spec}")
        from deploy.ssh import SshTransport
        from .paths import remote_default_target
        tree = str(self.target) if self.target else host.tree or remote_default_target(
            self.series.upstream)
        transport = SshTransport(host, tree, accept_new=self.accept_new, python=host.python)
        self.opened.append(transport)
        return transport

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        for transport in self.opened:
            transport.close()


def _local_default(series: Series, provision: bool) -> Path:
    from .paths import default_target
    path = default_target(series.upstream)
    if not path.exists() and not provision:
        raise UsageError(f"localhost: no tree at {path} yet; run "
                         "`patchset apply --tier safe localhost` to provision it")
    return _default_local_target(series) if provision else path


def _base_provider(series: Series):
    """Ship the pinned base to a host that has no tree and cannot fetch it itself."""
    def provide():
        from .basebundle import base_bundle
        from .upstream import provision
        base = provision(series.upstream, progress=RichProgress())
        return base.commit, base_bundle(base)
    return provide


def _default_local_target(series: Series) -> Path:
    from .paths import default_target
    path = default_target(series.upstream)
    if not path.exists():
        from .upstream import materialize, provision
        base = provision(series.upstream, progress=RichProgress())
        _say(f"provisioning {series.upstream.name} {series.upstream.version} at {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        materialize(base, path, layout="git")
    return path


# ---------------------------------------------------------------- commands

@app.command("list")
def list_cmd(tier: Optional[str] = TierOpt, path: Optional[str] = PathOpt,
             as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """List the series (filtered by --tier/--path), in series order."""
    from .api import list_patches
    s = _series(series)
    patches = list_patches(s, tier, path)
    if as_json:
        _emit_json([_patch_json(p) for p in patches])
        return
    from rich.table import Table
    table = Table("#", "name", "tier", "path", "gate", "depends", "upstream", "summary")
    order = {p.name: i for i, p in enumerate(s.patches, start=1)}
    for p in patches:
        gate = f"{p.gate.env}={p.gate.on}" if p.gate else "-"
        table.add_row(str(order[p.name]), p.name, p.tier, p.path, gate,
                      ",".join(p.depends) or "-", p.upstream_status, p.summary)
    _console().print(table)


def _patch_json(p) -> dict:
    data = asdict(p)
    data["requires"] = [asdict(r) for r in p.requires]
    return data


@app.command()
def show(name: str, series: Optional[Path] = SeriesOpt,
         as_json: bool = JsonOpt) -> None:
    """Show one patch: metadata, header, files with diffstat, highlighted diff."""
    from .api import show as show_patch
    view = show_patch(_series(series), name)
    if as_json:
        _emit_json({**_patch_json(view.patch), "diff": view.diff})
        return
    _render_show(view)


def _render_show(view) -> None:
    from rich.syntax import Syntax
    console = _console()
    p = view.patch
    console.print(f"[bold]{p.name}[/bold]  tier={p.tier} path={p.path} "
                  f"gate={(p.gate.env + '=' + p.gate.on) if p.gate else 'none'} "
                  f"upstream={p.upstream_status}")
    for key, value in p.header.items():
        console.print(f"{key}: {value}", markup=False)
    for req in p.requires:
        console.print(f"requires {req.fact} {req.op} {req.value!r}  {req.why}", markup=False)
    total_add = sum(c.added for c in p.files)
    total_del = sum(c.removed for c in p.files)
    for c in p.files:
        console.print(f" {c.path} | +{c.added} -{c.removed}", markup=False)
    console.print(f" {len(p.files)} file(s) changed, {total_add} insertions(+), "
                  f"{total_del} deletions(-)")
    console.print(Syntax(view.diff, "diff", theme="ansi_dark", word_wrap=False))


@app.command()
def check(as_json: bool = JsonOpt, exhaustive: bool = typer.Option(
              False, "--exhaustive", help="try every dependency-closed subset"),
          offline: bool = typer.Option(False, "--offline", help="never touch the network"),
          series: Optional[Path] = SeriesOpt) -> None:
    """Validate the manifest and apply every selection on the pinned base (zero fuzz)."""
    from . import api
    from .upstream import provision
    s = _series(series)
    base = provision(s.upstream, progress=RichProgress(), offline=offline)
    report = api.check(s, _blob_reader(base), f"{base.commit} ({base.source})", exhaustive)
    if as_json:
        _emit_json({"ok": report.ok, **asdict(report)})
    else:
        _render_check(report)
    if not report.ok:
        raise typer.Exit(EXIT_FINDINGS)


def _blob_reader(base):
    import subprocess

    def read(path: str) -> bytes | None:
        proc = subprocess.run(["git", "cat-file", "blob", f"{base.commit}:{path}"],
                              cwd=base.repo, capture_output=True)
        return proc.stdout if proc.returncode == 0 else None
    return read


def _render_check(report) -> None:
    console = _console()
    console.print(f"manifest {report.manifest}: valid")
    console.print(f"base {report.base}")
    bad = [p for p in report.preimages if not p.ok]
    console.print(f"pre-images: {len(report.preimages) - len(bad)}/{len(report.preimages)} "
                  "match the pin")
    for p in bad:
        console.print(f"  MISMATCH {p.path}: recorded {p.recorded} found {p.found}", markup=False)
    for sel in report.selections:
        mark = "ok  " if sel.ok else "FAIL"
        console.print(f"  {mark} {','.join(sel.names) or '(empty)'}"
                      f"{'' if sel.ok else ': ' + str(sel.error)}", markup=False)
    console.print("check passed" if report.ok else "check FAILED")


InventoryOpt = typer.Option(None, "--inventory", help="hosts.yaml [default: ./hosts.yaml or "
                            "$PATCHSET_INVENTORY]")
AcceptNewOpt = typer.Option(False, "--accept-new", help="record the key of a host seen for "
                            "the first time (a changed key is always refused)")


@app.command("plan")
def plan_cmd(hosts: Optional[List[str]] = typer.Argument(None, help="hosts to compare with "
                                                         "(a dry-run apply on each)"),
             tier: Optional[str] = TierOpt, path: Optional[str] = PathOpt,
             only: Optional[List[str]] = OnlyOpt, exclude: Optional[List[str]] = ExcludeOpt,
             target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
             accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
             series: Optional[Path] = SeriesOpt) -> None:
    """Show which patches a selection takes and why; with HOST, what apply would change."""
    from . import api
    from .selection import plan
    s = _series(series)
    result = plan(s, _selection(tier, path, only, exclude))
    host_results = []
    if hosts:
        with Hosts(s, inventory, target, accept_new) as resolver:
            transports = [resolver.transport(h, provision_local=False) for h in hosts]
            host_results = api.apply(s, result, transports, dry_run=True)
    if as_json:
        _emit_json({"selected": list(result.names),
                    "decisions": [asdict(d) for d in result.decisions],
                    "hosts": [asdict(r) for r in host_results]})
    else:
        _render_plan(result, host_results)
    codes = {r.exit_code for r in host_results}
    if codes - {0}:
        raise typer.Exit(EXIT_UNREACHABLE if EXIT_UNREACHABLE in codes else max(codes))


def _render_plan(result, host_results) -> None:
    console = _console()
    for d in result.decisions:
        mark = "+" if d.selected else "-"
        console.print(f"{mark} {d.name:<28} {d.reason}", markup=False)
    console.print(f"{len(result.names)} of {len(result.decisions)} patches selected")
    for r in host_results:
        if not r.ok:
            console.print(f"{r.host}: {r.error}", markup=False)
            continue
        added = [n for n in r.after if n not in r.before]
        removed = [n for n in r.before if n not in r.after]
        change = ", ".join([f"+{n}" for n in added] + [f"-{n}" for n in removed])
        console.print(f"{r.host}: {change or 'no change'}", markup=False)


@app.command()
def apply(hosts: List[str] = typer.Argument(..., help="inventory name, user@host[:port] or "
                                            "localhost; several run in parallel"),
          tier: Optional[str] = TierOpt, path: Optional[str] = PathOpt,
          only: Optional[List[str]] = OnlyOpt, exclude: Optional[List[str]] = ExcludeOpt,
          dry_run: bool = typer.Option(False, "--dry-run", help="plan and verify, change nothing"),
          target: Optional[Path] = TargetOpt, lock_wait: float = LockWaitOpt,
          inventory: Optional[Path] = InventoryOpt, accept_new: bool = AcceptNewOpt,
          restart: bool = typer.Option(False, "--restart", help="then restart, host by host, "
                                       "the units whose role's patches or gates changed "
                                       "(redeploys them, waits for /health, rolls back)"),
          health_timeout: Optional[float] = HealthTimeoutOpt,
          as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Make each host run exactly the selected patches, atomically."""
    from . import api
    from .selection import plan
    s = _series(series)
    selected = plan(s, _selection(tier, path, only, exclude))
    with Hosts(s, inventory, target, accept_new) as resolver:
        transports = [resolver.transport(h) for h in hosts]
        results = api.apply(s, selected, transports, dry_run=dry_run, lock_wait=lock_wait,
                            base_provider=_base_provider(s))
        if restart and not dry_run:
            restarts = _restart_after_apply(s, resolver, hosts, transports, results,
                                            health_timeout, lock_wait)
            _finish_with_restarts(results, restarts, as_json)
            return
    _finish(results, as_json, "apply")


def _finish(results, as_json: bool, verb: str) -> None:
    if as_json:
        _emit_json([asdict(r) for r in results])
    for r in results:
        _say(_result_line(r, verb))
        if r.details and not as_json:
            _say(r.details)
    if len(results) > 1:
        _say(_summary(results))
    codes = {r.exit_code for r in results}
    code = EXIT_UNREACHABLE if EXIT_UNREACHABLE in codes else max(codes, default=0)
    if code:
        raise typer.Exit(code)


def _summary(results) -> str:
    ok = [r.host for r in results if r.ok]
    down = [r.host for r in results if r.exit_code == EXIT_UNREACHABLE]
    failed = [r.host for r in results if not r.ok and r.host not in down]
    parts = [f"{len(ok)} ok"]
    if down:
        parts.append(f"{len(down)} unreachable ({', '.join(down)})")
    if failed:
        parts.append(f"{len(failed)} failed ({', '.join(failed)})")
    return f"{len(results)} hosts: " + ", ".join(parts)


def _result_line(r, verb: str) -> str:
    if not r.ok:
        return f"{r.host}: {verb} FAILED: {r.error}"
    recovered = " (finished an interrupted transaction first)" if r.recovered else ""
    if r.dry_run:
        return f"{r.host}: would change {r.before} -> {r.after}"
    if not r.changed:
        return f"{r.host}: unchanged, applied: {', '.join(r.after) or 'none'}{recovered}"
    head = f" head {r.head[:12]}" if r.head else ""
    return (f"{r.host}: {verb} done, applied: {', '.join(r.after) or 'none'}{head}"
            f"{recovered}")


@app.command()
def revert(names: List[str] = typer.Argument(..., help="patch(es) to take out"),
           host: Optional[str] = typer.Option(None, "--host", help="[default: the inventory's "
                                              "default host, else localhost]"),
           with_dependents: bool = typer.Option(False, "--with-dependents",
                                                help="also revert patches that depend on it"),
           target: Optional[Path] = TargetOpt, lock_wait: float = LockWaitOpt,
           inventory: Optional[Path] = InventoryOpt, accept_new: bool = AcceptNewOpt,
           as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Take patches out of a host's tree and keep the rest, exactly."""
    from . import api
    s = _series(series)
    with Hosts(s, inventory, target, accept_new) as resolver:
        transport = resolver.transport(host or resolver.default(), provision_local=False)
        result = api.revert(s, names, transport, with_dependents=with_dependents,
                            lock_wait=lock_wait)
    _finish([result], as_json, "revert")


@app.command()
def status(hosts: Optional[List[str]] = typer.Argument(None, help="[default: the inventory's "
                                                       "default host, else localhost]"),
           target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
           accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
           series: Optional[Path] = SeriesOpt) -> None:
    """Base, applied patches, drift, state version, and the tree the server imports."""
    from . import api
    s = _series(series)
    with Hosts(s, inventory, target, accept_new) as resolver:
        transports = [resolver.transport(h, provision_local=False)
                      for h in hosts or [resolver.default()]]
        states = api.on_hosts(transports, lambda t: api.status_or_error(s, t))
    if as_json:
        _emit_json(states)
    else:
        for state in states:
            _render_status(state)
    codes = {st.get("exit_code", 0) for st in states}
    if EXIT_UNREACHABLE in codes:
        raise typer.Exit(EXIT_UNREACHABLE)
    if any(api.has_findings(st) or _stale_units(st) for st in states) or codes - {0}:
        raise typer.Exit(max(codes | {EXIT_FINDINGS}))


def _render_status(st: dict) -> None:
    console = _console()
    if st.get("error"):
        console.print(f"[bold]{st['host']}[/bold]: [red]{st['error']}[/red]")
        return
    console.print(f"[bold]{st['host']}[/bold] {st['target']} ({st['kind']} tree, "
                  f"{st['layout']} layout)")
    console.print(f"  base: {st['pinned_base']}"
                  + (f", commit {st['base']['commit'][:12]}" if st.get('base') and
                     st['base'].get('commit') else ""), markup=False)
    console.print(f"  state version: {st['state_version'] or '-'}  tool {st['tool_version'] or '-'}"
                  f"  updated {st['updated'] or '-'}", markup=False)
    applied = st["applied"]
    console.print(f"  applied ({len(applied)}): "
                  + (", ".join(a["name"] for a in applied) or "none"), markup=False)
    for key, label in (("drift", "drift"), ("dirty", "uncommitted"),
                       ("foreign_commits", "foreign commits")):
        for item in st.get(key) or []:
            text = item["path"] if isinstance(item, dict) else item
            console.print(f"  [red]{label}[/red]: {text}")
    if st.get("interrupted"):
        i = st["interrupted"]
        console.print(f"  [yellow]interrupted {i['op']} ({i['id']}): {i['next']}[/yellow]")
    interp = st.get("interpreter")
    if interp:
        where = interp.get("imports") or interp.get("error") or "no sglang"
        mark = "" if interp.get("managed") else "  [red]NOT the managed tree: patches here " \
            "are a silent no-op for the server[/red]"
        console.print(f"  {interp['python']} imports {where}{mark}")
    if st.get("locked_by"):
        console.print(f"  locked by {st['locked_by']}", markup=False)
    _render_units(console, st)
    if not any(st.get(k) for k in ("drift", "dirty", "foreign_commits", "interrupted")):
        console.print("  clean")


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
    from .selection import parse_names
    s = _series(series)
    with Hosts(s, inventory, target, accept_new) as resolver:
        spec = resolver.inventory.resolve(host)
        transport = resolver.transport(host, provision_local=False)
        with DeployView(spec.name) as view:
            result = run_deploy(spec, channel_for(transport), str(transport.target),
                                roles=list(parse_names(role)) or None, dry_run=dry_run,
                                timeout=health_timeout, lock_wait=lock_wait,
                                on_event=view.event, git_prefix=s.upstream.git_prefix,
                                package=s.upstream.name,
                                source=resolver.inventory.path or "hosts.yaml")
    if as_json:
        _emit_json([result.to_json()])
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
                                    TimeElapsedColumn(), console=_console(stderr=True),
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
        out = _console()
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
            _say(f"{result.host}: {r.role} {r.unit}: {done}")
    for r in result.roles:
        for note in r.notes:
            _say(f"{result.host}: {r.role}: note: {note}")
    for note in result.notes:
        _say(f"{result.host}: note: {note}")
    if result.error:
        _say(f"{result.host}: deploy FAILED: {result.error.split(': ', 1)[-1]}")
        if result.details:
            _say(result.details)


def _restart_after_apply(series, resolver, specs, transports, results, timeout, lock_wait):
    """After apply: redeploy, host by host, the server roles whose patches or gates changed
    (or whose process is stale). Stops at the first host that fails (it is rolled back)."""
    from deploy.deploy import DeployResult, affected_roles, channel_for, deploy as run_deploy
    out, stopped = [], None
    with DeployView() as view:
        for spec, transport, applied in zip(specs, transports, results):
            if not applied.ok:
                out.append(None)
                continue
            if stopped:
                out.append(DeployResult(host=applied.host, ok=False, exit_code=4,
                                        error=f"{applied.host}: not restarted (stopped after "
                                              f"{stopped} failed)"))
                continue
            host = resolver.inventory.resolve(spec)
            view.host = host.name
            channel = channel_for(transport)
            tree = applied.target or str(transport.target)
            try:
                roles, _ = affected_roles(host, channel, tree, series.upstream.git_prefix,
                                          series.upstream.name)
                if not roles:
                    out.append(DeployResult(host=applied.host, ok=True,
                                            notes=["no running unit serves a changed role"]))
                    continue
                result = run_deploy(host, channel, tree, roles=roles, timeout=timeout,
                                    lock_wait=lock_wait, on_event=view.event,
                                    git_prefix=series.upstream.git_prefix,
                                    package=series.upstream.name,
                                    source=resolver.inventory.path or "hosts.yaml")
            except PatchsetError as exc:
                result = DeployResult(host=applied.host, ok=False, error=str(exc),
                                      exit_code=exc.exit_code)
            out.append(result)
            if not result.ok:
                stopped = applied.host
    return out


def _finish_with_restarts(results, restarts, as_json: bool) -> None:
    if as_json:
        _emit_json([dict(asdict(r), restart=x.to_json() if x else None)
                    for r, x in zip(results, restarts)])
    codes = set()
    for r, x in zip(results, restarts):
        _say(_result_line(r, "apply"))
        if r.details and not as_json:
            _say(r.details)
        codes.add(r.exit_code)
        if x is None:
            continue
        codes.add(x.exit_code)
        if x.ok and not x.roles:
            _say(f"{r.host}: restart: nothing to restart ({'; '.join(x.notes)})")
        elif x.ok:
            done = ", ".join(f"{p.role} {'restarted' if 'restarted' in p.actions else 'unchanged'}"
                             for p in x.roles)
            _say(f"{r.host}: restart: {done}")
        else:
            _say(f"{r.host}: restart FAILED: {x.error}")
            if x.details and not as_json:
                _say(x.details)
    if len(results) > 1:
        _say(_summary(results))
    code = EXIT_UNREACHABLE if EXIT_UNREACHABLE in codes else max(codes, default=0)
    if code:
        raise typer.Exit(code)


def _stale_units(st: dict) -> list[dict]:
    return [u for u in st.get("units") or [] if u.get("stale")]


def _render_units(console, st: dict) -> None:
    """The units that serve this tree (prefill, decode order); stale ones say how to fix."""
    order = {"prefill": 0, "decode": 1}
    for u in sorted(st.get("units") or [], key=lambda u: (order.get(u.get("role"), 9),
                                                          u["unit"])):
        state = f"{u.get('active')}/{u.get('sub')}"
        pid = f", pid {u['main_pid']}, started {u['started']}" if u.get("main_pid") else ""
        console.print(f"  unit {u['unit']} ({u['role']}): {state}{pid}", markup=False)
        if u.get("stale"):
            console.print(f"  [red]STALE[/red]: {u['unit']} started before the tree changed "
                          f"({u['tree_changed']}) and runs other patches than its role now "
                          f"has; run `patchset apply --restart` or `patchset deploy "
                          f"{st['host']} --role {u['role']}`")
        if u.get("need_daemon_reload"):
            console.print(f"  [yellow]{u['unit']} changed on disk since systemd loaded it "
                          "(daemon-reload pending)[/yellow]")


@app.command()
def provision(offline: bool = typer.Option(False, "--offline"),
              series: Optional[Path] = SeriesOpt, as_json: bool = JsonOpt) -> None:
    """Fetch the pinned upstream into the local cache (git, else the verified PyPI wheel)."""
    from .upstream import provision as do_provision
    s = _series(series)
    base = do_provision(s.upstream, progress=RichProgress(), offline=offline)
    if as_json:
        _emit_json({"repo": str(base.repo), "commit": base.commit, "source": base.source,
                    "ref": base.ref})
    else:
        _console().print(f"{s.upstream.name} {s.upstream.version}: {base.commit} "
                         f"from {base.source} in {base.repo}", markup=False)


@app.command()
def version() -> None:
    """Print the patchset version."""
    print(__version__)



# ---------------------------------------------------------------- audit (live facts, checks)

@app.command()
def audit(hosts: List[str] = typer.Argument(..., help="inventory name, user@host[:port] or "
                                            "localhost; several run in parallel"),
          symptom: Optional[str] = typer.Option(None, "--symptom", help="rank suspects for "
                                                "context-loss | decode-quality | throughput"),
          fmt: str = typer.Option("terminal", "--format", help="terminal | md | html | json "
                                  "| junit"),
          output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the "
                                                "report to FILE instead of stdout"),
          target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
          accept_new: bool = AcceptNewOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Gather live facts (one round trip per host), give every patch its effective state,
    run the checks, rank suspects for a symptom. Exit 0 clean, 1 findings, 3 unreachable."""
    from auditor import cli_support
    from auditor.render import render
    s = _series(series)
    cli_support.check_format(fmt)
    with Hosts(s, inventory, target, accept_new) as resolver:
        transports = [cli_support.transport(resolver, h) for h in hosts]
        report, data, code = cli_support.run(s, transports, symptom, resolver.inventory, hosts)
    color = fmt == "terminal" and output is None and sys.stdout.isatty()
    text = render(data, fmt, color=color)
    if output is not None:
        output.write_text(text, encoding="utf-8")
        _say(f"{cli_support.summary_line(data)}; report written to {output}")
    else:
        sys.stdout.write(text)
    if code:
        raise typer.Exit(code)

# ---------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> int:
    """One top-level handler: expected errors are one line; others a short trace + log."""
    try:
        code = app(args=argv, prog_name="patchset", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except PatchsetError as exc:
        print(f"patchset: error: {exc}", file=sys.stderr)
        details = getattr(exc, "details", "")
        if details:
            print(details, file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the one place that catches everything
        return _unexpected(exc)


def _unexpected(exc: BaseException) -> int:
    import click
    if isinstance(exc, click.exceptions.Abort):
        print("patchset: aborted", file=sys.stderr)
        return 130
    if isinstance(exc, click.ClickException):
        exc.show()
        return EXIT_BAD_INPUT
    from .paths import data_home
    log = data_home() / "debug.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(traceback.format_exc())
    except OSError:
        pass
    short = traceback.format_exception_only(type(exc), exc)[-1].strip()
    print(f"patchset: internal error: {short} (full trace in {log})", file=sys.stderr)
    return 70


if __name__ == "__main__":
    sys.exit(main())
