"""`patchset rebase --onto REF`: move the series to another upstream release (the library
does the work: patchset/authoring/rebase.py); this renders the per-patch outcomes."""

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from .app import app, load
from .options import JsonOpt, OfflineOpt, SeriesOpt
from .render import RichProgress, emit_json, say, term


@app.command("rebase")
def rebase_cmd(onto: Optional[str] = typer.Option(None, "--onto", help="the release to move "
                                                  "to: 0.5.15 or the tag v0.5.15"),
               check: Optional[str] = typer.Option(None, "--check", help="START..END: what "
                                                   "each upstream commit of the range would "
                                                   "do to the series; writes nothing"),
               dry_run: bool = typer.Option(False, "--dry-run", help="report only; write "
                                            "nothing"),
               offline: bool = OfflineOpt("the release must have been fetched once; "
                                          "skips the git probe"),
               as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Move the series to another upstream release: per patch clean, 3way (re-diffed),
    upstream (dropped, recorded) or conflict (hunks shown, nothing written); or, with
    --check START..END, walk upstream's first-parent commits and name the commit that makes
    each patch conflict, be taken upstream, or lose a call-path guard or trace target.
    Exit 0 moved (or would move; --check: nothing breaks), 1 a conflict (--check: a
    break, or one already on START), 2 bad input, 3 the package index or upstream is
    unreachable."""
    from dataclasses import asdict

    if (onto is None) == (check is None):
        raise UsageError("give --onto RELEASE or --check START..END (one of them)")
    if check is not None:
        from patchset.authoring.rebasecheck import check_range
        report = check_range(load(series), check, progress=RichProgress(), offline=offline)
        if as_json:
            emit_json({**asdict(report), "exit_code": report.exit_code})
        else:
            _render_check(report)
        if report.exit_code:
            raise typer.Exit(report.exit_code)
        return
    from patchset.authoring.rebase import rebase
    assert onto is not None                 # one of the two, and not --check
    result = rebase(load(series), onto, dry_run=dry_run, progress=RichProgress(),
                    offline=offline)
    if as_json:
        emit_json({**asdict(result), "exit_code": result.exit_code})
    else:
        _render(result)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _render_check(report) -> None:
    console = term()
    for b in report.at_start:
        console.print(f"already at START {b.commit[:12]} "
                      f"{report.subjects.get(b.commit, '')!s:.60}: {b.patch}: {b.what}: "
                      f"{b.detail}", markup=False)
    for b in report.breaks:
        console.print(f"{b.commit[:12]} {report.subjects.get(b.commit, '')!s:.60}: {b.patch}: "
                      f"{b.what}: {b.detail}", markup=False)
    say(f"{len(report.commits)} upstream commit(s) in {report.range}: "
        + (f"{len(report.breaks)} break(s)" if report.breaks else "nothing breaks the series")
        + (f"; {len(report.at_start)} already on START (from the pin to START)"
           if report.at_start else ""))


def _render(result) -> None:
    from rich.table import Table
    console = term()
    table = Table("patch", "outcome", "files", "notes",
                  title=f"{result.old} -> {result.new}")
    for p in result.patches:
        files = "\n".join(path.rsplit("/", 1)[-1] for path in p.files)
        table.add_row(p.name, p.outcome, files, "\n".join(p.notes) or "-")
    console.print(table)
    for p in result.patches:
        for hunk in p.hunks:
            start, count = hunk.upstream
            console.print(f"{p.name}: {hunk.path}: conflict at lines {start}-"
                          f"{start + max(count, 1) - 1} of {result.new} (lines "
                          f"{hunk.lines[0]}-{hunk.lines[1]} of the merge)", markup=False)
            console.print(hunk.text, markup=False, end="")
    _render_guards(console, result)
    say(_summary(result))


def _render_guards(console, result) -> None:
    """The carried patches' call-path guards on the new release: which appeared,
    vanished or moved (file:line), so the `requires` that cite them can follow."""
    same = [c.patch for c in result.guards if not c.changed]
    for c in result.guards:
        for g in c.appeared:
            console.print(f"{c.patch}: guard appeared: {g.fact} at {g.where} in "
                          f"{g.function}: {g.condition}", markup=False)
        for g in c.vanished:
            console.print(f"{c.patch}: guard vanished: {g.fact} (was at {g.where} in "
                          f"{g.function})", markup=False)
        for old, new in c.moved:
            console.print(f"{c.patch}: guard moved: {new.fact} in {new.function} "
                          f"{old.where} -> {new.where}", markup=False)
    if same:
        console.print(f"guards unchanged on {result.new}: {', '.join(same)}", markup=False)


def _summary(result) -> str:
    counts: dict[str, int] = {}
    for p in result.patches:
        counts[p.outcome] = counts.get(p.outcome, 0) + 1
    tally = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
    if not result.ok:
        return f"{tally}: conflicts, nothing written (resolve them, then rebase again)"
    if not result.changed:
        return f"{tally}: already on {result.new}, nothing to change"
    files = len(result.written) + len(result.removed)
    verb = "would write" if result.dry_run else "wrote"
    return f"{tally}: {verb} {files} file(s) for {result.new} ({result.manifest})"
