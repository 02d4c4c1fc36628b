"""`patchset rollout`: roll one change (a selection, a revert, a gate flip) through hosts
in steps, a canary first, then batches, with gates after each step measured, not
declared: health, the audit of the changed servers, throughput against a short load
sent before the change, and the drift A/B against a saved baseline run.

A failing gate rolls every host this rollout changed back to the state saved before its
step (isolate/search/hoststate.py: the same save and restore as bisect) and stops. A gate that
cannot decide (unknown) stops too by default: a rollout that cannot show a step is safe
must not widen it; `--on-unknown continue` accepts that risk and says so in the log.

Every step is a JSON line in a log under the state dir, written before its side effects
(the saved states) and after them (changed, gated, done). `--resume` reads the whole log
strictly into typed records first (isolate/rollout/rolloutlog.py; the plan through the same
validators as the options, isolate/rollout/rolloutplan.py), under the rollout's lock: finished
steps are never redone; a step cut off midway converges its hosts to the target
(idempotent: a host already there is neither changed nor restarted) and gates them, so
no step's side effect happens twice; a stopped rollout finishes (or retries) its
rollback.
"""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from patchset.errors import Exit, PatchsetError, UsageError

from patchset.isolate.search import hoststate
from patchset.isolate.search.hoststate import DrivenHost, HostState
from patchset.isolate.rollout.rolloutlog import (GATES, Before, GateResult, Log, LogState,
                                                 Saved, check_regular, latest_unfinished,
                                                 locked, state_dir)
from patchset.isolate.rollout.rolloutlog import read as read_log
from patchset.isolate.rollout.rolloutplan import Change, Settings, Step, check_steps, make_plan

__all__ = ["GATES", "Before", "Change", "GateResult", "Log", "Settings", "Step",
           "latest_unfinished", "make_plan", "read_log", "state_dir"]

Say = Callable[[str], None]
SEVERE = ("high",)


# ---------------------------------------------------------------- gates

class Gates(Protocol):
    """What a rollout measures; the real one is `FleetGates`, the unit tests use fakes."""

    def before(self, host: str) -> Before:
        """Baselines taken before the host changes (findings, throughput)."""

    def check(self, host: str, target: HostState, roles: list[str], before: Before,
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


def states_off(report: Any, target: HostState, units: list[str],
               patches: list[str]) -> tuple[list[str], list[str]]:
    """(mismatches, unknowns) of the patch states of `units` against `target`: a target
    patch must run (active, inert or gated-off; gated-off when its gate is flipped off),
    any other patch must be not-applied, and nothing may be drifted. Every (unit, patch
    of `patches`) must have been observed: a host whose facts were not gathered, or a
    pair with no state row, is unknown, never as intended."""
    wrong: list[str] = []
    unknown: list[str] = []
    if not report.hosts:
        return [], ["the audit gathered no facts of the host"]
    seen = set()
    for host in report.hosts:
        facts = getattr(host, "facts", None)
        if facts is not None and not getattr(facts, "reachable", True):
            return [], [f"facts not gathered: {getattr(facts, 'error', '') or 'unreachable'}"]
        for st in host.states:
            if st.server not in units:
                continue
            seen.add((st.server, st.patch))
            _judge_state(st, target, wrong, unknown)
    missing = [f"{u} {p}" for u in units for p in patches if (u, p) not in seen]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        unknown.append(f"no state observed of {', '.join(missing[:3])}{more}")
    return wrong, unknown


def _judge_state(st: Any, target: HostState, wrong: list[str], unknown: list[str]) -> None:
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


# ---------------------------------------------------------------- the run

@dataclass
class Rollout:
    """A rollout as planned and as it went (what `--json` prints)."""

    id: str
    change: Change
    steps: list[Step]
    log: str
    done: list[int] = field(default_factory=list)
    gates: list[dict] = field(default_factory=list)      # gated by this command
    logged_gates: list[dict] = field(default_factory=list)   # a resumed run's done steps'
    stopped: str | None = None
    rolled_back: list[str] = field(default_factory=list)
    rollback_error: str | None = None
    resumed: bool = False
    dry_run: bool = False

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.steps) and not self.stopped

    @property
    def unknown_accepted(self) -> int:
        """Gates of the steps done that could not decide and were let through
        (`--on-unknown continue`): the run is then not shown safe, only not shown unsafe."""
        return sum(1 for g in self.logged_gates + self.gates if g["verdict"] == "unknown"
                   and g["step"] in self.done)

    @property
    def outcome(self) -> str | None:
        if self.rollback_error:
            return "rollback-failed"
        if self.stopped:
            return "rolled-back"
        if self.finished:
            return "done-unverified" if self.unknown_accepted else "done"
        return None

    @property
    def exit_code(self) -> int:
        if self.rollback_error:
            return Exit.FAILED
        if self.stopped:
            return Exit.FINDINGS
        if self.unknown_accepted:
            return Exit.INCONCLUSIVE
        return Exit.OK

    def to_json(self) -> dict:
        return {"id": self.id, "change": self.change.to_json(),
                "steps": [s.to_json() for s in self.steps], "log": self.log,
                "done": self.done, "gates": self.gates, "logged_gates": self.logged_gates,
                "stopped": self.stopped,
                "rolled_back": self.rolled_back, "rollback_error": self.rollback_error,
                "resumed": self.resumed, "dry_run": self.dry_run, "finished": self.finished,
                "outcome": self.outcome, "unknown_accepted": self.unknown_accepted}


