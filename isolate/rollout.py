"""`patchset rollout`: roll one change (a selection, a revert, a gate flip) through hosts
in steps, a canary first, then batches, with gates after each step measured, not
declared: health, the audit of the changed servers, throughput against a short load
sent before the change, and the drift A/B against a saved baseline run.

A failing gate rolls every host this rollout changed back to the state saved before its
step (isolate/hoststate.py: the same save and restore as bisect) and stops. A gate that
cannot decide (unknown) stops too by default: a rollout that cannot show a step is safe
must not widen it; `--on-unknown continue` accepts that risk and says so in the log.

Every step is a JSON line in a log under the state dir, written before its side effects
(the saved states) and after them (changed, gated, done). `--resume` reads the log:
finished steps are never redone; a step cut off midway converges its hosts to the
target (idempotent: a host already there is neither changed nor restarted) and gates
them, so no step's side effect happens twice.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from patchset.errors import Exit, PatchsetError, UsageError

from . import hoststate
from .hoststate import DrivenHost, HostState

Say = Callable[[str], None]
GATES = ("health", "audit", "throughput", "drift")
SEVERE = ("high",)
LOG_LIMIT = 64 * 2**20


# ---------------------------------------------------------------- the change and the plan

@dataclass(frozen=True)
class Change:
    """What the rollout changes on each host. `select`: the exact patches every host
    then carries (a selection, dependency-closed); `revert`: these and their dependents
    leave each host's own set; `gate_off`: these applied patches run with their gate
    unset (an env change, no code change)."""

    select: tuple[str, ...] | None = None
    revert: tuple[str, ...] = ()
    gate_off: tuple[str, ...] = ()
    label: str = ""

    def target(self, series: Any, saved: HostState) -> HostState:
        """The state `saved` is rolled to."""
        applied = list(self.select) if self.select is not None else list(saved.applied)
        for name in self.revert:
            gone = {name, *hoststate.dependents(series, applied, name)}
            applied = [n for n in applied if n not in gone]
        gates = sorted(set(saved.gates_off) | {g for g in self.gate_off if g in applied})
        return HostState(saved.host, tuple(p.name for p in series.patches
                                           if p.name in applied), tuple(gates))

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Step:
    """One step: the hosts (and, for a role canary, the roles) it changes."""

    number: int
    kind: str                           # canary | batch
    hosts: tuple[str, ...]
    roles: dict[str, list[str]] = field(default_factory=dict)   # host -> only these roles

    def to_json(self) -> dict:
        return {"number": self.number, "kind": self.kind, "hosts": list(self.hosts),
                "roles": dict(self.roles)}


def make_plan(hosts: list[str], canary: str | None, batch: int,
              roles_of: Callable[[str], list[str]]) -> list[Step]:
    """Canary (`HOST` or `HOST:ROLE`, default the first host), then batches of `batch`
    hosts in the given order; a role canary's host finishes in the first batch."""
    if batch < 1:
        raise UsageError("--batch: at least 1 host a step")
    if not hosts:
        raise UsageError("no hosts to roll out to")
    if len(set(hosts)) != len(hosts):
        raise UsageError(f"hosts: {', '.join(sorted({h for h in hosts if hosts.count(h) > 1}))}"
                         " named twice")
    bare = [h for h in hosts if not roles_of(h)]
    if bare:
        raise UsageError(f"{', '.join(bare)}: no prefill or decode role in the inventory: "
                         "nothing serves the tree there to gate on")
    name, _, role = (canary or hosts[0]).partition(":")
    if name not in hosts:
        raise UsageError(f"--canary {canary}: not one of the hosts rolled out to "
                         f"({', '.join(hosts)})")
    if role and role not in roles_of(name):
        raise UsageError(f"--canary {canary}: {name} has no {role!r} role "
                         f"(it has {', '.join(roles_of(name)) or 'none'})")
    steps = [Step(0, "canary", (name,), {name: [role]} if role else {})]
    rest = [h for h in hosts if h != name]
    if role:
        rest.insert(0, name)          # its other roles still run the old code
    for i in range(0, len(rest), batch):
        steps.append(Step(len(steps), "batch", tuple(rest[i:i + batch])))
    return steps


# ---------------------------------------------------------------- gates

@dataclass
class GateResult:
    """One gate of one step: pass, fail or unknown (it could not decide), and why."""

    gate: str
    host: str
    verdict: str                        # pass | fail | unknown | skipped
    why: str
    figures: dict = field(default_factory=dict)


