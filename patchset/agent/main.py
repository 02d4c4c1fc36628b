"""The agent's one entry point: every host operation, dispatched from one request.

`python3 -m patchset_agent BUNDLE_DIR` on a host (the bootstrap in patchset/transport.py
unpacks the bundle and runs it), `python -m patchset.agent BUNDLE_DIR` from a checkout,
or `serve(request, bundle, events)` in-process for a local tree. Whatever happens, the
last line on stdout is one result (patchset/agent/protocol.py).
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

from . import bounded, engine
from .protocol import ADOPT_OPS, GATHER_OPS, PROTOCOL, TREE_OPS, UNIT_OPS, Events, error, result_line

OPS = TREE_OPS + UNIT_OPS + GATHER_OPS + ADOPT_OPS
# ops that run in their own process even for a local tree: a deploy's transaction (and its
# rollback) must outlive a Ctrl-C or a closed terminal of the controller
ISOLATED_OPS = ("deploy",)


def serve(request: dict, bundle: Path, events: Events) -> dict:
    """One request -> its result (always a dict; an error is a result too)."""
    op, version = request.get("op"), request.get("protocol", PROTOCOL)
    if version != PROTOCOL:
        return error("protocol", f"the agent speaks protocol {PROTOCOL}, the request is "
                     f"protocol {version!r}: the controller and agent versions differ")
    if op in TREE_OPS:
        return engine.run(request, bundle)
    if op in UNIT_OPS:                   # imported per op: an apply loads neither (start-up)
        from . import deployer
        return deployer.execute(request, events)
    if op in GATHER_OPS:
        from . import gather
        return gather.run(request)
    if op in ADOPT_OPS:
        from . import adoption
        return adoption.run(request, bundle)
    shown = repr(op) if isinstance(op, str) and re.fullmatch(r"[a-z-]{1,32}", op) else "(not shown)"
    return error("usage", f"unknown op {shown}")


REQUEST_LIMIT = 64 * bounded.MIB     # the request names the shipped files; it holds none


def main(argv: list[str]) -> int:
    """Read BUNDLE_DIR/request.json, serve it, print events and the result line. SIGHUP
    is ignored: a dropped SSH connection stops the events, never the work."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    bundle = Path(argv[1]) if len(argv) > 1 else Path(".")
    events = Events()
    try:
        request = bounded.loads(bounded.read_bytes(bundle / "request.json", REQUEST_LIMIT,
                                                   "request"), "request.json")
    except bounded.InputError as exc:
        result = error("usage", f"no readable request in {bundle}: {exc}")
    else:
        result = serve(request, bundle, events)
    if events.alive:
        _write(result_line(result))
    return 0


def _write(line: str) -> None:
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass
