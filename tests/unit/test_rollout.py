"""`patchset rollout` with fakes: the plan, what each gate's verdict means for the run, the
rollback of every changed host to its saved state, the log, and resume after a kill
(no step's change made twice). Real hosts: tests/system/test_rollout_hosts.py."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from patchset.errors import Exit, LockedError, TargetError, UsageError
from patchset.isolate.rollout import rollout as ro
from patchset.isolate.rollout import rolloutlog
from patchset.isolate.search.hoststate import DrivenHost, HostState

PATCHES = [SimpleNamespace(name=n, depends=d, conflicts=[], gate=g) for n, d, g in (
    ("a", [], None), ("b", ["a"], None), ("c", [], "C_GATE"), ("d", [], None))]
SERIES = SimpleNamespace(patches=PATCHES, manifest="patches.yaml",
                         by_name=lambda: {p.name: p for p in PATCHES})
ROLES = {"prefill": {}, "decode": {}}


class Killed(BaseException):
    """A kill of the controller between two side effects (not caught by the rollout)."""


@dataclass
class World:
    """What the fake hosts run, and every change made to them (the side effects)."""

    actual: dict[str, HostState]
    changes: list[tuple[str, tuple, tuple]] = field(default_factory=list)
    kill_after: int | None = None          # kill once this many changes were made
    fail_restore: set[str] = field(default_factory=set)   # each fails its next restore

    def save(self, t: DrivenHost, what: str = "") -> HostState:
        return self.actual[t.host.name]

    def converge(self, t, applied, gates_off, restarted=None, bisect_id=None, roles=None):
        name = t.host.name
        new = HostState(name, tuple(applied), tuple(gates_off))
        if new != self.actual[name]:
            self.actual[name] = new
            self.changes.append((name, new.applied, new.gates_off))
            if restarted is not None:
                restarted.extend(roles or t.roles)
            if self.kill_after is not None and len(self.changes) >= self.kill_after:
                self.kill_after = None
                raise Killed()
        return list(roles or t.roles)

    def restore(self, t, state, bisect_id=None):
        if t.host.name in self.fail_restore:
            self.fail_restore.discard(t.host.name)
            raise TargetError(f"{t.host.name}: ssh: connection reset")
        return self.converge(t, list(state.applied), list(state.gates_off))


class FakeGates:
    """Every gate passes, except the verdicts scripted per (host, gate)."""

    def __init__(self, verdicts: dict[tuple[str, str], str] | None = None) -> None:
        self.verdicts = verdicts or {}
        self.checked: list[str] = []

    def before(self, host: str) -> ro.Before:
        return ro.Before((), 100.0, "")

    def check(self, host, target, roles, before, deployed):
        self.checked.append(host)
        return [ro.GateResult(g, host, self.verdicts.get((host, g), "pass"), f"{g} scripted")
                for g in ro.GATES]


@pytest.fixture()
def world(monkeypatch) -> World:
    w = World({h: HostState(h, ("a", "c")) for h in ("h1", "h2", "h3")})
    for name in ("save", "converge", "restore"):
        monkeypatch.setattr(ro.hoststate, name, getattr(w, name))
    return w


def fleet(gates: FakeGates | None = None, on_unknown: str = "stop") -> ro.Fleet:
    hosts = {h: DrivenHost(SERIES, SimpleNamespace(name=h, roles=ROLES), None)
             for h in ("h1", "h2", "h3")}
    return ro.Fleet(hosts, gates or FakeGates(), on_unknown)


def plan(canary: str | None = None, batch: int = 1) -> list[ro.Step]:
    return ro.make_plan(["h1", "h2", "h3"], canary, batch, lambda _: ["prefill", "decode"])


def events(run: ro.Rollout) -> list[dict]:
    return [json.loads(line) for line in Path(run.log).read_text().splitlines()]


# ---------------------------------------------------------------- plan and change

def test_plan_canary_then_batches() -> None:
    steps = plan(batch=2)
    assert [(s.kind, s.hosts) for s in steps] == [("canary", ("h1",)),
                                                  ("batch", ("h2", "h3"))]


def test_a_role_canary_finishes_its_host_in_the_first_batch() -> None:
    steps = plan("h2:decode", batch=1)
    assert [(s.hosts, s.roles) for s in steps] == [(("h2",), {"h2": ["decode"]}),
                                                   (("h2",), {}), (("h1",), {}),
                                                   (("h3",), {})]


@pytest.mark.parametrize("canary,batch,message", [
    ("h9", 1, "--canary h9: not one of the hosts"),
    ("h1:router", 1, "h1 has no 'router' role"),
    (None, 0, "--batch: at least 1"),
])
def test_bad_plans_are_refused(canary, batch, message) -> None:
    with pytest.raises(UsageError, match=message):
        plan(canary, batch)


def test_change_targets() -> None:
    saved = HostState("h", ("a", "b", "c"))
    assert ro.Change(revert=("a",)).target(SERIES, saved).applied == ("c",)   # b depends on a
    assert ro.Change(select=("d", "a")).target(SERIES, saved).applied == ("a", "d")
    flipped = ro.Change(gate_off=("c", "d")).target(SERIES, saved)
    assert flipped.applied == saved.applied and flipped.gates_off == ("c",)   # d not applied


# ---------------------------------------------------------------- gate verdicts

def decision(outcome: str, upper: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(outcome=outcome, upper=upper, tolerance=0.002, why="w", needs="n")


@pytest.mark.parametrize("outcome,upper,verdict", [
    ("above", 0.5, "fail"), ("above", None, "fail"), ("above", 0.001, "pass"),
    ("bounded", 0.001, "pass"), ("inconclusive", 0.5, "unknown")])
def test_the_drift_gate_is_three_valued(outcome, upper, verdict) -> None:
    assert ro.drift_verdict(decision(outcome, upper))[0] == verdict


@pytest.mark.parametrize("before,after,verdict", [
    (100.0, 60.0, "pass"), (100.0, 40.0, "fail"), (None, 60.0, "unknown"),
    (100.0, None, "unknown")])
def test_the_throughput_gate_against_the_load_before(before, after, verdict) -> None:
    from patchset.isolate.rollout.rolloutgates import FleetGates
    gates = FleetGates(SERIES, None, {}, max_drop=0.5)
    gates._throughput = lambda host: (after, "" if after else "no answer")
    result = gates._load("h1", ro.Before((), before, ""))
    assert result.verdict == verdict
    assert result.figures == {"before": before, "after": after, "max_drop": 0.5}


def test_only_new_high_findings_fail_a_step() -> None:
    old = {"id": "hazard[x]", "subject": "s1", "message": ""}
    new = {"id": "hazard[y]", "subject": "s1", "message": ""}
    assert ro.new_severe([old], [old, new]) == [new]


def test_states_against_the_target() -> None:
    report = SimpleNamespace(hosts=[SimpleNamespace(states=[
        SimpleNamespace(server="sglang-decode.service", patch=p, state=s) for p, s in (
            ("a", "active"), ("b", "active"), ("c", "unknown"), ("d", "drifted"))] + [
        SimpleNamespace(server="sglang-prefill.service", patch="a", state="not-applied")])])
    wrong, unknown = ro.states_off(report, HostState("h", ("a", "c")),
                                   ["sglang-decode.service"], ["a", "b", "c", "d"])
    assert wrong == ["sglang-decode.service b: active (should be not-applied)",
                     "sglang-decode.service d: drifted (runs code that is not the tree's)"]
    assert unknown == ["sglang-decode.service c: unknown"]


# ---------------------------------------------------------------- runs

def test_every_gate_passing_reaches_every_host_in_its_batches(world, tmp_path) -> None:
    gates = FakeGates()
    run = ro.start(fleet(gates), ro.Change(revert=("c",)), plan(batch=2), tmp_path)
    assert run.finished and run.exit_code == Exit.OK and run.done == [0, 1]
    assert [c[0] for c in world.changes] == ["h1", "h2", "h3"]
    assert all(s.applied == ("a",) for s in world.actual.values())
    assert gates.checked == ["h1", "h2", "h3"]
    kinds = [e["event"] for e in events(run)]
    assert kinds[0] == "plan" and kinds[-1] == "end" and kinds.count("step-done") == 2


def test_a_failing_gate_rolls_every_changed_host_back_and_stops(world, tmp_path) -> None:
    before = dict(world.actual)
    gates = FakeGates({("h2", "drift"): "fail"})
    run = ro.start(fleet(gates), ro.Change(revert=("c",)), plan(batch=1), tmp_path)
    assert run.exit_code == Exit.FINDINGS and "h2 drift fail" in run.stopped
    assert run.rolled_back == ["h2", "h1"]                 # the last changed first
    assert world.actual == before                          # exactly as before
    assert "h3" not in [c[0] for c in world.changes]      # the next batch never started
    assert events(run)[-1]["outcome"] == "rolled-back"


@pytest.mark.parametrize("on_unknown,finished", [("stop", False), ("continue", True)])
def test_an_unknown_gate_stops_unless_told_otherwise(world, tmp_path, on_unknown,
                                                     finished) -> None:
    gates = FakeGates({("h1", "throughput"): "unknown"})
    run = ro.start(fleet(gates, on_unknown), ro.Change(revert=("c",)), plan(), tmp_path)
    assert run.finished is finished
    assert (world.actual["h1"].applied == ("a",)) is finished


def test_a_host_that_could_not_be_restored_is_refused_before_any_change(
        world, tmp_path, monkeypatch) -> None:
    def save(t, what=""):
        if t.host.name == "h3":
            raise UsageError("h3: it runs x sha256 0123, which is not the series' file")
        return world.actual[t.host.name]
    monkeypatch.setattr(ro.hoststate, "save", save)
    with pytest.raises(UsageError, match="h3: it runs x"):
        ro.start(fleet(), ro.Change(revert=("c",)), plan(), tmp_path)
    assert world.changes == [] and not list(tmp_path.iterdir())


def test_a_host_without_a_server_role_is_refused() -> None:
    with pytest.raises(UsageError, match="h2: no prefill or decode role"):
        ro.make_plan(["h1", "h2"], None, 1, lambda h: [] if h == "h2" else ["decode"])


def test_dry_run_writes_nothing(world, tmp_path) -> None:
    run = ro.start(fleet(), ro.Change(revert=("c",)), plan(), tmp_path, dry_run=True)
    assert run.dry_run and not list(tmp_path.iterdir()) and world.changes == []
    assert ro.describe(run)[1:3] == ["  step 0 canary: h1", "  step 1 batch: h2"]


def test_resume_after_a_kill_continues_without_repeating_a_change(world, tmp_path) -> None:
    world.kill_after = 2                                    # killed once h2 has changed
    settings = ro.Settings("/b/base.json", "0" * 64, max_drop=0.2)
    with pytest.raises(Killed):
        ro.start(fleet(), ro.Change(revert=("c",)), plan(batch=2), tmp_path,
                 settings=settings)
    path = ro.latest_unfinished(tmp_path)
    assert path is not None
    gates, asked = FakeGates(), []
    run = ro.resume(lambda names, settings: asked.append((names, settings)) or fleet(gates),
                    path, SERIES)
    # the gates are built as the run started them, not from the resuming command
    assert asked == [(["h1", "h2", "h3"], settings)]
    assert run.resumed and run.finished and run.done == [0, 1]
    assert [c[0] for c in world.changes] == ["h1", "h2", "h3"]   # each host changed once
    assert gates.checked == ["h2", "h3"]                    # step 0 was not redone
    assert ro.latest_unfinished(tmp_path) is None
    with pytest.raises(UsageError, match="has ended"):
        ro.resume(lambda names, settings: fleet(), path, SERIES)


def test_a_kill_during_the_rollback_is_finished_by_resume(world, tmp_path,
                                                          monkeypatch) -> None:
    before = dict(world.actual)
    gates = FakeGates({("h2", "audit"): "fail"})
    world.kill_after = 3                                    # h1, h2 changed; killed in rollback
    with pytest.raises(Killed):
        ro.start(fleet(gates), ro.Change(revert=("c",)), plan(), tmp_path)
    path = ro.latest_unfinished(tmp_path)
    run = ro.resume(lambda names, settings: fleet(FakeGates()), path, SERIES)
    assert run.stopped and "h2 audit fail" in run.stopped and world.actual == before
    assert [c[0] for c in world.changes] == ["h1", "h2", "h2", "h1"]


def test_a_damaged_log_is_named_by_line(tmp_path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"event": "plan"}\nnot json\n{"event": "end"}\n')
    with pytest.raises(UsageError, match=r"x.jsonl:2: not a JSON line"):
        rolloutlog.lines(path)
    path.write_text('{"event": "plan"}\n{"event": "st')    # a last line cut by a kill
    assert rolloutlog.lines(path) == [(1, {"event": "plan"})]


# ---------------------------------------------------------------- the command

ROOT = Path(__file__).resolve().parents[2]
HOSTS = """version: 1
hosts:
  gpu1: {address: 192.0.2.1, tree: /opt/sglang, roles: {prefill: {port: 30000}, decode: {port: 30001}}}
  gpu2: {address: 192.0.2.2, tree: /opt/sglang, roles: {decode: {port: 30001}}}
  gpu3: {address: 192.0.2.3, tree: /opt/sglang, cohort: pair, roles: {decode: {port: 30001}}}
  gpu4: {address: 192.0.2.4, tree: /opt/sglang, cohort: pair, roles: {decode: {port: 30001}}}