class Gates(Protocol):
    """What a rollout measures; the real one is `FleetGates`, the unit tests use fakes."""

    def before(self, host: str) -> dict:
        """Baselines taken before the host changes (findings, throughput)."""

    def check(self, host: str, target: HostState, roles: list[str], before: dict,
              deployed: bool) -> list[GateResult]:
        """Every gate of the changed host, against its baselines."""


def blocking(results: list[GateResult], on_unknown: str) -> list[GateResult]:
    """The gate results that stop the rollout: every fail, and every unknown unless
    `on_unknown` is `continue`."""
    return [r for r in results if r.verdict == "fail" or
            (r.verdict == "unknown" and on_unknown != "continue")]


def drift_verdict(decision: Any) -> tuple[str, str]:
    """The three-valued gate from a drift Decision: `above` beyond the tolerance fails;
    above the noise but bounded below the tolerance, or bounded, passes (within);
    inconclusive is unknown."""
    if decision.outcome == "above":
        if decision.upper is not None and decision.upper < decision.tolerance:
            return "pass", f"within: above the noise but below the tolerance ({decision.why})"
        return "fail", f"above: {decision.why}"
    if decision.outcome == "bounded":
        return "pass", f"within: {decision.why}"
    return "unknown", f"unknown: {decision.why}; to decide: {decision.needs}"


def new_severe(before: list[dict], after: list[dict]) -> list[dict]:
    """Failing high findings after the step that were not there before it (by check id
    and subject): a finding the fleet already had does not fail the step."""
    seen = {(f["id"], f["subject"]) for f in before}
    return [f for f in after if (f["id"], f["subject"]) not in seen]


def severe(report: Any) -> list[dict]:
    """An audit report's failing high-severity findings, as {id, subject, message}."""
    return [{"id": f.id, "subject": f.subject, "message": f.message}
            for f in report.findings if f.status == "fail" and f.severity in SEVERE]


def states_off(report: Any, target: HostState, units: list[str]) -> tuple[list[str], list[str]]:
    """(mismatches, unknowns) of the patch states of `units` against `target`: a target
    patch must run (active, inert or gated-off; gated-off when its gate is flipped off),
    any other patch must be not-applied, and nothing may be drifted."""
    wrong, unknown = [], []
    for host in report.hosts:
        for st in host.states:
            if st.server not in units:
                continue
            where = f"{st.server} {st.patch}: {st.state}"
            if st.state == "unknown":
                unknown.append(where)
            elif st.state == "drifted":
                wrong.append(f"{where} (runs code that is not the tree's)")
            elif st.patch in target.gates_off and st.state not in ("gated-off", "inert"):
                wrong.append(f"{where} (its gate should be off)")
            elif st.patch in target.applied and st.state == "not-applied":
                wrong.append(f"{where} (should be applied)")
            elif st.patch not in target.applied and st.state != "not-applied":
                wrong.append(f"{where} (should be not-applied)")
    return wrong, unknown


# ---------------------------------------------------------------- the log

def state_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "patchset" / "rollout"


