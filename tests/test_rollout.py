"""`patchset rollout` with fakes: the plan, what each gate's verdict means for the run, the
rollback of every changed host to its saved state, the log, and resume after a kill
(no step's change made twice). Real hosts: tests/test_rollout_hosts.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from patchset.errors import Exit, UsageError
from patchset.isolate import rollout as ro
from patchset.isolate.hoststate import DrivenHost, HostState

SERIES = SimpleNamespace(patches=[SimpleNamespace(name=n, depends=d) for n, d in (
    ("a", []), ("b", ["a"]), ("c", []), ("d", []))])
ROLES = {"prefill": {}, "decode": {}}


class Killed(BaseException):
    """A kill of the controller between two side effects (not caught by the rollout)."""


@dataclass
class World:
    """What the fake hosts run, and every change made to them (the side effects)."""

    actual: dict[str, HostState]
    changes: list[tuple[str, tuple, tuple]] = field(default_factory=list)
    kill_after: int | None = None          # kill once this many changes were made

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
        return self.converge(t, list(state.applied), list(state.gates_off))


class FakeGates:
    """Every gate passes, except the verdicts scripted per (host, gate)."""

    def __init__(self, verdicts: dict[tuple[str, str], str] | None = None) -> None:
        self.verdicts = verdicts or {}
        self.checked: list[str] = []

    def before(self, host: str) -> dict:
        return {"severe": [], "tokens_per_second": 100.0}

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
    from patchset.isolate.rolloutgates import FleetGates
    gates = FleetGates(SERIES, None, {}, max_drop=0.5)
    gates._throughput = lambda host: (after, "" if after else "no answer")
    result = gates._load("h1", {"tokens_per_second": before, "throughput_why": ""})
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
                                   ["sglang-decode.service"])
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
    with pytest.raises(Killed):
        ro.start(fleet(), ro.Change(revert=("c",)), plan(batch=2), tmp_path,
                 settings={"baseline": "base.json", "max_drop": 0.2})
    path = ro.latest_unfinished(tmp_path)
    assert path is not None
    gates, asked = FakeGates(), []
    run = ro.resume(lambda names, settings: asked.append((names, settings)) or fleet(gates),
                    path)
    # the gates are built as the run started them, not from the resuming command
    assert asked == [(["h1", "h2", "h3"], {"baseline": "base.json", "max_drop": 0.2})]
    assert run.resumed and run.finished and run.done == [0, 1]
    assert [c[0] for c in world.changes] == ["h1", "h2", "h3"]   # each host changed once
    assert gates.checked == ["h2", "h3"]                    # step 0 was not redone
    assert ro.latest_unfinished(tmp_path) is None
    with pytest.raises(UsageError, match="has ended"):
        ro.resume(lambda names, settings: fleet(), path)


def test_a_kill_during_the_rollback_is_finished_by_resume(world, tmp_path,
                                                          monkeypatch) -> None:
    before = dict(world.actual)
    gates = FakeGates({("h2", "audit"): "fail"})
    world.kill_after = 3                                    # h1, h2 changed; killed in rollback
    with pytest.raises(Killed):
        ro.start(fleet(gates), ro.Change(revert=("c",)), plan(), tmp_path)
    path = ro.latest_unfinished(tmp_path)
    run = ro.resume(lambda names, settings: fleet(FakeGates()), path)
    assert run.stopped and "h2 audit fail" in run.stopped and world.actual == before
    assert [c[0] for c in world.changes] == ["h1", "h2", "h2", "h1"]


def test_a_damaged_log_is_named_by_line(tmp_path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"event": "plan"}\nnot json\n{"event": "end"}\n')
    with pytest.raises(UsageError, match=r"x.jsonl:2: not a JSON line"):
        ro.Log(path).read()
    path.write_text('{"event": "plan"}\n{"event": "st')    # a last line cut by a kill
    assert ro.Log(path).read() == [{"event": "plan"}]


# ---------------------------------------------------------------- the command

ROOT = Path(__file__).resolve().parent.parent
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
