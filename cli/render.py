"""What the commands print with: the terminal (rich on a TTY, plain when piped; control
characters escaped in whatever is printed), messages on stderr, JSON on stdout, and the
progress views (RichProgress for library tasks, DeployView for restarts and /health
waits: deploy, apply --restart, bisect, rollout).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .. import validate
from ..agent.lib.records import Event

if TYPE_CHECKING:                      # imported where the first bar is drawn
    from rich.progress import Progress, TaskID


def printable_block(text: str) -> str:
    """Multi-line text (a diff, a journal tail): each line escaped, the breaks kept."""
    return "\n".join(validate.printable(line) for line in text.split("\n"))


def term(stderr: bool = False):
    """Rich on a terminal; plain, uncoloured and never truncated when piped. Every string
    printed through it has its control characters escaped (data from a host or a patch
    must not move the cursor or rewrite the screen); `esc()` also escapes rich markup in
    values interpolated into a markup string."""
    from rich.console import Console

    class SafeConsole(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            super().print(*(printable_block(o) if isinstance(o, str) else o
                            for o in objects), **kwargs)

    tty = (sys.stderr if stderr else sys.stdout).isatty()
    return SafeConsole(stderr=stderr, highlight=False, soft_wrap=True, emoji=False,
                       width=None if tty else 1000, no_color=not tty)


def esc(value: Any) -> str:
    """A value for a rich markup string: markup and control characters escaped (the one
    terminal helper, patchset/escaping.py)."""
    from ..escaping import for_terminal
    return for_terminal(value)


def host_error(host: str, error: str) -> None:
    """A host's failure inside a listing: on stderr (stdout holds only the listing)."""
    print(f"{validate.printable(str(host))}: {validate.printable(str(error))}", file=sys.stderr)


def emit_json(value: Any) -> None:
    import json                # only --json output needs it
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def say(message: str) -> None:
    """A message on stderr: through rich on a terminal; piped, the same text printed as it
    is (no colour or wrapping to add there)."""
    if sys.stderr.isatty():
        term(stderr=True).print(message, markup=False, emoji=False)
    else:
        print(printable_block(message), file=sys.stderr, flush=True)


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
            from rich.progress import (BarColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn)
            columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                       TimeElapsedColumn()]
            with Progress(*columns, console=term(stderr=True), transient=True) as bar:
                task = bar.add_task(description, total=total)
                yield lambda n: bar.advance(task, n)
        return _task()


class DeployView:
    """Deploy progress on stderr: a rich bar per /health wait on a TTY, plain lines when
    piped (the first wait, then one line every PLAIN_EVERY seconds, then the outcome)."""

    PLAIN_EVERY = 30.0

    def __init__(self, host: str | None = None) -> None:
        self.tty = sys.stderr.isatty()
        self.host = host               # prefixes every line (several hosts in a row)
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.printed: dict[tuple, float] = {}

    def __enter__(self) -> "DeployView":
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def event(self, ev: Event) -> None:
        kind, role = ev.event, ev.role or ""
        rollback = " (rollback)" if ev.phase == "rollback" else ""
        if kind == "step":
            self._line(str(ev.message))
        elif kind == "restart":
            self._stop()
            self.printed.clear()
            self._line(f"{role}: restarting {ev.unit} ({ev.reason})")
        elif kind == "healthy":
            self._stop()
            self._line(f"{role}: healthy after {ev.elapsed or 0.0:.1f}s{rollback}")
        elif kind == "wait":
            self._wait(ev, role, rollback)

    def _wait(self, ev: Event, role: str, rollback: str) -> None:
        elapsed, timeout = ev.elapsed or 0.0, ev.timeout or 0.0
        what = (f"{self.host}: " if self.host else "") + (
            f"{role}: waiting for /health{rollback} ({ev.detail})")
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
            assert self.task is not None        # added with the bar
            self.bar.update(self.task, completed=min(elapsed, timeout), description=what)
            return
        key = (role, ev.phase)
        last = self.printed.get(key)
        if last is None:
            self._line(f"{role}: waiting for {ev.url}{rollback} (timeout {timeout:.0f}s)")
            self.printed[key] = elapsed
        elif elapsed - last >= self.PLAIN_EVERY:
            self._line(f"{role}: still waiting after {elapsed:.0f}s ({ev.detail})")
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
