"""A rollout's JSON-lines log: written one synced event a line, read back by `--resume`
through ONE strict reader into typed records.

Why strict: the log decides what a resume does to hosts (which steps are done, which
state each host is restored to, how the gates judge). It is a file on disk that a kill
can cut, a disk can damage and a person can edit; each of those must be bad input named
`LOG:LINE: field` (exit 2) before a host is touched, not a crash after one changed or a
gate that silently judges less. The plan goes through the same validators as the
command's options (isolate/rollout/rolloutplan.py).

Why a lock: two drivers of one rollout (an operator resuming a run that is only slow)
would change and roll back the same hosts against each other; the log's `ID.lock` is
held with flock for the whole run or resume, and a second one is refused.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from patchset.agent.lib import bounded
from patchset.errors import LockedError, PatchsetError, UsageError

from patchset.isolate.search.hoststate import HostState
from patchset.isolate.rollout.rolloutplan import (ON_UNKNOWN, Change, Settings, Step, Where,
                                                  _mapping, _names, _typed)

LOG_LIMIT = 64 * 2**20
GATES = ("health", "audit", "throughput", "drift")
VERDICTS = ("pass", "fail", "unknown", "skipped")
ENDED = ("done", "done-unverified", "rolled-back")   # `rollback-failed`: resumable
Say = Callable[[str], None]


# ---------------------------------------------------------------- records

@dataclass
class GateResult:
    """One gate of one step: pass, fail or unknown (it could not decide), and why."""

    gate: str
    host: str
    verdict: str                        # pass | fail | unknown | skipped
    why: str
    figures: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Before:
    """A host's baselines taken before its change: its failing high findings (so only
    new ones fail the step) and the tokens/s of the short load (None: not measured)."""

    severe: tuple[dict, ...] = ()
    tokens_per_second: float | None = None
    throughput_why: str = ""

    def to_json(self) -> dict:
        return {"severe": list(self.severe), "tokens_per_second": self.tokens_per_second,
                "throughput_why": self.throughput_why}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> "Before":
        _mapping(data, "before", where, {"severe", "tokens_per_second", "throughput_why"},
                 required=("severe", "tokens_per_second", "throughput_why"))
        severe = _typed(data["severe"], list, "before.severe", where)
        for i, f in enumerate(severe):
            _mapping(f, f"before.severe[{i}]", where, {"id", "subject", "message"},
                     required=("id", "subject", "message"))
            for key in ("id", "subject", "message"):
                _typed(f[key], str, f"before.severe[{i}].{key}", where)
        tps = _typed(data["tokens_per_second"], (int, float, type(None)),
                     "before.tokens_per_second", where)
        if tps is not None and not tps >= 0:
            raise UsageError(f"{where('before.tokens_per_second')}: {tps!r} is below 0")
        return cls(tuple(severe), None if tps is None else float(tps),
                   _typed(data["throughput_why"], str, "before.throughput_why", where))


@dataclass(frozen=True)
class Saved:
    """A host's state saved before its step (what a rollback restores) and its baselines."""

    step: int
    state: HostState
    before: Before


@dataclass(frozen=True)
class Plan:
    id: str
    change: Change
    steps: tuple[Step, ...]
    on_unknown: str
    settings: Settings


@dataclass
class LogState:
    """Everything a resume needs from the log, typed and checked whole."""

    plan: Plan
    done: list[int] = field(default_factory=list)
    saved: dict[str, Saved] = field(default_factory=dict)
    gates: list[dict] = field(default_factory=list)      # results of the done steps
    stopped: str | None = None
    rolled_back: list[str] = field(default_factory=list)  # hosts put back (ok)
    ended: str | None = None                              # the end's outcome
    patches: frozenset = frozenset()                      # the series' patch names


# ---------------------------------------------------------------- writing

def state_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "patchset" / "rollout"


