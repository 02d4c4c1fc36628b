"""The agent's one entry point: every host operation, dispatched from one request.

`python3 -m patchset_agent BUNDLE_DIR` on a host (the bootstrap in patchset/transport.py
unpacks the bundle and runs it), `python -m patchset.agent BUNDLE_DIR` from a checkout,
or `serve(request, bundle, events)` in-process for a local tree. Whatever happens, the
last line on stdout is one result (patchset/agent/lib/protocol.py).
"""

from __future__ import annotations

import importlib
import signal
import sys
from pathlib import Path

from .lib import bounded, wire
from .lib.protocol import Events, result_line

# ops that run in their own process even for a local tree: a deploy's transaction (and its
# rollback) must outlive a Ctrl-C or a closed terminal of the controller
ISOLATED_OPS = tuple(name for name, op in wire.OPS.items() if op.isolated)


def serve(request: wire.Request, bundle: Path, events: Events) -> wire.Result | wire.Failure:
    """One typed request -> its typed result (an error is a result too), served by the
    part of the program the op table names. The part is imported per op: an apply loads
    neither the deployer nor the gatherer (start-up)."""
    op = wire.OPS.get(request.op)
    if op is None:
        return wire.Failure("usage", f"unknown op {request.op!r}")
    part = importlib.import_module(f"{__package__}.{op.part}")
    result: wire.Result | wire.Failure = part.serve(request, bundle, events)
    return result


def serve_json(data: object, bundle: Path, events: Events) -> dict:
    """request.json's object -> the result object: decoded by wire (another protocol, an
    unknown op, a field of the wrong type are refused naming the field), served, encoded."""
    try:
        request = wire.decode_request(data)
    except wire.WireError as exc:
        return wire.encode_result(wire.Failure(exc.kind, str(exc)))
    return wire.encode_result(serve(request, bundle, events))


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
        result = wire.encode_result(
            wire.Failure("usage", f"no readable request in {bundle}: {exc}"))
    else:
        result = serve_json(request, bundle, events)
    if events.alive:
        _write(result_line(result))
    return 0


def _write(line: str) -> None:
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass
