"""`patchset capture`: hand edits on a host's managed tree become a new patch at the end
of the series; the host is only read (the library: patchset/authoring/capture.py)."""

from pathlib import Path
from typing import Optional

import typer

from .app import app, load, resolver_for
from .options import (AcceptNewOpt, InventoryOpt, JsonOpt, LockWaitOpt, NewPathOpt,
                      NewTierOpt, OfflineOpt, SeriesOpt, TargetOpt)
from .render import RichProgress, emit_json, say, term


@app.command()
def capture(host: str = typer.Argument(..., help="inventory name, user@host[:port] or "
                                       "localhost"),
            name: str = typer.Argument(..., help="the new patch's name ([a-z0-9-], new)"),
            tier: str = NewTierOpt("the new patch"), path: str = NewPathOpt("the new patch"),
            summary: Optional[str] = typer.Option(None, "--summary", help="one-line summary "
                                                  "(also the DEP-3 Description)"),
            author: Optional[str] = typer.Option(None, "--author", help="DEP-3 Author: "
                                                 "'Name <email>' (required)"),
            target: Optional[Path] = TargetOpt, lock_wait: float = LockWaitOpt,
            offline: bool = OfflineOpt(),
            inventory: Optional[Path] = InventoryOpt, accept_new: bool = AcceptNewOpt,
            as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Turn hand edits on a host's managed tree into a new patch at the end of the series;
    the host is only read. Checked on the pin + series before anything is written."""
    from dataclasses import asdict

    from patchset.authoring.capture import CaptureMeta, capture as do_capture, check_meta
    s = load(series)
    meta = CaptureMeta(name=name, tier=tier, path=path, summary=summary, author=author)
    check_meta(s, meta)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        transport = resolver.transport(host, provision_local=False)
        result = do_capture(s, transport, meta, progress=RichProgress(), offline=offline,
                            lock_wait=lock_wait)
    if as_json:
        emit_json(asdict(result))
    else:
        deps = f" (depends: {', '.join(result.depends)})" if result.depends else ""
        term().print(f"{result.name}  {result.file}  from {result.host}:{result.target}{deps}",
                     markup=False)
        say(f"captured {len(result.files)} file(s) into {result.manifest}; {result.host} "
            "was not changed")