class Log:
    """The rollout's JSON-lines log: one event a line, flushed and synced as written, so
    a kill leaves every finished event on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, event: str, **data: Any) -> dict:
        record = {"event": event, "at": _now(), **data}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return record

    def read(self) -> list[dict]:
        """Every complete event; a last line cut by a kill is dropped."""
        from patchset import inputfile
        lines = inputfile.read_text(self.path, LOG_LIMIT, "rollout log").splitlines()
        out = []
        for n, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                if n == len(lines):
                    break
                raise UsageError(f"{self.path}:{n}: not a JSON line (not a log this tool "
                                 "wrote: damaged)") from None
            if not isinstance(record, dict) or not isinstance(record.get("event"), str):
                raise UsageError(f"{self.path}:{n}: event: missing (damaged)")
            out.append(record)
        return out


def latest_unfinished(directory: Path | None = None) -> Path | None:
    """The newest log whose rollout has no `end` event."""
    directory = directory or state_dir()
    logs = sorted(directory.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in logs:
        if not any(e["event"] == "end" for e in Log(path).read()):
            return path
    return None


# ---------------------------------------------------------------- the run

@dataclass
class Rollout:
    """A rollout as planned and as it went (what `--json` prints)."""

    id: str
    change: Change
    steps: list[Step]
    log: str
    done: list[int] = field(default_factory=list)
    gates: list[dict] = field(default_factory=list)
    stopped: str | None = None
    rolled_back: list[str] = field(default_factory=list)
    rollback_error: str | None = None
    resumed: bool = False
    dry_run: bool = False

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.steps) and not self.stopped

    @property
    def exit_code(self) -> int:
        if self.rollback_error:
            return Exit.FAILED
        if self.stopped:
            return Exit.FINDINGS
        return Exit.OK

    def to_json(self) -> dict:
        return {"id": self.id, "change": self.change.to_json(),
                "steps": [s.to_json() for s in self.steps], "log": self.log,
                "done": self.done, "gates": self.gates, "stopped": self.stopped,
                "rolled_back": self.rolled_back, "rollback_error": self.rollback_error,
                "resumed": self.resumed, "dry_run": self.dry_run, "finished": self.finished}


@dataclass
class Fleet:
    """The hosts of a rollout as it drives them, by name."""

    hosts: dict[str, DrivenHost]
    gates: Gates
    on_unknown: str = "stop"            # stop | continue


def start(fleet: Fleet, change: Change, steps: list[Step], log_dir: Path | None = None,
          dry_run: bool = False, say: Say = lambda _: None,
          settings: dict | None = None) -> Rollout:
    """A new rollout: its plan logged (not with --dry-run: nothing is written), then run.
    `settings`: how the gates were built (JSON), logged so a resume gates the same way."""
    rid = _new_id()
    path = (log_dir or state_dir()) / f"{rid}.jsonl"
    run = Rollout(rid, change, steps, str(path), dry_run=dry_run)
    if dry_run:
        return run
    preflight(fleet, steps, say)
    Log(path).write("plan", id=rid, change=change.to_json(),
                    steps=[s.to_json() for s in steps], on_unknown=fleet.on_unknown,
                    settings=settings or {})
    return _go(fleet, run, Log(path), {}, say)


def preflight(fleet: Fleet, steps: list[Step], say: Say) -> None:
    """Every host of the plan must be restorable before the first one changes: a host of
    the last batch that could not be rolled back is refused now, not after the canary
    (each state is saved again right before its own step)."""
    for name in dict.fromkeys(h for s in steps for h in s.hosts):
        hoststate.save(fleet.hosts[name])
    say(f"{len(fleet.hosts)} host(s) restorable: applied patches are the series' files, "
        "units as deploy renders them")


def resume(fleet_for: Callable[[list[str], dict], Fleet], path: Path,
           say: Say = lambda _: None) -> Rollout:
    """Continue the rollout of log `path` after its last finished step, its gates built
    from the settings the plan logged (`fleet_for(hosts, settings)`), never from the
    resuming command's options: a resumed rollout gates as it started."""
    events = Log(path).read()
    if not events or events[0]["event"] != "plan":
        raise UsageError(f"{path}:1: event: not a rollout plan (damaged)")
    if any(e["event"] == "end" for e in events):
        raise UsageError(f"{path}: that rollout has ended; nothing to resume")
    plan = events[0]
    change = Change(**{k: (tuple(v) if isinstance(v, list) else v)
                       for k, v in plan["change"].items()})
    steps = [Step(s["number"], s["kind"], tuple(s["hosts"]), dict(s.get("roles") or {}))
             for s in plan["steps"]]
    run = Rollout(plan["id"], change, steps, str(path), resumed=True)
    run.done = [e["step"] for e in events if e["event"] == "step-done"]
    saved = {e["host"]: HostState.from_json(e["state"], f"{path}: saved")
             for e in events if e["event"] == "saved"}
    settings = plan.get("settings") or {}
    if not isinstance(settings, dict):
        raise UsageError(f"{path}:1: settings: not a mapping (damaged)")
    fleet = fleet_for(sorted({h for s in steps for h in s.hosts}), settings)
    fleet.on_unknown = plan.get("on_unknown", "stop")
    log = Log(path)
    stopped = next((e for e in events if e["event"] == "stop"), None)
    log.write("resume", done=run.done)
    if stopped is not None:         # killed during its rollback: finish that, nothing else
        run.stopped = str(stopped.get("why"))
        say(f"resuming rollout {run.id}: it stopped ({run.stopped}); finishing the rollback")
        _roll_back(fleet, run, log, saved, say)
        _end(run, log)
        return run
    say(f"resuming rollout {run.id}: steps done {run.done or 'none'}")
    return _go(fleet, run, log, saved, say)


