"""The terminal view (rich): suspects and next steps first, then per host the servers,
the patch x server state matrix, the fidelity probes (--probe) and the checks that did
not pass. Plain when piped. Every value of the report goes through `escape`
(patchset/escaping.py: rich markup and control characters), state words included."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from patchset.escaping import for_terminal as escape

from . import view

if TYPE_CHECKING:
    from rich.console import Console

STYLE = {"fail": "bold red", "FAIL": "bold red", "warn": "yellow", "unknown": "magenta",
         "pass": "green", "waived": "cyan", "expired": "yellow", "unused": "dim",
         "active": "green", "inert": "dim", "gated-off": "dim",
         "not-applied": "dim", "drifted": "bold red"}


def _tag(text: str) -> str:
    style = STYLE.get(text)
    return f"[{style}]{escape(text)}[/{style}]" if style else escape(text)


def _cell(row: dict, col: str) -> str:
    """The state, with how it is known where the tracer ran: `active (observed)`,
    `active (none yet)`; plain `active` is declared with tracing off."""
    state = row["cells"].get(col)
    if state is None:
        return "-"
    how = row.get("evidence", {}).get(col)
    return _tag(state) + (f" ({how})" if how in ("observed", "none yet") else "")


def render(data: dict, color: bool = False, width: int | None = None) -> str:
    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color,
                      width=width or 140, highlight=False, soft_wrap=False, emoji=False)
    s = data["summary"]
    c = s["checks"]
    console.print(f"[bold]patchset audit[/bold]  {escape(data['series']['upstream']['name'])} "
                  f"{escape(data['series']['upstream']['version'])}, {s['hosts']} host(s): "
                  f"{_tag('fail')} {c['fail']}  {_tag('warn')} {c['warn']}  "
                  f"{_tag('unknown')} {c['unknown']}  {_tag('pass')} {c['pass']}"
                  + (f"  {_tag('waived')} {s['waived']}" if s.get("waived") else "")
                  + (f"  unreachable: {escape(', '.join(s['unreachable']))}"
                     if s["unreachable"] else "")
                  + (f"  ({s['notes']} info note(s), not counted)" if s.get("notes") else "")
                  + f"  exit {escape(s['exit_code'])}", soft_wrap=True)
    if data.get("symptom"):
        sym = data["symptom"]
        table = Table(title=f"Suspects for: {escape(sym['title'])}", title_justify="left",
                      show_lines=True, expand=True)
        for col in ("#", "suspect", "kind", "score", "why"):
            table.add_column(col, overflow="fold", ratio=6 if col == "why" else None)
        for sp in sym["suspects"]:
            table.add_row(escape(sp["rank"]), f"[bold]{escape(sp['name'])}[/bold]",
                          escape(sp["kind"]), escape(f"{sp['score']:g}"),
                          "\n".join(escape(r) for r in sp["reasons"]))
        console.print(table)
        console.print("[bold]Next steps, cheapest first[/bold]")
        for i, step in enumerate(sym["next_steps"], 1):
            console.print(f" {i}. {escape(step['title'])} [dim](cost {escape(step['cost'])}, "
                          f"{escape(step['kind'])})[/dim]")
            if step["why"]:
                console.print(f"    [dim]{escape(step['why'])}[/dim]", soft_wrap=True)
            if step["command"]:
                console.print(f"    [cyan]{escape(step['command'])}[/cyan]", soft_wrap=True)
    findings = view.findings_by_host(data)
    for host in data["hosts"]:
        console.rule(f"[bold]{escape(host['host'])}[/bold]", align="left")
        if not host["reachable"] or host["error"]:
            console.print(f"  {_tag('fail')} {escape(host['error'] or 'unreachable')}")
        else:
            console.print(f"  GPUs: {escape(view.gpus(host))}")
            console.print(f"  tree: {escape(view.tree(host))}")
            servers = Table(box=None, pad_edge=False, expand=False)
            for col in ("server", "role", "pid", "started", "health", "MoE", "imports"):
                servers.add_column(col, overflow="fold")
            for sv in view.servers(host):
                servers.add_row(escape(sv["id"]), escape(sv["role"]), escape(sv["pid"]),
                                escape(sv["started"]),
                                escape(sv["health"]), escape(str(sv["backend"])),
                                escape(sv["imports"]))
            console.print(servers)
            columns, rows = view.matrix(host)
            states = Table(title="patch states", title_justify="left", expand=False)
            states.add_column("patch")
            for col in columns:
                states.add_column(escape(col))
            for row in rows:
                states.add_row(escape(row["patch"]), *(_cell(row, col) for col in columns))
            console.print(states)
            _probes(console, host)
        mine = findings.get(host["host"], [])
        bad = [f for f in mine if f["status"] not in ("pass", "waived")]
        waived = [f for f in mine if f["status"] == "waived"]
        passed = len(mine) - len(bad) - len(waived)
        if bad:
            checks = Table(title="checks not passing", title_justify="left", expand=True,
                           show_lines=False)
            for col in ("status", "sev", "check", "subject", "expected", "found"):
                checks.add_column(col, overflow="fold")
            for f in bad:
                checks.add_row(_tag(f["status"]), escape(f["severity"]), escape(f["id"]),
                               escape(f["subject"]) + ("\n" + escape(f["message"])
                                                       if f["message"] else ""),
                               escape(view.short(f["expected"])), escape(view.short(f["found"])))
            console.print(checks)
        if waived:
            _waived(console, waived)
        console.print(f"  {passed} check(s) passed" + (f", {len(waived)} waived" if waived
                                                       else "") + ("" if bad else ", none failed"))
    _waivers(console, data)
    return buffer.getvalue()


def _waived(console: Console, waived: list[dict]) -> None:
    """The host's waived findings, each with its justification (they do not count)."""
    from rich.table import Table

    table = Table(title="waived (not counted)", title_justify="left", expand=True)
    for col in ("status", "was", "check", "subject", "justification", "by, until"):
        table.add_column(col, overflow="fold")
    for f in waived:
        w = f["waiver"]
        table.add_row(_tag("waived"), escape(w["status"]), escape(f["id"]), escape(f["subject"]),
                      escape(w["justification"]),
                      escape(f"{w['who']}, {w['expires']} ({w['file']}:{w['line']})"))
    console.print(table)


def _waivers(console: Console, data: dict) -> None:
    """The waivers file the audit read: what each waiver did."""

    if not data.get("waivers"):
        return
    rows = view.waivers(data)
    console.rule(f"[bold]waivers[/bold] {escape(data['waivers']['file'])}", align="left")
    if not rows:
        console.print("  none in the file")
    for w in rows:
        console.print(f"  {_tag(w['state'])} {escape(w['where'])} {escape(w['id'])} on "
                      f"{escape(w['host'])} {escape(repr(w['subject']))}: "
                      f"{len(w['findings'])} finding(s), by {escape(w['who'])} until "
                      f"{escape(w['expires'])}: {escape(w['justification'])}", soft_wrap=True)


def _probes(console: Console, host: dict) -> None:
    """The host's fidelity probes, every one (a pass is evidence too)."""
    from rich.table import Table

    rows = view.probes(host)
    if not rows:
        return
    table = Table(title="fidelity probes", title_justify="left", expand=True)
    for col in ("result", "probe", "size", "prompt", "latency", "answer", "why"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(_tag(r["mark"]), escape(r["name"]), escape(r["size"]),
                      escape(f"{r['sent']} words sent, {r['seen']} seen"), escape(r["latency"]),
                      escape(r["answer"]), escape(r["reason"]))
    console.print(table)
