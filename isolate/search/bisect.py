"""`patchset bisect`: prove which change breaks a probe, one change at a time, and always
put the host back.

Order: the audit ranks the suspects for the symptom; the gated ones that are live are
A/B'd first (gate unset in the role's env file + restart: no code change), then the
unconditional ones are reverted one at a time (with their dependents). Every step starts
from the starting state plus exactly one change, so the first step that makes the probe
pass is the smallest change that flips it. When no single change does, one last step
takes every candidate out together (a combination, or not the series at all).

The host carries a record of the bisect (`.patchset/bisect.json` in its tree, no secrets:
ids, names, sha256s) from the first change to the end of the restore. While it is there,
apply/revert/deploy refuse anything that is not a step of this bisect; when the run that
wrote it is gone (Ctrl-C twice, a killed controller, a lost connection), the next
command from this controller finishes the restore (`restore_abandoned`), and
`patchset bisect HOST --restore` does it from anywhere.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import secrets
import signal
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from patchset import api
from patchset.agent.lib.crashpoint import crash_point
from patchset.agent.lib import safewrite
from patchset.agent.lib.bounded import InputError, expect
from patchset.agent.lib.records import StatusRecord
from patchset.errors import BisectPending, Exit, PatchsetError, TargetError, Unreachable
from patchset.series.model import Series

from patchset.isolate.measure import drift, driftstats
from patchset.isolate.search import driftsearch, hoststate
from patchset.isolate.measure.driftdecide import MIN_BOUNDED
from patchset.isolate.measure import probe as probe_mod

SERVER_ROLES = hoststate.SERVER_ROLES
LIVE_STATES = ("active", "unknown", "drifted")   # states in which the code may be running
Say = Callable[[str], None]


BisectHost = hoststate.DrivenHost     # the host as bisect drives it (isolate/search/hoststate.py)


@dataclass
class Candidate:
    """One suspect and what the bisect does with it."""

    rank: int
    patch: str
    score: float
    plan: str                 # gate-off | revert | skip
    why: str
    takes_out: list[str] = field(default_factory=list)   # revert: the patch + dependents


@dataclass
class BisectStep:
    """One step of a bisect: the change made, what the host then ran, the probe's verdict."""

    number: int
    action: str               # baseline | gate-off | revert | all | restore
    change: str
    applied: list[str]
    gates_off: list[str]
    probe_ok: bool | None
    probes: list[dict]
    restarted: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class BisectReport:
    host: str
    id: str
    probe: str
    url: str
    symptom: str
    started: str
    starting: list[str]
    candidates: list[Candidate] = field(default_factory=list)
    steps: list[BisectStep] = field(default_factory=list)
    culprit: dict | None = None
    verdict: str = ""
    restored: bool = False
    restore_error: str | None = None
    error: str | None = None      # what stopped the steps early (the restore still ran)
    interrupted: bool = False
    unreachable: bool = False     # the starting state's probe got no answer: nothing done
    saved: str | None = None
    strategy: str = "one-at-a-time"          # | group-testing (--probe drift)
    contributions: list[dict] = field(default_factory=list)   # drift: per suspect
    threshold: float | None = None           # drift: above it a contribution is real
    undecided: list[str] = field(default_factory=list)   # drift: neither real nor bounded

    @property
    def exit_code(self) -> int:
        if self.unreachable:
            return Exit.UNREACHABLE
        if self.restore_error or self.error:
            return Exit.FAILED
        if self.interrupted:
            return Exit.INTERRUPTED
        return Exit.INCONCLUSIVE if self.undecided else Exit.OK

    @property
    def states(self) -> int:
        """Test states the host was put in (the restore not counted)."""
        return sum(1 for s in self.steps if s.action not in ("baseline", "restore"))

    @property
    def unit_restarts(self) -> int:
        """Every unit restart, the restore's and an interrupted step's included."""
        return sum(len(s.restarted) for s in self.steps)

    def to_json(self) -> dict:
        return dict(asdict(self), states=self.states, unit_restarts=self.unit_restarts)


