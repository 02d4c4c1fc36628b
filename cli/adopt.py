"""`patchset adopt`: put a host's unmanaged tree under management, its commits and hand
edits proposed as a series (the library: patchset/authoring/adopt.py)."""

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from .app import app, load, resolver_for
from .options import (AcceptNewOpt, InventoryOpt, JsonOpt, NewPathOpt, NewTierOpt,
                      OfflineOpt, SeriesOpt, TargetOpt)
from .render import RichProgress, emit_json, say, term


@app.command("adopt")
def adopt_cmd(host: str = typer.Argument(..., help="inventory name, user@host[:port] or "
                                         "localhost (with --target)"),
              checkout: Optional[str] = typer.Option(None, "--checkout", help="on the host: "
                                                     "the git checkout the served "
                                                     "site-packages was installed from"),
              split: bool = typer.Option(False, "--split", help="hand edits: one patch per "
                                         "file"),
              tier: str = NewTierOpt("every proposed patch"),
              path: str = NewPathOpt("every proposed patch"),
              write: bool = typer.Option(False, "--write", help="write patches.yaml + "
                                         "patches/ and put the host under management (no "
                                         "served byte changes)"),
              force: bool = typer.Option(False, "--force", help="--write over a manifest "
                                         "that already holds a series (replaces it)"),
              author: Optional[str] = typer.Option(None, "--author", help="DEP-3 Author of "
                                                   "the hand edits: 'Name <email>' (commits "
                                                   "name their own)"),
              offline: bool = OfflineOpt(),
              target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
              accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
              series: Optional[Path] = SeriesOpt) -> None:
    """Read the unmanaged tree a host's server imports, find its base (with the files
    compared and matching) and propose a series: one patch per local commit, one for the
    hand edits (--split: per file), each with a proposed gate, trace targets and
    call-path guards. Dry run unless --write; --write changes no served byte (hashed
    before and after)."""
    from patchset.authoring.adopt import AdoptOptions, plan, write as write_series
    from patchset.authoring.interop import ImportMeta
    ImportMeta(tier=tier, path=path)                     # bad flags before any host is read
    s = load(series)
    options = AdoptOptions(checkout=checkout, split=split, tier=tier, path=path,
                           offline=offline, author=author)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        if host not in resolver.inventory.hosts and host not in ("localhost", "local") \
                and "@" not in host:
            raise UsageError(f"host {host!r}: not in the inventory; add it to hosts.yaml "
                             "or give user@host[:port]")
        transport = resolver.transport(host, provision_local=False)
        result = plan(s, transport, options, progress=RichProgress())
        if write:
            result = write_series(s, transport, result, force=force, author=author,
                                  progress=RichProgress())
    if as_json:
        emit_json(result.to_json())
    else:
        _render_adopt(result)


def _render_adopt(result) -> None:
    console = term()
    b = result.base
    shown = "unknown" if b.matching is None else str(b.matching)
    console.print(f"{result.host}:{result.target} ({result.layout} layout)", markup=False)
    console.print(f"base: {b.label}: {shown} of {b.compared} served files match it",
                  markup=False)
    for c in result.candidates:
        matching = "unknown" if c.matching is None else c.matching
        console.print(f"  candidate {c.label}: {matching}/{c.compared} files match",
                      markup=False)
    for p in result.patches:
        gate = f" gate {p.gate['env']}={p.gate['on']}" if p.gate else ""
        console.print(f"  {p.name}  [{p.source}] {p.tier}/{p.path}{gate}  "
                      f"{', '.join(p.files)}", markup=False)
        for t in p.trace_targets:
            console.print(f"      trace {t}", markup=False)
        if p.guards:
            console.print(f"      guards {', '.join(p.guards)}", markup=False)
    for c in result.left_out:
        console.print(f"  left out {c.commit[:12]} {c.subject}: {c.why}", markup=False)
    for blocker in result.blockers:
        console.print(f"  --write refuses: {blocker.what}: {blocker.why}", markup=False)
    if not result.blockers:
        console.print(f"checked: the pin + these patches give all {result.reproduced} served "
                      "files exactly", markup=False)
    for note in result.notes:
        say(note)
    if result.written:
        say(f"wrote {len(result.written)} patch(es); {result.host} is managed, "
            f"{result.files_hashed} served files identical before and after")
    else:
        say("dry run: nothing written (--write to adopt)")
