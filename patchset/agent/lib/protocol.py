"""The agent's wire protocol: one JSON request in, JSON lines out (events, then one result).

Versioned: the controller stamps `protocol` in every request; an agent of another version
refuses it (kind `protocol`) instead of guessing, so a stale copy can never half-run a
newer request. Out: zero or more `{"event": ...}` progress lines, then exactly one
`{"result": {...}, "protocol": N}` line. What a request and a result hold, per op, is
wire.py (typed, exact types checked on both sides); a result is `{"ok": true, ...}` or
`{"ok": false, "error": {"kind", "message", "details"}}` (wire.Failure); the controller
maps the kinds to its errors in one place (patchset/transport.py, `raise_for`).
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any, Callable

from .records import Event

PROTOCOL = 3      # 2: typed requests and results (wire.py); 3: adopt's inventory says what it could not read (special, executable, not_read, deferred) and commits their files


def ended(code: int | None, shell: bool = False) -> str:
    """How a process ended, from its exit status: a kill is named as a kill, never as a
    failure to start. A signal death is a negative status from Python's subprocess, 128+N
    from a `shell` (the remote command line of an SSH transport), and no status at all
    over SSH when the shell exec'd the agent: OpenSSH then sends `exit-signal`, which
    paramiko drops. (Not 128+N from git itself: git exits 129 on a usage error.)"""
    if code is None or (shell and code == -1):
        return "ended without an exit status (killed by a signal, or the connection dropped)"
    number = -code if code < 0 else code - 128 if shell and 128 < code < 160 else 0
    try:
        name = signal.Signals(number).name if number else ""
    except ValueError:
        name = ""
    if not name:
        return f"exited {code}"
    return f"was killed by {name}" + (f" (exit {code})" if code > 0 else "")


def killed(code: int | None, shell: bool = False) -> bool:
    """Did the process end by a signal (or with no status), as `ended` reads it?"""
    return not ended(code, shell).startswith("exited ")


def result_line(result: dict[str, Any]) -> str:
    return json.dumps({"result": result, "protocol": PROTOCOL}, sort_keys=True)


class Events:
    """JSON lines on stdout; a closed stdout (SSH gone) stops the events, not the work.
    In-process (a local transport), `sink` receives each event instead."""

    def __init__(self, stream: Any = None, sink: Callable[[Event], None] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.sink = sink
        self.alive = True

    def __call__(self, event: str, **data: Any) -> None:
        self.emit(Event(event=event, **data))

    def emit(self, event: Event) -> None:
        if not self.alive:
            return
        if self.sink is not None:
            self.sink(event)
            return
        try:
            self.stream.write(json.dumps(event.to_json(), sort_keys=True) + "\n")
            self.stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.alive = False