@dataclass(frozen=True)
class BisectProbe:
    """The probe a bisect re-runs after every step, against one endpoint."""

    kinds: tuple[str, ...]
    sizes: tuple[int, ...]
    endpoint: Any             # deploy.tunnel.HttpEndpoint: the host's, through its SSH
    api_key_env: str | None = None
    timeout: float = 600.0

    @property
    def url(self) -> str:
        return self.endpoint.describe()

    def run(self) -> tuple[bool | None, list[dict]]:
        """(True all pass, False one fails, None no failure but one could not judge: the
        state has no verdict), with the probe records."""
        report = probe_mod.fidelity(probe_mod.FidelitySpec(
            endpoint=self.endpoint, kinds=self.kinds, sizes=self.sizes,
            api_key_env=self.api_key_env, timeout=self.timeout))
        if report.unreachable:
            raise Unreachable("; ".join(r.error or r.reason for r in report.results
                                        if r.unreachable))
        failed = any(not r.ok and not r.inconclusive for r in report.results)
        verdict = False if failed else None if report.inconclusive else report.ok
        return verdict, [asdict(r) for r in report.results]


@dataclass
class DriftProbe:
    """`--probe drift`: each state measured in numbers (isolate/measure/drift.py), the suspects
    searched by group testing (isolate/search/driftsearch.py)."""

    client: Any               # isolate.drift.Client
    spec: Any                 # isolate.drift.DriftSpec
    kinds: tuple[str, ...] = ("drift",)

    @property
    def url(self) -> str:
        return self.client.describe()

    def baseline(self) -> Any:
        """The starting state, with at least the sequences a bound needs (its tokens are
        every state's A/B: a state can be cleared only if it can be bounded)."""
        return self._guard(lambda: drift.measure(self.client, self.spec,
                                                 at_least=MIN_BOUNDED))

    def at(self, base: Any) -> tuple[Any, Any]:
        """(A/B drift of the starting state's tokens, this state's prefill-vs-decode)."""
        # replayed once (the noise is base's); the state's own prefill vs decode on the
        # sequences a bound needs, so that a state that holds the whole drift can clear
        rounds = -(-MIN_BOUNDED // self.spec.per_round)
        once = replace(self.spec, repeats=1, budget=rounds * self.spec.per_round)
        return self._guard(lambda: (drift.a_b(base, drift.replay_saved(self.client, base, once),
                                              self.spec.fixed, noise_of=base),
                                    drift.prefill_vs_decode(
                                        drift.measure(self.client, once, at_least=MIN_BOUNDED),
                                        self.spec.fixed, noise_of=base)))

    @staticmethod
    def _guard(run: Callable[[], Any]) -> Any:
        try:
            return run()
        except drift.DriftError as exc:
            raise TargetError(f"drift probe: {exc}") from None


# ---------------------------------------------------------------- the run

def bisect(t: BisectHost, probe: "BisectProbe | DriftProbe", symptom: str = "context-loss",
           say: Say = lambda _: None) -> BisectReport:
    status = _status_record(t)
    if status.bisect:
        restore_abandoned(t, status.bisect, say)
        status = _status_record(t)
    starting = _starting(t, status)
    _require_deployed(t)
    report = BisectReport(host=t.host.name, id=_new_id(), probe=",".join(probe.kinds),
                          url=probe.url, symptom=symptom, started=_now(), starting=starting)
    report.candidates = candidates(t, symptom, starting)
    say(f"{t.host.name}: probing the starting state ({len(starting)} patches applied)")
    if isinstance(probe, DriftProbe):
        return _bisect_drift(t, probe, report, say)
    try:
        ok, results = probe.run()
    except Unreachable as exc:
        return _refused(report, str(exc))
    report.steps.append(BisectStep(0, "baseline", "starting state", starting, [], ok,
                                   results))
    if ok:
        report.verdict = "the probe passes in the starting state: nothing to bisect"
        report.restored = True
        return report
    if ok is None:
        report.verdict = ("the probe could not judge the starting state (no answer to judge "
                          "by): nothing to bisect, nothing was changed")
        report.undecided = [c.patch for c in report.candidates]
        report.restored = True
        return report
    steps = [c for c in report.candidates if c.plan != "skip"]
    if not steps:
        report.verdict = ("the probe fails, but no ranked suspect can be toggled or reverted "
                          "here (see the candidates): the cause is outside the series")
        report.restored = True
        return report
    api.bisect_mark(t.series, t.transport, report.id, _record(report, t))
    return _restoring(t, report, say, lambda: _walk(t, probe, report, steps, say),
                      "interrupted before a change flipped the probe")


def _restoring(t: BisectHost, report: BisectReport, say: Say, steps: Callable[[], None],
               interrupted: str) -> BisectReport:
    """Run the test steps; whatever stops them (Ctrl-C, a failure, a lost server), the
    starting state is restored and the report says why it stopped."""
    try:
        steps()
    except KeyboardInterrupt:
        report.interrupted = True
        report.verdict = interrupted
        say("interrupted: restoring the starting state (Ctrl-C is ignored until it is done)")
    except PatchsetError as exc:                   # Unreachable too
        report.error = str(exc)
        report.verdict = f"stopped at step {len(report.steps) - 1}: {exc}"
    finally:
        _restore_guarded(t, report, say)
    return report


def _bisect_drift(t: BisectHost, probe: DriftProbe, report: BisectReport,
                  say: Say) -> BisectReport:
    """Measure the starting state (its sequences, the noise between replays, its
    prefill-vs-decode drift); when that drift is above the noise, search the suspects by
    group testing, each state's A/B drift against the starting state's tokens."""
    report.strategy = "group-testing"
    try:
        base = probe.baseline()
    except Unreachable as exc:
        return _refused(report, str(exc))
    start = drift.prefill_vs_decode(base, probe.spec.judge)
    decided = start.verdict
    report.steps.append(BisectStep(0, "baseline", "starting state", list(report.starting), [],
                                   decided.outcome == "bounded", [_drift_json(start)]))
    if decided.outcome == "above" and decided.upper is not None and \
            decided.upper < decided.tolerance:
        report.verdict = (f"prefill and decode differ beyond the noise, but by less than the "
                          f"tolerance ({decided.why}): nothing that matters to bisect; a "
                          "smaller --tolerance attributes it")
        report.restored = True
        return report
    if decided.outcome != "above":
        report.verdict = (
            f"prefill vs decode is bounded below the tolerance in the starting state "
            f"({decided.why}): nothing to bisect" if decided.outcome == "bounded" else
            f"the starting state's drift is inconclusive ({decided.why}); to decide: "
            f"{decided.needs}: nothing was changed")
        report.undecided = [] if decided.outcome == "bounded" else \
            [c.patch for c in report.candidates]
        report.restored = True
        return report
    steps = {c.patch: c for c in report.candidates if c.plan != "skip"}
    if not steps:
        report.verdict = ("prefill and decode disagree, but no ranked suspect can be toggled "
                          "or reverted here (see the candidates): the cause is outside them")
        report.restored = True
        return report
    noise = drift.noise(base)
    threshold = driftstats.noise_threshold(noise, probe.spec.k)
    report.threshold = threshold
    api.bisect_mark(t.series, t.transport, report.id, _record(report, t))

    def measure(group: tuple[str, ...]) -> driftsearch.Measurement:
        chosen = [steps[name] for name in group]
        gates = [c.patch for c in chosen if c.plan == "gate-off"]
        out = sorted({n for c in chosen if c.plan == "revert" for n in c.takes_out})
        started = time.monotonic()
        step = _enter(t, report, "group", _group_change(t, chosen), out, gates, say)
        ab, here = probe.at(base)
        found = measurement(ab, here)
        step.probe_ok = found.cleared
        step.probes = [_drift_json(ab), _drift_json(here)]
        step.seconds = round(time.monotonic() - started, 2)
        say(f"{t.host.name}: step {step.number}: A/B drift {ab.overall.overall.mean:.3g}; "
            f"prefill vs decode {here.verdict.outcome}")
        return found

    def attribute() -> None:
        found = driftsearch.search(list(steps), measure,
                                   driftsearch.Noise.of(noise, drift.sequence_noise(base)),
                                   probe.spec.k, cheap=frozenset(n for n, c in steps.items()
                                                                 if c.plan == "gate-off"),
                                   tolerance=probe.spec.tolerance)
        report.contributions = [asdict(c) for c in found.contributions]
        report.undecided = list(found.undecided)
        report.verdict = _drift_verdict(found, threshold, probe.spec.tolerance)
        if found.culprits:
            top = max(found.contributions, key=lambda c: c.value or 0.0)
            report.culprit = {"patch": top.suspect, "action": steps[top.suspect].plan,
                              "contribution": top.value, "interval": [top.low, top.high]}

    return _restoring(t, report, say, attribute, "interrupted before the drift was attributed")


def measurement(ab: Any, here: Any) -> driftsearch.Measurement:
    """A test state for the search: `ab` (drift.a_b of the starting state's tokens) token
    by token, keyed by sequence and position so two states' values pair up, and whether
    `here` (the state's own prefill-vs-decode drift) is bounded below the tolerance (only
    a bound clears: an inconclusive state is not cleared)."""
    points = [((p.name, pos), v) for p in ab.per_sequence
              for pos, v in p.comparison.points]
    return driftsearch.Measurement(tuple(v for _, v in points),
                                   here.verdict.outcome == "bounded",
                                   tuple(key for key, _ in points))


def _group_change(t: BisectHost, chosen: list[Candidate]) -> str:
    return "; ".join(_describe(t, c).removesuffix(", restart") for c in chosen) + ", restart"


def _drift_verdict(found: driftsearch.SearchResult, threshold: float,
                  tolerance: float) -> str:
    undecided = ""
    if found.undecided:
        why = "; ".join(f"{c.suspect} at most {c.high:.3g}" for c in found.contributions
                        if c.suspect in found.undecided)
        undecided = (f"; undecided (neither told from the noise nor bounded below the "
                     f"tolerance {tolerance:.3g}: more sequences, --budget, or a larger "
                     f"--tolerance would decide): {why}")
    if not found.culprits:
        if found.undecided:
            return f"no suspect carries a drift told from the noise{undecided}"
        return ("taking the suspects out moves the output by less than the tolerance "
                f"{tolerance:.3g} each (bounded; noise threshold {threshold:.3g}): the drift "
                "is outside the candidates")
    parts = [f"{c.suspect} {c.value:.3g} [{c.low:.3g}, {c.high:.3g}] ({c.how})"
             for c in found.contributions if c.suspect in found.culprits and c.value]
    return (f"the drift is carried by {', '.join(parts)}; {found.restarts} test states "
            f"(threshold {threshold:.3g}){undecided}")


def _drift_json(rep: Any) -> dict:
    """A drift report for a step's `probes`: the figures, not the per-token points."""
    return rep.to_json()


def _refused(report: BisectReport, why: str) -> BisectReport:
    """The starting state's probe got no answer: stop before any change (exit 3)."""
    report.unreachable = True
    report.error = f"the probe cannot reach the endpoint in the starting state: {why}"
    report.verdict = "not started: nothing was changed on the host"
    report.restored = True
    return report


def _walk(t: BisectHost, probe: BisectProbe, report: BisectReport, steps: list[Candidate],
          say: Say) -> None:
    for cand in steps:
        gates = [cand.patch] if cand.plan == "gate-off" else []
        out = cand.takes_out if cand.plan == "revert" else []
        step = _step(t, probe, report, cand.plan, _describe(t, cand), out, gates, say)
        if step.probe_ok:
            report.culprit = {"patch": cand.patch, "action": cand.plan,
                              "change": step.change, "step": step.number}
            report.verdict = f"{step.change} makes the probe pass: {cand.patch} is the cause"
            return
    if len(steps) > 1:
        gates = [c.patch for c in steps if c.plan == "gate-off"]
        out = sorted({n for c in steps if c.plan == "revert" for n in c.takes_out})
        step = _step(t, probe, report, "all", "every candidate out at once", out, gates, say)
        if step.probe_ok:
            report.verdict = ("no single change flips the probe, all of them together do: "
                              "a combination of " + ", ".join(c.patch for c in steps))
            return
    unjudged = [s.change for s in report.steps[1:] if s.probe_ok is None]
    if unjudged:
        report.undecided = [c.patch for c in steps]
        report.verdict = ("no change flipped the probe, but it could not judge "
                          f"{len(unjudged)} state(s) ({'; '.join(unjudged)}): undecided")
        return
    report.verdict = ("no change of the series flips the probe: the cause is outside the "
                      "candidates (upstream, a hazard, or the deployment)")


def _step(t: BisectHost, probe: BisectProbe, report: BisectReport, action: str, change: str,
          take_out: list[str], gates_off: list[str], say: Say) -> BisectStep:
    started = time.monotonic()
    step = _enter(t, report, action, change, take_out, gates_off, say)
    ok, results = probe.run()
    step.probe_ok, step.probes = ok, results
    step.seconds = round(time.monotonic() - started, 2)
    say(f"{t.host.name}: step {step.number}: probe "
        f"{'PASSES' if ok else 'could not judge' if ok is None else 'still fails'}")
    return step


def _enter(t: BisectHost, report: BisectReport, action: str, change: str,
           take_out: list[str], gates_off: list[str], say: Say) -> BisectStep:
    """Put the host in a test state. The step is in the report before the first restart,
    and each restart is counted as it happens: an interrupted step's restarts count."""
    number = len(report.steps)
    say(f"{t.host.name}: step {number}: {change}")
    applied = [n for n in report.starting if n not in take_out]
    step = BisectStep(number, action, change, applied, list(gates_off), None, [])
    report.steps.append(step)
    _converge(t, report.id, applied, gates_off, step.restarted)
    crash_point(f"bisect-step-{number}")
    return step


def _converge(t: BisectHost, bisect_id: str, applied: list[str],
              gates_off: list[str], restarted: list[str] | None = None) -> list[str]:
    """Make the host run exactly `applied` with `gates_off` unset, as a step of this
    bisect (isolate/search/hoststate.py); the roles restarted."""
    return hoststate.converge(t, applied, gates_off, restarted, bisect_id=bisect_id)


# ---------------------------------------------------------------- candidates

def candidates(t: BisectHost, symptom: str, starting: list[str]) -> list[Candidate]:
    """The audit's ranked patch suspects, each with what this bisect will do with it:
    gated ones first (an env change), then unconditional ones (a revert)."""
    from patchset.auditor import api as audit_api
    report = audit_api.audit(t.series, [t.transport], symptom)
    states: dict[str, set[str]] = {}
    for host in report.hosts:
        for st in host.states:
            states.setdefault(st.patch, set()).add(st.state)
    known = t.series.by_name()
    out = []
    for s in report.symptom.suspects if report.symptom else ():
        if s.kind == "patch" and s.name in known:
            out.append(_candidate(s, known[s.name], states.get(s.name, set()), starting, t))
    order = {"gate-off": 0, "revert": 1, "skip": 2}
    return sorted(out, key=lambda c: (order[c.plan], c.rank))


def _candidate(s: Any, patch: Any, states: set[str], starting: list[str],
               t: BisectHost) -> Candidate:
    live = sorted(states & set(LIVE_STATES))
    base = dict(rank=s.rank, patch=patch.name, score=s.score)
    if patch.name not in starting:
        return Candidate(**base, plan="skip", why="not applied on this host")
    if not live:
        return Candidate(**base, plan="skip",
                         why=f"{'/'.join(sorted(states)) or 'no state'}: its code does not "
                             "run here, toggling it cannot change the probe")
    if patch.gate:
        return Candidate(**base, plan="gate-off",
                         why=f"{'/'.join(live)}; gated by {patch.gate.env}: unset it")
    out = [patch.name] + _dependents(t.series, starting, patch.name)
    extra = f" (with dependents {', '.join(out[1:])})" if len(out) > 1 else ""
    return Candidate(**base, plan="revert", takes_out=out,
                     why=f"{'/'.join(live)}; unconditional: revert it{extra}")


def _dependents(series: Series, applied: list[str], name: str) -> list[str]:
    return hoststate.dependents(series, applied, name)


def _describe(t: BisectHost, cand: Candidate) -> str:
    patch = t.series.by_name()[cand.patch]
    if cand.plan == "gate-off":
        assert patch.gate is not None           # only a gated patch is a gate-off candidate
        return f"{patch.gate.env} unset (gate of {cand.patch}), restart"
    return f"revert {', '.join(cand.takes_out)}, restart"


# ---------------------------------------------------------------- restore

def _restore_guarded(t: BisectHost, report: BisectReport, say: Say) -> None:
    """The restore runs to the end even through Ctrl-C; a failure is reported, and the
    record left on the host lets the next command finish it."""
    previous = _ignore_sigint()
    try:
        say(f"{t.host.name}: restoring the starting state")
        started = time.monotonic()
        restarted = _restore(t, report.id, report.starting)
        report.steps.append(BisectStep(len(report.steps), "restore", "starting state",
                                       list(report.starting), [], None, [], restarted,
                                       round(time.monotonic() - started, 2)))
        report.restored = True
    except (PatchsetError, OSError) as exc:
        report.restore_error = (f"{exc}; the host keeps the bisect record: the next patchset "
                                f"command on {t.host.name} finishes the restore")
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _restore(t: BisectHost, bisect_id: str, starting: list[str]) -> list[str]:
    restarted = _converge(t, bisect_id, starting, [])
    api.bisect_mark(t.series, t.transport, bisect_id, None)
    return restarted


def checked_record(record: Any, host: str) -> dict:
    """A host's bisect record (its `.patchset/bisect.json`), checked whole before any of
    it is used: whoever can write there must not turn a restore into a traceback."""
    where = f"{host}: the bisect record"
    try:
        expect(record, dict, where)
        expect(record.get("id"), str, where, ("id",))
        expect(record.get("pid"), (int, type(None)), where, ("pid",))
        for key in ("controller", "by", "started"):
            expect(record.get(key), (str, type(None)), where, (key,))
        starting = expect(record.get("starting"), (list, type(None)), where, ("starting",))
        for i, name in enumerate(starting or []):
            expect(name, str, where, ("starting", i))
    except InputError as exc:
        raise TargetError(f"{exc} (not a record this tool wrote: damaged)") from None
    return record


def restore_abandoned(t: BisectHost, record: dict, say: Say, force: bool = False) -> list[str]:
    """Finish the restore of a bisect whose run is gone. A run still alive on this machine
    is never interfered with; one started elsewhere needs `force` (`--restore`)."""
    record = checked_record(record, t.host.name)
    if not force and not abandoned(record):
        elsewhere = record.get("controller") != socket.gethostname()
        raise BisectPending(
            f"{t.host.name}: a bisect "
            + (f"from {record.get('controller')} " if elsewhere else "is running there ")
            + f"({record.get('by')}, since {record.get('started')}) holds it in a test state; "
            + ("if that run is gone, " if elsewhere else "wait for it, or ")
            + f"run `patchset bisect {t.host.name} --restore` to restore it")
    say(f"{t.host.name}: finishing the restore of the bisect started {record.get('started')} "
        f"by {record.get('by')}")
    return _restore(t, record["id"], list(record.get("starting") or []))


def restore_pending(t: BisectHost, say: Say) -> None:
    """`patchset bisect HOST --restore`: finish the restore of an unfinished bisect on the
    host, even one started elsewhere; says what was restored (or that nothing was)."""
    record = _status_record(t).bisect
    if not record:
        say(f"{t.host.name}: no unfinished bisect there; nothing to restore")
        return
    restarted = restore_abandoned(t, record, say, force=True)
    say(f"{t.host.name}: restored {', '.join(record.get('starting') or []) or 'no patches'}"
        + (f"; restarted {', '.join(restarted)}" if restarted else ""))


# ---------------------------------------------------------------- the next command restores

def bisect_host(series: Series, resolver: Any, spec: str,
                health_timeout: float | None = None) -> BisectHost:
    """The host `spec` as a bisect drives it, through the command's host resolver
    (deploy.resolve.Hosts): its inventory entry and transport."""
    host = resolver.inventory.resolve(spec)
    transport = resolver.transport(spec, provision_local=False)
    return BisectHost(series=series, host=host, transport=transport,
                      health_timeout=health_timeout)


def finish_abandoned(series: Series, resolver: Any, spec: str, record: dict,
                     say: Say) -> bool:
    """Restore an abandoned bisect on `spec` so the command that found it can go on.
    False (with the reason said) when its run is still alive or was started elsewhere."""
    t = bisect_host(series, resolver, spec)
    try:
        restore_abandoned(t, record, say)
    except BisectPending as exc:
        say(str(exc))
        return False
    return True


def retry_pending(series: Series, resolver: Any, specs: list[str], results: list[Any],
                  again: Callable[[int], Any], say: Say) -> list[Any]:
    """Results (apply, revert) refused by an abandoned bisect are retried, `again(i)`, once
    its restore is finished."""
    out = list(results)
    for i, result in enumerate(results):
        record = getattr(result, "bisect", None)
        if record and finish_abandoned(series, resolver, specs[i], record, say):
            out[i] = again(i)
    return out


def run_restoring(series: Series, resolver: Any, spec: str, run: Callable[[], Any],
                  say: Say) -> Any:
    """`run()` (a deploy); when an abandoned bisect on `spec` refuses it (BisectPending),
    finish that restore and run it once more."""
    try:
        return run()
    except BisectPending as exc:
        if not finish_abandoned(series, resolver, spec, exc.record, say):
            raise
        return run()


def abandoned(record: dict) -> bool:
    """True when the bisect's controller process is known to be gone (same machine)."""
    if record.get("controller") != socket.gethostname():
        return False
    pid = int(record.get("pid") or 0)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"bisect" not in cmdline


def _ignore_sigint():
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:          # not the main thread: nothing to mask
        return None


# ---------------------------------------------------------------- helpers

def _status_record(t: BisectHost) -> StatusRecord:
    return hoststate.status_record(t)


def _starting(t: BisectHost, status: StatusRecord) -> list[str]:
    return hoststate.starting(t, status)


def _require_deployed(t: BisectHost) -> None:
    hoststate.require_deployed(t, "the bisect")


def _record(report: BisectReport, t: BisectHost) -> dict:
    return {"id": report.id, "started": report.started, "by": _who(),
            "controller": socket.gethostname(), "pid": os.getpid(), "probe": report.probe,
            "starting": list(report.starting), "roles": t.roles}


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} (pid {os.getpid()})"


def _new_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + \
        secrets.token_hex(3)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def save(report: BisectReport, path: Path | None = None) -> Path:
    """Write the report as JSON: `path`, else the state dir, one file per run."""
    if path is None:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        path = Path(state) / "patchset" / "bisect" / f"{report.host}-{report.id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    report.saved = str(path)
    safewrite.write_file(path, (json.dumps(report.to_json(), indent=2, sort_keys=True)
                                + "\n").encode(), 0o644, streams=True)
    return path