"""


def run_cli(tmp_path, monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    from patchset.cli import main
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code = main(["rollout", *argv, "--inventory", str(tmp_path / "hosts.yaml"),
                 "--series", str(ROOT / "patches.yaml")])
    out, err = capsys.readouterr()
    return code, out, err


def test_resume_without_an_unfinished_rollout_is_bad_input(tmp_path, monkeypatch,
                                                           capsys) -> None:
    from patchset.cli import main
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code = main(["rollout", "--resume", "--inventory", str(tmp_path / "hosts.yaml"),
                 "--series", str(ROOT / "patches.yaml")])
    assert code == Exit.BAD_INPUT
    assert "--resume: no unfinished rollout under" in capsys.readouterr().err


def test_the_command_dry_run_prints_the_plan(tmp_path, monkeypatch, capsys) -> None:
    code, out, err = run_cli(tmp_path, monkeypatch, capsys, "--revert", "mhc-bf16",
                             "--canary", "gpu1:prefill", "--dry-run", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["dry_run"] is True and data["change"]["revert"] == ["mhc-bf16"]
    assert [(s["kind"], s["hosts"], s["roles"]) for s in data["steps"]] == [
        ("canary", ["gpu1"], {"gpu1": ["prefill"]}), ("batch", ["gpu1"], {}),
        ("batch", ["gpu2"], {}), ("batch", ["gpu3"], {}), ("batch", ["gpu4"], {})]
    assert not (tmp_path / "state").exists()


def test_a_cohort_is_rolled_through_its_own_hosts(tmp_path, monkeypatch, capsys) -> None:
    code, out, err = run_cli(tmp_path, monkeypatch, capsys, "--revert", "mhc-bf16",
                             "--cohort", "pair", "--dry-run", "--json")
    assert code == 0, err
    assert [s["hosts"] for s in json.loads(out)["steps"]] == [["gpu3"], ["gpu4"]]


@pytest.mark.parametrize("argv,message", [
    (("--tier", "safe", "--revert", "mhc-bf16"), "give one change"),
    (("--revert", "no-such-patch"), "no patch named 'no-such-patch'"),
    (("--gate-off", "mhc-bf16"), "--gate-off mhc-bf16: that patch has no gate"),
    (("--revert", "mhc-bf16", "--canary", "gpu2:prefill"), "gpu2 has no 'prefill' role"),
    (("--revert", "mhc-bf16", "--on-unknown", "maybe"), "--on-unknown 'maybe'"),
    (("--resume",), "--resume goes on changing hosts; --dry-run is for a new"),
    (("--revert", "mhc-bf16", "--cohort", "nope"), "--cohort 'nope': no host of"),
    (("gpu1", "--revert", "mhc-bf16", "--cohort", "pair"), "give the cohort or HOSTS"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv,
                                          message) -> None:
    code, out, err = run_cli(tmp_path, monkeypatch, capsys, *argv, "--dry-run")
    assert code == Exit.BAD_INPUT and message in err, err


# ---------------------------------------------------------------- outcomes (review defects)

def test_a_failed_rollback_stays_open_and_resume_retries_it(world, tmp_path) -> None:
    before = dict(world.actual)
    world.fail_restore = {"h1"}                     # one transient failure in the rollback
    run = ro.start(fleet(FakeGates({("h2", "drift"): "fail"})), ro.Change(revert=("c",)),
                   plan(), tmp_path)
    assert run.exit_code == Exit.FAILED and "h1: ssh" in run.rollback_error
    assert world.actual["h1"] != before["h1"] and world.actual["h2"] == before["h2"]
    assert "end" not in [e["event"] for e in events(run)]       # not ended: resumable
    assert ro.latest_unfinished(tmp_path) == Path(run.log)
    again = ro.resume(lambda names, settings: fleet(), Path(run.log), SERIES)
    assert world.actual == before and again.exit_code == Exit.FINDINGS
    assert again.rolled_back == ["h2", "h1"]
    assert [c[0] for c in world.changes] == ["h1", "h2", "h2", "h1"]   # h2 not redone
    assert events(run)[-1]["outcome"] == "rolled-back"
    assert ro.latest_unfinished(tmp_path) is None


def test_accepted_unknown_gates_are_inconclusive_not_passed(world, tmp_path,
                                                            capsys) -> None:
    from patchset.cli import rollout as cli_rollout
    unknown = {(h, g): "unknown" for h in ("h1", "h2", "h3") for g in ro.GATES}
    run = ro.start(fleet(FakeGates(unknown), "continue"), ro.Change(revert=("c",)), plan(),
                   tmp_path)
    assert run.finished and run.unknown_accepted == 12
    assert run.exit_code == Exit.INCONCLUSIVE and run.outcome == "done-unverified"
    assert events(run)[-1]["outcome"] == "done-unverified"
    cli_rollout._render(run, ro)
    out = capsys.readouterr().out
    assert "3 step(s) done, 12 gate(s) unknown (accepted by --on-unknown continue)" in out
    assert "every step passed" not in out


def test_unknowns_accepted_before_a_kill_still_count_after_resume(world, tmp_path) -> None:
    world.kill_after = 2                                     # step 1 cut off
    with pytest.raises(Killed):
        ro.start(fleet(FakeGates({("h1", "drift"): "unknown"}), "continue"),
                 ro.Change(revert=("c",)), plan(), tmp_path)
    run = ro.resume(lambda names, settings: fleet(), ro.latest_unfinished(tmp_path), SERIES)
    assert run.finished and run.unknown_accepted == 1 and run.exit_code == Exit.INCONCLUSIVE
    assert [g["step"] for g in run.logged_gates] == [0] * 4 and {g["step"] for g in
                                                                 run.gates} == {1, 2}


def test_a_log_write_failure_and_a_failing_stop_write_still_roll_back(
        world, tmp_path, monkeypatch) -> None:
    before = dict(world.actual)
    real = ro.Log.write

    def write(self, event, **data):
        if event in ("gates", "stop") and data.get("step", 0) == 1:
            raise OSError(28, "No space left on device")
        return real(self, event, **data)
    monkeypatch.setattr(ro.Log, "write", write)
    run = ro.start(fleet(), ro.Change(revert=("c",)), plan(), tmp_path)
    assert run.stopped and "No space left" in run.stopped
    assert world.actual == before and run.rolled_back == ["h2", "h1"]


# ---------------------------------------------------------------- gates measured

def finding(subject, status, fid="server-health[unit]"):
    return SimpleNamespace(id=fid, subject=subject, status=status, message="", found="",
                           severity="high")


UNIT = "sglang-decode.service"


@pytest.mark.parametrize("findings,verdict", [
    ([finding(UNIT, "pass"), finding(f"{UNIT} /health", "pass", "server-health[health]")],
     "pass"),
    ([finding(UNIT, "warn")], "fail"),                   # active, no SGLang process in it
    ([finding(UNIT, "pass")], "unknown"),                # no /health finding
    ([finding(UNIT, "pass"), finding(f"{UNIT} /health", "unknown")], "unknown"),
    ([finding(UNIT, "unknown"), finding(f"{UNIT} /health", "fail")], "fail"),
    ([], "unknown"),
])
def test_the_health_gate_passes_only_what_was_measured_healthy(findings, verdict) -> None:
    from patchset.isolate.rollout.rolloutgates import FleetGates
    report = SimpleNamespace(findings=findings, hosts=[])
    assert FleetGates(SERIES, None, {})._health("h1", report, [UNIT]).verdict == verdict


def states(rows, reachable=True):
    facts = SimpleNamespace(reachable=reachable, error="" if reachable else "ssh: refused")
    return SimpleNamespace(findings=[], hosts=[SimpleNamespace(facts=facts, states=[
        SimpleNamespace(server=UNIT, patch=p, state=st) for p, st in rows])])


ALL_AS_INTENDED = [("a", "active"), ("b", "not-applied"), ("c", "active"),
                   ("d", "not-applied")]


@pytest.mark.parametrize("report,verdict", [
    (states(ALL_AS_INTENDED), "pass"),
    (SimpleNamespace(findings=[], hosts=[]), "unknown"),           # no facts at all
    (states([], reachable=False), "unknown"),                      # unreachable host
    (states(ALL_AS_INTENDED[:3]), "unknown"),                      # d not observed
    (states([]), "unknown"),
])
def test_the_audit_gate_passes_only_every_state_observed(report, verdict) -> None:
    from patchset.isolate.rollout.rolloutgates import FleetGates
    result = FleetGates(SERIES, None, {})._states("h1", report, HostState("h1", ("a", "c")),
                                                  [UNIT], ro.Before())
    assert result.verdict == verdict, result.why


def test_an_unset_api_key_variable_is_bad_input_not_unknown(monkeypatch) -> None:
    from patchset.isolate.rollout.rolloutgates import FleetGates
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    gates = FleetGates(SERIES, SimpleNamespace(endpoint=lambda h: None), {},
                       api_key_env="NO_SUCH_KEY_VAR")
    with pytest.raises(UsageError, match="--api-key-env NO_SUCH_KEY_VAR: the variable"):
        gates._throughput("h1")


# ---------------------------------------------------------------- the log, read strictly

def killed_log(world, tmp_path, kill_after=1, **start) -> Path:
    """A log of a run killed after `kill_after` host changes (step 0 done with 2)."""
    world.kill_after = kill_after
    with pytest.raises(Killed):
        ro.start(fleet(), ro.Change(revert=("c",)), plan(), tmp_path, **start)
    return ro.latest_unfinished(tmp_path)


def edit(path: Path, n: int, change) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    change(lines[n - 1])
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))


def setting(key, value):
    def put(plan):
        where = plan["settings"]
        for part in key.split(".")[:-1]:
            where = where[part]
        where[key.split(".")[-1]] = value
    return put


@pytest.mark.parametrize("line,change,message", [
    (1, setting("max_drop", 5), ":1: settings.max_drop: 5 is not within 0 to 1"),
    (1, setting("parallel", 10**9), ":1: settings.parallel:"),
    (1, setting("parallel", 4.5), ":1: settings.parallel: expected int"),
    (1, setting("drift.tolerance", 1e300), ":1: settings.drift.tolerance:"),
    (1, setting("baseline", "base.json"), ":1: settings.baseline: 'base.json' is not an abs"),
    (1, lambda p: p["settings"].pop("max_drop"), ":1: settings: missing max_drop"),
    (1, lambda p: p.update(on_unknown="maybe"), ":1: on_unknown: 'maybe'"),
    (1, lambda p: p["change"].update(revert="c"), ":1: change.revert: expected list"),
    (1, lambda p: p["change"].update(revert=["zz"]), ":1: change.revert: no patch named"),
    (1, lambda p: p["change"].update(evil=1), ":1: change: unknown key(s) evil"),
    (1, lambda p: p["change"].update(select=["b"]), ":1: change: give one change"),
    (1, lambda p: p["change"].update(revert=[], select=["b"]), "not dependency-closed"),
    (1, lambda p: p["change"].update(revert=[], gate_off=["a"]), "a: that patch has no gate"),
    (1, lambda p: p["steps"][1].update(hosts=[]), ":1: steps[1].hosts: 0 hosts"),
    (1, lambda p: p["steps"][1].update(number=0), ":1: steps[1]: step 0"),
    (1, lambda p: p["steps"][2].update(hosts=["h2"]), ":1: steps[2].hosts: h2 changed twice"),
    (1, lambda p: p["steps"][0].update(roles={"h1": ["decode"]}),
     ":1: steps: the role canary's host h1 is in no batch"),
    (3, lambda e: e["before"]["severe"].append({"subject": "x"}),
     ":3: before.severe[0]: missing id"),
    (3, lambda e: e["state"].update(applied=[1]), ":3: state: applied[0]: expected"),
    (3, lambda e: e["state"].update(applied=["zz"]), ":3: state: zz: not in the series"),
    (3, lambda e: e["state"].update(host="h2"), ":3: state.host: 'h2'"),
    (3, lambda e: e.pop("host"), ":3: event: missing host"),
    (3, lambda e: e.update(host="h9"), ":3: host: h9 is not a host of step 0"),
    (3, lambda e: e.update(step=7), ":3: step: 7 is not the step under way"),
    (2, lambda e: e.update(event="step-done", step=0) or e.pop("hosts"),
     ":2: step: step 0 done, but h1 never"),
    (2, lambda e: e.update(event="bogus"), ":2: event: 'bogus' is no event"),
])
def test_a_damaged_or_edited_log_is_refused_before_anything(world, tmp_path, line, change,
                                                            message) -> None:
    path = killed_log(world, tmp_path)
    edit(path, line, change)
    data, changes = path.read_bytes(), list(world.changes)
    with pytest.raises(UsageError, match=re.escape(f"{path.name}{message}"
                                                   if message.startswith(":") else message)):
        ro.resume(lambda names, settings: fleet(), path, SERIES)
    assert path.read_bytes() == data and world.changes == changes


def test_a_step_done_out_of_order_is_refused(world, tmp_path) -> None:
    path = killed_log(world, tmp_path, kill_after=3)          # step 0 and 1 done
    lines = path.read_text().splitlines()
    done = [line for line in lines if '"step-done"' in line]
    path.write_text("\n".join(lines + [done[0]]) + "\n")      # step 0 done once more
    with pytest.raises(UsageError, match=r":\d+: step: 0 is not the step under way"):
        ro.resume(lambda names, settings: fleet(), path, SERIES)


def test_logged_steps_are_checked_against_the_inventory_roles(world, tmp_path) -> None:
    path = killed_log(world, tmp_path)
    bare = fleet()
    bare.hosts["h3"].host.roles = {}
    with pytest.raises(UsageError, match=r":1: steps\[2\].hosts: h3: no prefill or decode"):
        ro.resume(lambda names, settings: bare, path, SERIES)


def test_a_link_at_log_is_refused_and_the_scan_skips_links_and_damage(world, tmp_path,
                                                                      capsys) -> None:
    path = killed_log(world, tmp_path)
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.raises(UsageError, match="link.jsonl: not a regular file"):
        ro.resume(lambda names, settings: fleet(), link, SERIES)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "gone")
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("not json\n")
    said = []
    assert ro.latest_unfinished(tmp_path, said.append) == path
    assert len(said) == 1 and "damaged.jsonl:1" in said[0]


def test_a_torn_last_line_is_cut_before_the_next_write(world, tmp_path) -> None:
    path = killed_log(world, tmp_path)
    with open(path, "a") as f:
        f.write('{"at": "2026-12-05T08:00:00+00:00", "event": "gat')   # cut mid-write
    world.kill_after = len(world.changes) + 1                          # killed again
    with pytest.raises(Killed):
        ro.resume(lambda names, settings: fleet(), path, SERIES)
    assert all(json.loads(line) for line in path.read_text().splitlines())
    run = ro.resume(lambda names, settings: fleet(), path, SERIES)
    assert run.finished and run.exit_code == Exit.OK


def test_a_second_driver_of_one_rollout_is_refused(world, tmp_path) -> None:
    import os
    path = killed_log(world, tmp_path)
    data = path.read_bytes()
    with rolloutlog.locked(path):                             # the first run, still alive
        with pytest.raises(LockedError, match=f"rollout {path.stem}: .*pid {os.getpid()}"):
            ro.resume(lambda names, settings: fleet(), path, SERIES)
    assert path.read_bytes() == data and LockedError.exit_code == Exit.FAILED
    assert ro.resume(lambda names, settings: fleet(), path, SERIES).finished


# ---------------------------------------------------------------- the command's inputs

def drift_run(path: Path, endpoint: str = "e") -> Path:
    from patchset.isolate.measure import drift
    path.write_text(json.dumps({"format": drift.RUN_FORMAT, "endpoint": endpoint,
                                "started": 0, "spec": {}, "sequences": []}))
    return path


def test_the_baseline_is_logged_absolute_and_pinned(tmp_path, monkeypatch) -> None:
    import hashlib
    from patchset.cli import rollout as cli_rollout
    from patchset.isolate.rollout.rolloutgates import load_baseline
    base = drift_run(tmp_path / "base.json")
    monkeypatch.chdir(tmp_path)
    settings = cli_rollout._settings(ro, Path("base.json"), 0.5, 4, None, None, 256, 3,
                                     600.0, 3.0, 0.002, 0.99)
    assert settings.baseline == str(base)
    assert settings.baseline_sha256 == hashlib.sha256(base.read_bytes()).hexdigest()
    drift_run(base, "another run")
    with pytest.raises(UsageError, match="its content changed since the rollout started"):
        load_baseline(base, settings.baseline_sha256)


def test_resume_refuses_a_baseline_changed_since_the_start(world, tmp_path, monkeypatch,
                                                           capsys) -> None:
    from patchset.isolate.rollout.rolloutgates import load_baseline
    base = drift_run(tmp_path / "base.json")
    settings = ro.Settings(str(base), load_baseline(base)[1])
    steps = ro.make_plan(["gpu1", "gpu2"], None, 1, lambda _: ["decode"])
    world.actual.update({h: HostState(h, ("mhc-bf16",)) for h in ("gpu1", "gpu2")})
    world.kill_after = 1
    hosts = {h: DrivenHost(SERIES, SimpleNamespace(name=h, roles=ROLES), None)
             for h in ("gpu1", "gpu2")}
    with pytest.raises(Killed):
        ro.start(ro.Fleet(hosts, FakeGates()), ro.Change(revert=("mhc-bf16",)), steps,
                 tmp_path, settings=settings)
    log = ro.latest_unfinished(tmp_path)
    drift_run(base, "another run")
    code, out, err = run_cli(tmp_path, monkeypatch, capsys, "--resume", "--log", str(log))
    assert code == Exit.BAD_INPUT and "its content changed" in err, err
    assert world.changes == [("gpu1", (), ())]                  # the canary only, once


@pytest.mark.parametrize("argv,message", [
    (("--revert", "mhc-bf16"), "--resume: --revert:"),
    (("gpu1",), "--resume: HOSTS:"),
    (("--load", "2", "--batch", "2"), "--resume: --batch, --load:"),
    (("--baseline", "x.json"), "--resume: --baseline:"),
])
def test_resume_refuses_options_its_log_decides(tmp_path, monkeypatch, capsys, argv,
                                               message) -> None:
    code, out, err = run_cli(tmp_path, monkeypatch, capsys, "--resume", *argv)
    assert code == Exit.BAD_INPUT and message in err, err


@pytest.mark.parametrize("argv,message", [
    (("--only", ""), "--only '': names nothing"),
    (("--revert", ","), "--revert ',': names nothing"),
    (("--revert", "mhc-bf16", "--baseline", "/dev/zero"), "--baseline /dev/zero"),
    (("--revert", "mhc-bf16", "--baseline", "/no/such.json"), "--baseline /no/such.json"),
    (("--revert", "mhc-bf16", "--api-key-env", "NO_SUCH_KEY_VAR"),
     "--api-key-env NO_SUCH_KEY_VAR: the variable is not set"),
    (("gpu9", "--revert", "mhc-bf16"), "gpu9: not in the inventory"),
    (("--revert", "mhc-bf16", "--log", "x.jsonl"), "--log: the log of a rollout to resume"),
])
def test_dry_run_validates_what_a_run_validates(tmp_path, monkeypatch, capsys, argv,
                                                message) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    code, out, err = run_cli(tmp_path, monkeypatch, capsys, *argv, "--dry-run")
    assert code == Exit.BAD_INPUT and message in err, err