class Log:
    """The log as written: one event a line, flushed and synced, so a kill leaves every
    finished event on disk. A kill mid-write leaves a torn last line: it is cut off
    before the first append (the reader drops it too), never glued to the next event."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tail_checked = False

    def write(self, event: str, **data: Any) -> dict:
        record = {"event": event, "at": _now(), **data}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{self.path}: not a regular file")
            if not self._tail_checked:
                _cut_torn_tail(fd)
                self._tail_checked = True
            os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return record


def _cut_torn_tail(fd: int) -> None:
    """Truncate the file to the end of its last complete line (synced)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    end = size
    while end > 0:
        start = max(0, end - 65536)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            end = start + at + 1
            break
        end = start
    os.ftruncate(fd, end)
    os.fsync(fd)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the rollout's lock (`ID.lock` beside its log) for the block; refused (exit 4)
    while another process holds it, naming the rollout and that process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_suffix(".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise LockedError(f"rollout {path.stem}: another patchset process (pid "
                              f"{holder}) is driving it ({lock}); wait for it to end, or "
                              "stop that process and --resume") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------- reading

def check_regular(path: Path) -> None:
    """A log given to resume must be a regular file itself: a link is refused, not
    followed (its lock and appends would land beside another file)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the rollout log: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path}: not a regular file (a link or special file): give the "
                         "rollout log itself")


def lines(path: Path) -> list[tuple[int, dict]]:
    """(line number, event) of every complete line; a last line without its newline (a
    kill mid-write) is dropped. Refused: a link or anything but a regular file, a line
    that is not one JSON object with an `event`."""
    check_regular(path)
    try:
        text = bounded.read_text(path, LOG_LIMIT, "rollout log")
    except bounded.InputError as exc:
        raise UsageError(str(exc)) from None
    out = []
    for n, line in enumerate(text.split("\n")[:-1], 1):
        try:
            record = bounded.loads(line, f"{path}:{n}")
        except bounded.InputError as exc:
            raise UsageError(f"{path}:{n}: not a JSON line this tool wrote ({exc.message}):"
                             " damaged") from None
        if not isinstance(record, dict) or not isinstance(record.get("event"), str):
            raise UsageError(f"{path}:{n}: event: missing (damaged)")
        out.append((n, record))
    return out


# event -> (required keys, optional keys), besides `event` and `at`
EVENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "plan": (("id", "change", "steps", "on_unknown", "settings"), ()),
    "step-start": (("step", "hosts"), ()),
    "saved": (("step", "host", "state", "before"), ()),
    "changed": (("step", "host", "ok", "restarted"), ("target", "error")),
    "gates": (("step", "host", "results"), ()),
    "step-done": (("step",), ()),
    "stop": (("step", "why"), ()),
    "rollback": (("host", "ok"), ("restarted", "state", "error")),
    "resume": (("done",), ()),
    "end": (("outcome", "rolled_back"), ("unknown_accepted",)),
}


def read(path: Path, series: Any) -> LogState:
    """The whole log as typed records, every line checked (see the module's docstring)."""
    events = lines(path)
    if not events or events[0][1]["event"] != "plan":
        raise UsageError(f"{path}:1: event: not a rollout plan (damaged)")
    state = LogState(_plan(events[0][1], _namer(path, 1), series),
                     patches=frozenset(p.name for p in series.patches))
    for n, event in events[1:]:
        where = _namer(path, n)
        if state.ended is not None:
            raise UsageError(f"{where('event')}: {event['event']!r} after the rollout's end")
        _shape(event, where)
        _READERS[event["event"]](state, event, where)
    return state


def _namer(path: Path, n: int) -> Where:
    return lambda key: f"{path}:{n}: {key}"


def _shape(event: dict, where: Where) -> None:
    kind = event["event"]
    if kind not in EVENTS or kind == "plan":
        raise UsageError(f"{where('event')}: {kind!r} is no event of a rollout log (damaged)")
    required, optional = EVENTS[kind]
    _mapping(event, "event", where, {"event", "at", *required, *optional}, required)
    _typed(event.get("at", ""), str, "at", where)
    if "step" in event:
        _typed(event["step"], int, "step", where)
    if "host" in event:
        _typed(event["host"], str, "host", where)


def _plan(event: dict, where: Where, series: Any) -> Plan:
    _mapping(event, "plan", where, {"event", "at", *EVENTS["plan"][0]}, EVENTS["plan"][0])
    steps = _typed(event["steps"], list, "steps", where)
    on_unknown = _typed(event["on_unknown"], str, "on_unknown", where)
    if on_unknown not in ON_UNKNOWN:
        raise UsageError(f"{where('on_unknown')}: {on_unknown!r}: stop or continue")
    settings_where: Where = lambda k: where("settings" if k == "settings" else f"settings.{k}")
    return Plan(_typed(event["id"], str, "id", where),
                Change.from_json(event["change"], where, series),
                tuple(Step.from_json(s, where, i) for i, s in enumerate(steps)),
                on_unknown, Settings.from_json(event["settings"], settings_where))


def _step_of(state: LogState, event: dict, where: Where) -> Step:
    """The plan's step the event names, which must be the one under way: the first not
    done (events of a finished step or of one not begun are damaged)."""
    steps = state.plan.steps
    number = event["step"]
    if state.stopped is not None and event["event"] != "stop":
        raise UsageError(f"{where('event')}: {event['event']!r} after the rollout stopped")
    if len(state.done) == len(steps) or number != steps[len(state.done)].number:
        raise UsageError(f"{where('step')}: {number} is not the step under way (damaged)")
    step = steps[len(state.done)]
    if "host" in event and event["host"] not in step.hosts:
        raise UsageError(f"{where('host')}: {event['host']} is not a host of step {number}")
    return step


def _on_step_start(state: LogState, event: dict, where: Where) -> None:
    step = _step_of(state, event, where)
    if _names(event["hosts"], "hosts", where) != step.hosts:
        raise UsageError(f"{where('hosts')}: not the hosts of step {step.number}")


def _on_saved(state: LogState, event: dict, where: Where) -> None:
    _step_of(state, event, where)
    host = event["host"]
    if host in state.saved:
        raise UsageError(f"{where('host')}: {host} saved twice (damaged)")
    try:
        saved = HostState.from_json(event["state"], where("state"))
    except PatchsetError as exc:
        raise UsageError(str(exc)) from None
    if saved.host != host:
        raise UsageError(f"{where('state.host')}: {saved.host!r}, in the line of {host}")
    strange = [n for n in saved.applied + saved.gates_off if n not in state.patches]
    if strange:      # a restore would silently leave them out: the state is not restorable
        raise UsageError(f"{where('state')}: {', '.join(strange)}: not in the series")
    state.saved[host] = Saved(event["step"], saved, Before.from_json(event["before"], where))


def _on_changed(state: LogState, event: dict, where: Where) -> None:
    _step_of(state, event, where)
    _typed(event["ok"], bool, "ok", where)
    if event["host"] not in state.saved:
        raise UsageError(f"{where('host')}: {event['host']} changed before it was saved")


def _on_gates(state: LogState, event: dict, where: Where) -> None:
    _step_of(state, event, where)
    for i, r in enumerate(_typed(event["results"], list, "results", where)):
        at = f"results[{i}]"
        _mapping(r, at, where, {"gate", "host", "verdict", "why", "figures"},
                 ("gate", "host", "verdict", "why", "figures"))
        if r["gate"] not in GATES or r["verdict"] not in VERDICTS or r["host"] != event["host"]:
            raise UsageError(f"{where(at)}: not a gate result of {event['host']} (damaged)")
        _typed(r["why"], str, f"{at}.why", where)
        _typed(r["figures"], dict, f"{at}.figures", where)
        state.gates.append(dict(r, step=event["step"]))


def _on_step_done(state: LogState, event: dict, where: Where) -> None:
    step = _step_of(state, event, where)
    unsaved = [h for h in step.hosts if h not in state.saved]
    if unsaved:
        raise UsageError(f"{where('step')}: step {step.number} done, but "
                         f"{', '.join(unsaved)} never saved (damaged)")
    state.done.append(step.number)


def _on_stop(state: LogState, event: dict, where: Where) -> None:
    if state.stopped is not None:
        raise UsageError(f"{where('event')}: a second stop (damaged)")
    _step_of(state, event, where)
    state.stopped = _typed(event["why"], str, "why", where)


def _on_rollback(state: LogState, event: dict, where: Where) -> None:
    if state.stopped is None or event["host"] not in state.saved:
        raise UsageError(f"{where('host')}: a rollback of {event['host']} that no stop or "
                         "saved state explains (damaged)")
    if _typed(event["ok"], bool, "ok", where) and event["host"] not in state.rolled_back:
        state.rolled_back.append(event["host"])


def _on_resume(state: LogState, event: dict, where: Where) -> None:
    _typed(event["done"], list, "done", where)


def _on_end(state: LogState, event: dict, where: Where) -> None:
    outcome = _typed(event["outcome"], str, "outcome", where)
    if outcome == "rollback-failed":           # an older run's: its rollback is resumable
        return
    if outcome not in ENDED:
        raise UsageError(f"{where('outcome')}: {outcome!r} (damaged)")
    state.ended = outcome


_READERS: dict[str, Callable[[LogState, dict, Where], None]] = {
    "step-start": _on_step_start, "saved": _on_saved, "changed": _on_changed,
    "gates": _on_gates, "step-done": _on_step_done, "stop": _on_stop,
    "rollback": _on_rollback, "resume": _on_resume, "end": _on_end,
}


def latest_unfinished(directory: Path | None = None,
                      say: Say = lambda _: None) -> Path | None:
    """The newest log whose rollout has not ended. Only regular files are looked at (a
    link or a FIFO named *.jsonl is skipped, never followed); a damaged log is skipped
    and said, so one bad file cannot hide every other rollout."""
    directory = directory or state_dir()
    found = []
    for path in directory.glob("*.jsonl"):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            found.append((info.st_mtime, path))
    for _, path in sorted(found, reverse=True):
        try:
            ended = any(e["event"] == "end" and e.get("outcome") in ENDED
                        for _, e in lines(path))
        except UsageError as exc:
            say(f"skipped a damaged rollout log: {exc}")
            continue
        if not ended:
            return path
    return None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
