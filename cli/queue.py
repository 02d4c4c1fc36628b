"""The patch-queue commands: list, show, check, plan, apply, revert, status, provision
(and the unit side of apply --restart and status)."""

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from .. import __version__
from ..errors import Exit

if TYPE_CHECKING:
    from patchset.agent.lib.records import UnitStatus
    from ..api import HostStatus
from .app import app, finish, load, resolver_for, result_line, selection, ship_base, summary
from .options import (AcceptNewOpt, ExcludeOpt, ForksOpt, HealthTimeoutOpt, InventoryOpt,
                      JsonOpt, LockWaitOpt, OfflineOpt, OnlyOpt, PathOpt, SeriesOpt, TargetOpt,
                      TierOpt)
from .render import (DeployView, RichProgress, emit_json, esc, host_error, printable_block,
                     say, term)



# ---------------------------------------------------------------- commands

@app.command("list")
def list_cmd(tier: Optional[str] = TierOpt, path: Optional[str] = PathOpt,
             as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """List the series (filtered by --tier/--path), in series order."""
    from patchset.series.selection import list_patches
    s = load(series)
    patches = list_patches(s, tier, path)
    if as_json:
        emit_json([_patch_json(p) for p in patches])
        return
    from rich.table import Table
    table = Table("#", "name", "tier", "path", "gate", "depends", "upstream", "summary")
    order = {p.name: i for i, p in enumerate(s.patches, start=1)}
    for p in patches:
        gate = f"{p.gate.env}={p.gate.on}" if p.gate else "-"
        table.add_row(str(order[p.name]), p.name, p.tier, p.path, esc(gate),
                      ",".join(p.depends) or "-", p.upstream_status, esc(p.summary))
    term().print(table)


def _patch_json(p) -> dict:
    data = asdict(p)
    data["requires"] = [asdict(r) for r in p.requires]
    return data


@app.command()
def show(name: str, series: Optional[Path] = SeriesOpt,
         as_json: bool = JsonOpt) -> None:
    """Show one patch: metadata, header, the guards on its call path (and what covers
    each), files with diffstat, highlighted diff."""
    from ..api import show as show_patch
    from patchset.analysis.guards import for_patch
    s = load(series)
    view = show_patch(s, name)
    guards = for_patch(s, name)          # from the cache: `show` never downloads the pin
    if as_json:
        emit_json({**_patch_json(view.patch), "diff": view.diff,
                   "guards": None if guards is None else [
                       {**c.guard.to_json(), "covered_by": c.by} for c in guards[0]],
                   "guard_notes": None if guards is None else list(guards[1])})
        return
    _render_show(view, guards)


def _render_show(view, guards) -> None:
    from rich.syntax import Syntax
    console = term()
    p = view.patch
    console.print(f"[bold]{p.name}[/bold]  tier={p.tier} path={p.path} "
                  f"gate={(p.gate.env + '=' + p.gate.on) if p.gate else 'none'} "
                  f"upstream={p.upstream_status}")
    for key, value in p.header.items():
        console.print(f"{key}: {value}", markup=False)
    for req in p.requires:
        console.print(f"requires {req.fact} {req.op} {req.value!r}  {req.why}", markup=False)
    if guards is None:
        console.print("guards: not derived: the pinned base is not in the cache (run "
                      "`patchset provision`)", markup=False)
    else:
        console.print(f"guards: {len(guards[0])} condition(s) on its call path in the pin",
                      markup=False)
        for c in guards[0]:
            console.print("  " + _guard_line(c.guard) + "  " + (
                f"covered: {c.by}" if c.by else "NOT COVERED"), markup=False)
    total_add = sum(c.added for c in p.files)
    total_del = sum(c.removed for c in p.files)
    for c in p.files:
        console.print(f" {c.path} | +{c.added} -{c.removed}", markup=False)
    console.print(f" {len(p.files)} file(s) changed, {total_add} insertions(+), "
                  f"{total_del} deletions(-)")
    console.print(Syntax(printable_block(view.diff), "diff", theme="ansi_dark",
                         word_wrap=False))


@app.command()
def check(as_json: bool = JsonOpt, exhaustive: bool = typer.Option(
              False, "--exhaustive", help="try every dependency-closed subset"),
          offline: bool = OfflineOpt(),
          series: Optional[Path] = SeriesOpt) -> None:
    """Validate the manifest and apply every selection on the pinned base (zero fuzz)."""
    from .. import api
    from patchset.pin.upstream import blob_reader, provision
    s = load(series)
    base = provision(s.upstream, progress=RichProgress(), offline=offline)
    report = api.check(s, blob_reader(base), f"{base.commit} ({base.source})", exhaustive)
    from patchset.analysis.guards import stored, uncovered
    derived = stored(s, base=base)
    missing = uncovered(s, derived or {})
    if as_json:
        emit_json({"ok": report.ok, **asdict(report), "guards": {
            "derived": sum(len(g.guards) for g in (derived or {}).values()),
            "uncovered": [{"patch": name, **g.to_json()} for name, g in missing]}})
    else:
        _render_check(report)
        _render_uncovered(missing)
    if not report.ok:
        raise typer.Exit(Exit.FINDINGS)


def _render_uncovered(missing) -> None:
    """Information, not a failure: a guard is derived by name from the pinned code (a
    platform branch, a speculative-decoding setting); the audit makes a patch `unknown`
    where one of them runs at another value than the pin's default."""
    console = term()
    console.print(f"guards not covered by requires or gate: {len(missing)} (information; "
                  "`patchset show NAME` lists each patch's)", markup=False)
    for name, g in missing:
        console.print(f"  {name}: {_guard_line(g)}", markup=False)


def _guard_line(g) -> str:
    default = (f"default {g.default!r}" if g.has_default else
               "set at startup" if g.parse == "startup" else "no default")
    return f"{g.fact} at {g.where} in {g.function} (hop {g.hops}): {g.condition} [{default}]"


def _render_check(report) -> None:
    console = term()
    console.print(f"manifest {esc(report.manifest)}: valid")
    console.print(f"base {esc(report.base)}")
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



@app.command("plan")
def plan_cmd(hosts: Optional[List[str]] = typer.Argument(None, help="hosts to compare with "
                                                         "(a dry-run apply on each)"),
             tier: Optional[str] = TierOpt, path: Optional[str] = PathOpt,
             only: Optional[List[str]] = OnlyOpt, exclude: Optional[List[str]] = ExcludeOpt,
             target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
             accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
             series: Optional[Path] = SeriesOpt) -> None:
    """Show which patches a selection takes and why; with HOST, what apply would change."""
    from .. import api
    from patchset.series.selection import plan
    s = load(series)
    result = plan(s, selection(tier, path, only, exclude))
    host_results = []
    if hosts:
        with resolver_for(s, inventory, target, accept_new) as resolver:
            transports = [resolver.transport(h, provision_local=False) for h in hosts]
            host_results = api.apply(s, result, transports, dry_run=True)
    if as_json:
        emit_json({"selected": list(result.names),
                    "decisions": [asdict(d) for d in result.decisions],
                    "hosts": [asdict(r) for r in host_results]})
    else:
        _render_plan(result, host_results)
    # A host that refuses (a patch that does not apply, not the pin, ...) is the same
    # one-line refusal on stderr, with the same exit code, as `apply` gives.
    for r in host_results:
        if not r.ok:
            say(result_line(r, "plan"))
    code = Exit.combine(r.exit_code for r in host_results)
    if code:
        raise typer.Exit(code)


def _render_plan(result, host_results) -> None:
    console = term()
    for d in result.decisions:
        mark = "+" if d.selected else "-"
        console.print(f"{mark} {d.name:<28} {d.reason}", markup=False)
    console.print(f"{len(result.names)} of {len(result.decisions)} patches selected")
    for r in host_results:
        if not r.ok:
            continue   # on stderr (plan_cmd)
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
          health_timeout: Optional[float] = HealthTimeoutOpt, forks: int = ForksOpt,
          as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Make each host run exactly the selected patches, atomically."""
    from .. import api
    from patchset.series.selection import plan
    s = load(series)
    selected = plan(s, selection(tier, path, only, exclude))
    with resolver_for(s, inventory, target, accept_new) as resolver:
        transports = [resolver.transport(h) for h in hosts]
        results = api.apply(s, selected, transports, dry_run=dry_run, lock_wait=lock_wait,
                            base_provider=ship_base(s), forks=forks)
        results = _after_bisect(s, resolver, hosts, results, lambda i: api.apply(
            s, selected, [transports[i]], lock_wait=lock_wait, base_provider=ship_base(s))[0])
        if restart and not dry_run:
            restarts = _restart_after_apply(s, resolver, hosts, transports, results,
                                            health_timeout, lock_wait)
            _finish_with_restarts(results, restarts, as_json)
            return
    finish(results, as_json, "apply")


def _after_bisect(series, resolver, specs: list, results: list, again) -> list:
    """apply/revert results an abandoned bisect refused, retried once its restore is
    finished (the library's workflow: isolate/search/bisect.py retry_pending); the others
    as they are. The library is imported only for a refused result: it brings the probes,
    drift and the tunnel, an import every apply and revert would pay."""
    if not any(getattr(r, "bisect", None) for r in results):
        return list(results)
    from patchset.isolate.search.bisect import retry_pending
    return retry_pending(series, resolver, specs, results, again, say)


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
    from .. import api
    s = load(series)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        spec = host or resolver.default()
        transport = resolver.transport(spec, provision_local=False)

        def run_revert(_: int = 0):
            return api.revert(s, names, transport, with_dependents=with_dependents,
                              lock_wait=lock_wait)
        [result] = _after_bisect(s, resolver, [spec], [run_revert()], run_revert)
    finish([result], as_json, "revert")


@app.command()
def status(hosts: Optional[List[str]] = typer.Argument(None, help="[default: the inventory's "
                                                       "default host, else localhost]"),
           target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
           accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
           forks: int = ForksOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Base, applied patches, drift, state version, and the tree the server imports."""
    from .. import api
    s = load(series)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        transports = [resolver.transport(h, provision_local=False)
                      for h in hosts or [resolver.default()]]
        states = api.on_hosts(transports, lambda t: api.status_or_error(s, t), forks)
    if as_json:
        emit_json([st.to_json() for st in states])
    else:
        for state in states:
            _render_status(state)
    # A host's error is its code; drift, hand edits or stale units on any host are findings.
    codes = {st.exit_code for st in states}
    if Exit.UNREACHABLE not in codes:
        if any(st.has_findings() or st.stale_units() for st in states):
            codes.add(Exit.FINDINGS)
    code = Exit.combine(codes)
    if code:
        raise typer.Exit(code)


def _render_status(hs: "HostStatus") -> None:
    console = term()
    st = hs.record
    if st is None:
        host_error(hs.host, hs.error or "no status")
        return
    console.print(f"[bold]{esc(hs.host)}[/bold] {esc(st.target)} ({st.kind} tree, "
                  f"{st.layout} layout)")
    console.print(f"  base: {hs.pinned_base}"
                  + (f", commit {st.base['commit'][:12]}" if st.base and
                     st.base.get('commit') else ""), markup=False)
    console.print(f"  state version: {st.state_version or '-'}  tool {st.tool_version or '-'}"
                  f"  updated {st.updated or '-'}", markup=False)
    console.print(f"  applied ({len(st.applied)}): "
                  + (", ".join(a.name for a in st.applied) or "none"), markup=False)
    for items, label in (([d.path for d in st.drift], "drift"), (st.dirty, "uncommitted"),
                         (st.foreign_commits, "foreign commits")):
        for item in items:
            console.print(f"  [red]{label}[/red]: {esc(item)}")
    if st.interrupted:
        i = st.interrupted
        console.print(f"  [yellow]interrupted {esc(i.op)} ({esc(i.id)}): "
                      f"{esc(i.next)}[/yellow]")
    interp = st.interpreter
    if interp:
        where = interp.imports or interp.error or "no sglang"
        mark = "" if interp.managed else "  [red]NOT the managed tree: patches here " \
            "are a silent no-op for the server[/red]"
        console.print(f"  {esc(interp.python)} imports {esc(where)}{mark}")
    if st.locked_by:
        console.print(f"  locked by {st.locked_by}", markup=False)
    if st.bisect:
        b = st.bisect
        console.print(f"  [yellow]bisect {esc(b.get('id'))} by {esc(b.get('by'))} since "
                      f"{esc(b.get('started'))}"
                      " holds this host in a test state: it restores when it ends, else the "
                      "next apply/revert/deploy from its machine or `patchset bisect HOST "
                      "--restore` does[/yellow]")
    _render_units(console, hs.host, st.units)
    if not (st.drift or st.dirty or st.foreign_commits or st.interrupted or st.bisect):
        console.print("  clean")


def _render_units(console, host: str, units: "list[UnitStatus]") -> None:
    """The units that serve this tree (prefill, decode order); stale ones say how to fix."""
    order = {"prefill": 0, "decode": 1}
    for u in sorted(units, key=lambda u: (order.get(u.role, 9), u.unit)):
        state = f"{u.active}/{u.sub}"
        pid = f", pid {u.main_pid}, started {u.started}" if u.main_pid else ""
        console.print(f"  unit {u.unit} ({u.role}): {state}{pid}", markup=False)
        if u.stale:
            console.print(f"  [red]STALE[/red]: {esc(u.unit)} started before the tree "
                          f"changed ({esc(u.tree_changed)}) and runs other patches than "
                          f"its role now has; run `patchset apply --restart` or `patchset "
                          f"deploy {esc(host)} --role {esc(u.role)}`")
        if u.managed is False:
            console.print(f"  [red]{esc(u.unit)} imports {esc(u.imports)}: NOT the managed "
                          "tree, patches here are a silent no-op for it[/red]")
        if u.need_daemon_reload:
            console.print(f"  [yellow]{esc(u.unit)} changed on disk since systemd loaded it "
                          "(daemon-reload pending)[/yellow]")


def _finish_with_restarts(results, restarts, as_json: bool) -> None:
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


def _restart_after_apply(series, resolver, specs, transports, results, timeout, lock_wait):
    """apply --restart: redeploy the roles the apply changed, with progress here."""
    from patchset.deploy.deploy import restart_after_apply as restart
    with DeployView() as view:
        return restart(series, resolver.inventory, specs, transports, results, timeout,
                       lock_wait, on_event=view.event,
                       on_host=lambda name: setattr(view, "host", name))


@app.command()
def provision(offline: bool = OfflineOpt(),
              series: Optional[Path] = SeriesOpt, as_json: bool = JsonOpt) -> None:
    """Fetch the pinned upstream into the local cache (git, else the verified PyPI wheel)."""
    from patchset.pin.upstream import provision as do_provision
    s = load(series)
    base = do_provision(s.upstream, progress=RichProgress(), offline=offline)
    if as_json:
        emit_json({"repo": str(base.repo), "commit": base.commit, "source": base.source,
                    "ref": base.ref})
    else:
        term().print(f"{s.upstream.name} {s.upstream.version}: {base.commit} "
                         f"from {base.source} in {base.repo}", markup=False)


@app.command()
def version() -> None:
    """Print the patchset version."""
    print(__version__)