def _go(fleet: Fleet, run: Rollout, log: Log, saved: dict[str, HostState],
        say: Say) -> Rollout:
    for step in run.steps:
        if step.number in run.done:
            continue
        try:
            stop = _step(fleet, run, step, log, saved, say)
        except (PatchsetError, OSError) as exc:
            stop = f"step {step.number}: {exc}"
        if stop:
            run.stopped = stop
            log.write("stop", step=step.number, why=stop)
            say(f"step {step.number}: STOP: {stop}; rolling back")
            _roll_back(fleet, run, log, saved, say)
            break
        run.done.append(step.number)
        log.write("step-done", step=step.number)
    _end(run, log)
    return run


def _end(run: Rollout, log: Log) -> None:
    log.write("end", outcome="done" if run.finished else "rolled-back" if not
              run.rollback_error else "rollback-failed", rolled_back=run.rolled_back)


def _step(fleet: Fleet, run: Rollout, step: Step, log: Log, saved: dict[str, HostState],
          say: Say) -> str | None:
    """Change the step's hosts, then gate them; the reason it stops, or None."""
    log.write("step-start", step=step.number, hosts=list(step.hosts))
    say(f"step {step.number} ({step.kind}): {', '.join(_label(step, h) for h in step.hosts)}")
    for name in step.hosts:
        t = fleet.hosts[name]
        if name not in saved:
            saved[name] = hoststate.save(t)
            before = fleet.gates.before(name)
            log.write("saved", step=step.number, host=name, state=saved[name].to_json(),
                      before=before)
        else:
            before = _before_of(log, name)
        target = run.change.target(t.series, saved[name])
        roles = step.roles.get(name) or t.roles
        restarted: list[str] = []
        deployed = True
        try:
            hoststate.converge(t, list(target.applied), list(target.gates_off), restarted,
                               roles=roles)
        except PatchsetError as exc:
            deployed = False
            log.write("changed", step=step.number, host=name, ok=False, error=str(exc),
                      restarted=restarted)
            results = [GateResult("health", name, "fail", f"the change failed: {exc}")]
        else:
            log.write("changed", step=step.number, host=name, ok=True, restarted=restarted,
                      target=target.to_json())
            results = fleet.gates.check(name, target, roles, before, deployed)
        for r in results:
            run.gates.append(dict(asdict(r), step=step.number))
            say(f"  {name}: {r.gate}: {r.verdict}: {r.why}")
        log.write("gates", step=step.number, host=name, results=[asdict(r) for r in results])
        stop = blocking(results, fleet.on_unknown)
        if stop:
            return "; ".join(f"{r.host} {r.gate} {r.verdict}: {r.why}" for r in stop)
    return None


def _before_of(log: Log, host: str) -> dict:
    return next((e.get("before") or {} for e in reversed(log.read())
                 if e["event"] == "saved" and e.get("host") == host), {})


def _roll_back(fleet: Fleet, run: Rollout, log: Log, saved: dict[str, HostState],
               say: Say) -> None:
    """Every host this rollout changed, back to its saved state (last changed first);
    the rollback goes on past a host that fails, and says which."""
    errors = []
    for name in reversed(list(saved)):
        try:
            restarted = hoststate.restore(fleet.hosts[name], saved[name])
        except (PatchsetError, OSError) as exc:
            errors.append(f"{name}: {exc}")
            log.write("rollback", host=name, ok=False, error=str(exc))
            continue
        run.rolled_back.append(name)
        log.write("rollback", host=name, ok=True, restarted=restarted,
                  state=saved[name].to_json())
        say(f"  {name}: rolled back to {', '.join(saved[name].applied) or 'no patches'}")
    if errors:
        run.rollback_error = "; ".join(errors)


def _label(step: Step, host: str) -> str:
    roles = step.roles.get(host)
    return f"{host}:{','.join(roles)}" if roles else host


def _new_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + \
        secrets.token_hex(3)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def describe(run: Rollout) -> list[str]:
    """The plan as lines (`--dry-run`)."""
    lines = [f"rollout {run.id}: {run.change.label}"]
    for step in run.steps:
        lines.append(f"  step {step.number} {step.kind}: "
                     f"{', '.join(_label(step, h) for h in step.hosts)}")
    lines.append(f"  gates after each step: {', '.join(GATES)}")
    return lines