@dataclass
class Fleet:
    """The hosts of a rollout as it drives them, by name."""

    hosts: dict[str, DrivenHost]
    gates: Gates
    on_unknown: str = "stop"            # stop | continue


def start(fleet: Fleet | None, change: Change, steps: list[Step], log_dir: Path | None = None,
          dry_run: bool = False, say: Say = lambda _: None,
          settings: Settings | None = None) -> Rollout:
    """A new rollout: its plan logged (not with --dry-run: nothing is written), then run
    under the rollout's lock. `settings`: how the gates were built, logged so a resume
    gates the same way. A dry run drives no host: its `fleet` may be None."""
    rid = _new_id()
    path = (log_dir or state_dir()) / f"{rid}.jsonl"
    run = Rollout(rid, change, steps, str(path), dry_run=dry_run)
    if dry_run:
        return run
    assert fleet is not None                # None only for a dry run, which drives no host
    preflight(fleet, steps, say)
    with locked(path):
        log = Log(path)
        log.write("plan", id=rid, change=change.to_json(),
                  steps=[s.to_json() for s in steps], on_unknown=fleet.on_unknown,
                  settings=(settings or Settings()).to_json())
        return _go(fleet, run, log, {}, say)


def preflight(fleet: Fleet, steps: list[Step], say: Say) -> None:
    """Every host of the plan must be restorable before the first one changes: a host of
    the last batch that could not be rolled back is refused now, not after the canary
    (each state is saved again right before its own step)."""
    for name in dict.fromkeys(h for s in steps for h in s.hosts):
        hoststate.save(fleet.hosts[name])
    say(f"{len(fleet.hosts)} host(s) restorable: applied patches are the series' files, "
        "units as deploy renders them")


def resume(fleet_for: Callable[[list[str], Settings], Fleet], path: Path, series: Any,
           say: Say = lambda _: None) -> Rollout:
    """Continue the rollout of log `path` after its last finished step, its gates built
    from the settings the plan logged (`fleet_for(hosts, settings)`), never from the
    resuming command's options: a resumed rollout gates as it started. The whole log is
    read and checked (isolate/rollout/rolloutlog.py) under the rollout's lock before anything is
    written or any host touched. A rollout that stopped finishes its rollback: the hosts
    without a successful rollback are put back (a failed rollback is retried)."""
    check_regular(path)
    with locked(path):
        state = read_log(path, series)
        if state.ended is not None:
            raise UsageError(f"{path}: that rollout has ended ({state.ended}); nothing to "
                             "resume")
        fleet = _fleet_of(fleet_for, state, path)
        run = Rollout(state.plan.id, state.plan.change, list(state.plan.steps), str(path),
                      done=list(state.done), logged_gates=list(state.gates),
                      rolled_back=list(state.rolled_back), resumed=True)
        log = Log(path)
        log.write("resume", done=run.done)
        if state.stopped is not None:
            run.stopped = state.stopped
            say(f"resuming rollout {run.id}: it stopped ({run.stopped}); finishing the "
                "rollback")
            _roll_back(fleet, run, log, state.saved, say, skip=set(state.rolled_back))
            _end(run, log, say)
            return run
        say(f"resuming rollout {run.id}: steps done {run.done or 'none'}")
        return _go(fleet, run, log, dict(state.saved), say)


def _fleet_of(fleet_for: Callable[[list[str], Settings], Fleet], state: LogState,
              path: Path) -> Fleet:
    """The logged plan's hosts and gates; its steps checked as `make_plan` checks them,
    against the roles the inventory gives each host now."""
    plan = state.plan
    fleet = fleet_for(sorted({h for s in plan.steps for h in s.hosts}), plan.settings)
    check_steps(list(plan.steps), lambda h: fleet.hosts[h].roles if h in fleet.hosts
                else [], lambda key: f"{path}:1: {key}")
    fleet.on_unknown = plan.on_unknown
    return fleet


def _go(fleet: Fleet, run: Rollout, log: Log, saved: dict[str, Saved],
        say: Say) -> Rollout:
    for step in run.steps:
        if step.number in run.done:
            continue
        try:
            stop = _step(fleet, run, step, log, saved, say)
        except (PatchsetError, OSError) as exc:
            stop = f"step {step.number}: {exc}"
        if stop:
            _stop(fleet, run, log, saved, say, step, stop)
            break
        run.done.append(step.number)
        log.write("step-done", step=step.number)
    _end(run, log, say)
    return run


def _stop(fleet: Fleet, run: Rollout, log: Log, saved: dict[str, Saved], say: Say,
          step: Step, why: str) -> None:
    """Stop at `step` and roll every changed host back, even when the log cannot say so
    (a full disk must not leave hosts half-changed)."""
    run.stopped = why
    _record(log, say, "stop", step=step.number, why=why)
    say(f"step {step.number}: STOP: {why}; rolling back")
    _roll_back(fleet, run, log, saved, say)


def _record(log: Log, say: Say, event: str, **data: Any) -> None:
    """Log an event of the rollback path; a failing write is said, and the rollback goes
    on (what it does to the hosts matters more than the line)."""
    try:
        log.write(event, **data)
    except OSError as exc:
        say(f"  the log could not record {event!r}: {exc}")


def _end(run: Rollout, log: Log, say: Say) -> None:
    """The end line, unless the rollback failed: then the log stays open, so `--resume`
    (and its scan for the newest unfinished rollout) takes the rollback up again."""
    if run.outcome is None or run.rollback_error:
        return
    _record(log, say, "end", outcome=run.outcome, rolled_back=run.rolled_back,
            unknown_accepted=run.unknown_accepted)


def _step(fleet: Fleet, run: Rollout, step: Step, log: Log, saved: dict[str, Saved],
          say: Say) -> str | None:
    """Change the step's hosts, then gate them; the reason it stops, or None."""
    log.write("step-start", step=step.number, hosts=list(step.hosts))
    say(f"step {step.number} ({step.kind}): {', '.join(_label(step, h) for h in step.hosts)}")
    for name in step.hosts:
        t = fleet.hosts[name]
        if name not in saved:
            state, before = hoststate.save(t), fleet.gates.before(name)
            saved[name] = Saved(step.number, state, before)
            log.write("saved", step=step.number, host=name, state=state.to_json(),
                      before=before.to_json())
        target = run.change.target(t.series, saved[name].state)
        roles = step.roles.get(name) or t.roles
        results = _change_and_gate(fleet, t, step, log, target, roles, saved[name].before)
        for r in results:
            run.gates.append(dict(asdict(r), step=step.number))
            say(f"  {name}: {r.gate}: {r.verdict}: {r.why}")
        log.write("gates", step=step.number, host=name, results=[asdict(r) for r in results])
        stop = blocking(results, fleet.on_unknown)
        if stop:
            return "; ".join(f"{r.host} {r.gate} {r.verdict}: {r.why}" for r in stop)
    return None


def _change_and_gate(fleet: Fleet, t: DrivenHost, step: Step, log: Log, target: HostState,
                     roles: list[str], before: Before) -> list[GateResult]:
    """Converge one host to `target` (idempotent), then its gates; a failed change is a
    failed health gate (the host is rolled back with the rest)."""
    name = t.host.name
    restarted: list[str] = []
    try:
        hoststate.converge(t, list(target.applied), list(target.gates_off), restarted,
                           roles=roles)
    except PatchsetError as exc:
        log.write("changed", step=step.number, host=name, ok=False, error=str(exc),
                  restarted=restarted)
        return [GateResult("health", name, "fail", f"the change failed: {exc}")]
    log.write("changed", step=step.number, host=name, ok=True, restarted=restarted,
              target=target.to_json())
    return fleet.gates.check(name, target, roles, before, True)


def _roll_back(fleet: Fleet, run: Rollout, log: Log, saved: dict[str, Saved],
               say: Say, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Every host this rollout changed, back to its saved state (last changed first),
    but those in `skip` (already put back); the rollback goes on past a host that fails,
    and says which."""
    errors = []
    for name in reversed(list(saved)):
        if name in skip:
            continue
        state = saved[name].state
        try:
            restarted = hoststate.restore(fleet.hosts[name], state)
        except (PatchsetError, OSError) as exc:
            errors.append(f"{name}: {exc}")
            _record(log, say, "rollback", host=name, ok=False, error=str(exc))
            continue
        run.rolled_back.append(name)
        _record(log, say, "rollback", host=name, ok=True, restarted=restarted,
                state=state.to_json())
        say(f"  {name}: rolled back to {', '.join(state.applied) or 'no patches'}")
    run.rollback_error = "; ".join(errors) or None


def _label(step: Step, host: str) -> str:
    roles = step.roles.get(host)
    return f"{host}:{','.join(roles)}" if roles else host


def _new_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + \
        secrets.token_hex(3)


def describe(run: Rollout) -> list[str]:
    """The plan as lines (`--dry-run`)."""
    lines = [f"rollout {run.id}: {run.change.label}"]
    for step in run.steps:
        lines.append(f"  step {step.number} {step.kind}: "
                     f"{', '.join(_label(step, h) for h in step.hosts)}")
    lines.append(f"  gates after each step: {', '.join(GATES)}")
    return lines

