"""`patchset rollout` on two real nspawn hosts (real systemd, real sshd), each serving the
stand-in as prefill + decode under the units `patchset deploy` rendered, with the
project's real series applied (all but the clamp patch).

The stand-in runs deterministically (no batch-order noise), with one numerics rule:
"the tree carries the clamp patch's code -> the carried state is rounded to bf16"
(tests/standin/README.md). So a rollout that applies the clamp patch moves the output
and its drift gate must stop it; a revert of indexer-bf16-gemm moves nothing and must
reach every host. The drift baseline is a run saved from the first host before any
rollout (`patchset probe --kind drift --save`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.hosts.hostsetup import ARGS, MODEL, TREE, VENV, checkpoint
from tests.hostutil import cli, free_ports, on_host
from tests.system.test_audit_hosts import write_series
from tests.standin.install import install_standin

pytestmark = pytest.mark.hosts

RULES = "/etc/standin-numerics.json"
CLAMP_RULE = {"op": "state", "precision": "bf16", "file": "srt/layers/moe/cutlass_moe.py",
              "contains": "silu_and_mul_clamp(c1, intermediate, swiglu_limit)"}
SERVING_ENV = {"STANDIN_STARTUP_DELAY": "0.2", "STANDIN_NUMERICS_RULES": RULES}
DRIFT = ("--sizes", "1k", "--output-tokens", "48", "--tolerance", "1e-9")
# throughput on a shared test machine swings several-fold between two short loads (a
# "before" of 1600 tok/s, an "after" of 276 was seen): here the gate measures and logs,
# its verdict logic is tested in tests/unit/test_rollout.py
GATES = ("--max-throughput-drop", "1", "--load", "2", *DRIFT[2:])
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fleet_env(host_factory, tmp_path_factory, host_client_key) -> dict:
    from tests.hosts.nspawn import write_known_hosts
    hosts = host_factory.start(2, prefix="roll")
    work = tmp_path_factory.mktemp("rollout-hosts")
    known = write_known_hosts(hosts, work / "known_hosts")
    (work / "ssh_config").write_text("")
    ports = {h.name: dict(zip(("prefill", "decode", "bootstrap"), free_ports(3)))
             for h in hosts}
    yield {"hosts": hosts, "work": work, "known": known, "ports": ports,
           "series": write_series(work / "series"), "ready": False}
    host_factory.stop(hosts)


@pytest.fixture()
def env(fleet_env, monkeypatch, capsys) -> dict:
    work = fleet_env["work"]
    for name, value in {"PATCHSET_KNOWN_HOSTS": str(fleet_env["known"]),
                        "PATCHSET_SSH_CONFIG": str(work / "ssh_config"),
                        "PATCHSET_HOME": str(work / "home"),
                        "XDG_STATE_HOME": str(work / "state")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(work)
    if not fleet_env["ready"]:
        _prepare(fleet_env, capsys)
        fleet_env["ready"] = True
    return fleet_env


def host_spec(env: dict, host) -> dict:
    ports = env["ports"][host.name]
    return {"address": host.ip, "port": host.port, "user": "root",
            "identity_file": str(host.client_key), "tree": TREE, "python": f"{VENV}/bin/python",
            "serving": {"model_path": MODEL, "transfer_backend": "fake", "env": SERVING_ENV},
            "roles": {"prefill": {"gpus": "0,1", "port": ports["prefill"],
                                  "bootstrap_port": ports["bootstrap"],
                                  "extra_args": list(ARGS),
                                  "env": {"TRITON_INDEXER": "0", "MMA_FLASHMLA": "0"}},
                      "decode": {"gpus": "2,3", "port": ports["decode"],
                                 "extra_args": list(ARGS)}}}


def hosts_yaml(env: dict) -> Path:
    path = env["work"] / "hosts.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "hosts": {
        h.name: host_spec(env, h) for h in env["hosts"]}}, sort_keys=False))
    return path


def ansible_yaml(env: dict) -> Path:
    """The same fleet as an Ansible YAML inventory: connection in ansible_* variables,
    patchset's settings under the `patchset` namespace."""
    hosts = {}
    for h in env["hosts"]:
        spec = host_spec(env, h)
        hosts[h.name] = {"ansible_host": spec.pop("address"), "ansible_port": spec.pop("port"),
                         "ansible_user": spec.pop("user"),
                         "ansible_ssh_private_key_file": spec.pop("identity_file"),
                         "patchset": spec}
    path = env["work"] / "fleet.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu": {"hosts": hosts}}}},
                                   sort_keys=False))
    return path


def _prepare(env: dict, capsys) -> None:
    """Each host: a fresh tree with the series (all but the clamp patch), the stand-in,
    the checkpoint, the rule; deployed; then the drift baseline saved from the first."""
    inventory = hosts_yaml(env)
    for host in env["hosts"]:
        on_host(host, f"rm -rf {TREE}")
        (host.live_root / RULES.lstrip("/")).write_text(json.dumps([CLAMP_RULE]))
        code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp",
                           host.name, "--inventory", str(inventory), "--series",
                           str(env["series"]))
        assert code == 0, err
        install_standin(host, venv=VENV, tree=TREE)
        checkpoint(host)
        code, _, err = cli(capsys, "deploy", host.name, "--inventory", str(inventory),
                           "--series", str(env["series"]))
        assert code == 0, err
    code, out, err = cli(capsys, "probe", env["hosts"][0].name, "--kind", "drift", *DRIFT,
                         "--budget", "16", "--save", str(env["work"] / "baseline.json"),
                         "--inventory", str(inventory), "--format", "json")
    assert code == 0, (out, err)


def snapshot(env: dict, capsys) -> dict:
    """What each host runs: the tree (HEAD, changed files, their content), the units and
    env files, and the applied patches with their hashes."""
    out = {}
    for host in env["hosts"]:
        code, status, err = cli(capsys, "status", host.name, "--json", "--inventory",
                                str(hosts_yaml(env)), "--series", str(env["series"]))
        assert code in (0, 1), err
        record = json.loads(status)
        record = record[0] if isinstance(record, list) else record
        out[host.name] = {
            "tree": on_host(host, f"cd {TREE} && git rev-parse HEAD && git status --porcelain "
                                  "--untracked-files=no && git diff | sha256sum"),
            "units": on_host(host, "cat /etc/sglang/*.env /etc/systemd/system/sglang-*.service"
                                   " && systemctl is-active sglang-prefill sglang-decode"),
            "applied": [(a["name"], a["sha256"]) for a in record["applied"]]}
    return out


def rollout(env: dict, capsys, *argv: str, inventory: Path | None = None) -> tuple[int, dict]:
    code, out, err = cli(capsys, "rollout", *argv, "--json", "--inventory",
                         str(inventory or hosts_yaml(env)), "--series", str(env["series"]))
    assert out, err
    kept = env["work"] / "outputs"                 # kept for reading (docs/howto/rollout.md)
    kept.mkdir(exist_ok=True)
    (kept / f"rollout-{len(list(kept.iterdir()))}.json").write_text(out)
    return code, json.loads(out)


def log_events(run: dict) -> list[dict]:
    return [json.loads(line) for line in Path(run["log"]).read_text().splitlines()]


def names(env: dict) -> list[str]:
    return [h.name for h in env["hosts"]]


def test_dry_run_prints_the_plan_and_changes_nothing(env, capsys) -> None:
    before = snapshot(env, capsys)
    h1, h2 = names(env)
    code, out, err = cli(capsys, "rollout", "--tier", "risky", "--canary", f"{h2}:decode",
                         "--dry-run", "--inventory", str(hosts_yaml(env)), "--series",
                         str(env["series"]))
    assert code == 0, err
    (env["work"] / "dry-run.txt").write_text(out)
    assert f"step 0 canary: {h2}:decode" in out and f"step 1 batch: {h2}" in out
    assert f"step 2 batch: {h1}" in out and "dry run: nothing changed" in out
    assert not (env["work"] / "state" / "patchset" / "rollout").exists() or not list(
        (env["work"] / "state" / "patchset" / "rollout").iterdir())
    assert snapshot(env, capsys) == before


def test_a_canary_whose_drift_gate_fails_is_rolled_back(env, capsys) -> None:
    before = snapshot(env, capsys)
    h1, h2 = names(env)
    code, run = rollout(env, capsys, "--tier", "risky", "--canary", h1, "--baseline",
                        str(env["work"] / "baseline.json"), *GATES)
    assert code == 1, run
    drift = [g for g in run["gates"] if g["gate"] == "drift"]
    assert [(g["host"], g["verdict"]) for g in drift] == [(h1, "fail")]
    assert drift[0]["why"].startswith("above") and drift[0]["figures"]["outcome"] == "above"
    assert run["done"] == [] and run["rolled_back"] == [h1]
    assert run["stopped"].startswith(f"{h1} drift fail")
    kinds = [e["event"] for e in log_events(run)]
    assert kinds == ["plan", "step-start", "saved", "changed", "gates", "stop", "rollback",
                     "end"]
    assert snapshot(env, capsys) == before           # the fleet exactly as before


def test_passing_gates_reach_every_host_in_the_given_batches(env, capsys) -> None:
    h1, h2 = names(env)
    code, run = rollout(env, capsys, "--revert", "indexer-bf16-gemm", "--canary",
                        f"{h2}:decode", "--batch", "1", "--baseline",
                        str(env["work"] / "baseline.json"), *GATES)
    assert code == 0, run["stopped"]
    assert [s["hosts"] for s in run["steps"]] == [[h2], [h2], [h1]]
    assert run["steps"][0]["roles"] == {h2: ["decode"]} and run["done"] == [0, 1, 2]
    verdicts = {(g["step"], g["host"], g["gate"]): g["verdict"] for g in run["gates"]}
    assert set(verdicts.values()) == {"pass"}, run["gates"]
    assert len(verdicts) == 3 * 4
    changed = [e for e in log_events(run) if e["event"] == "changed"]
    assert [(e["step"], e["host"], sorted(e["restarted"])) for e in changed] == [
        (0, h2, ["decode"]), (1, h2, ["prefill"]), (2, h1, ["decode", "prefill"])]
    after = snapshot(env, capsys)
    for h in (h1, h2):
        assert "indexer-bf16-gemm" not in [n for n, _ in after[h]["applied"]]


def test_a_killed_rollout_resumes_from_an_ansible_inventory(env, capsys) -> None:
    """Put indexer-bf16-gemm back (the series as prepared), driven by the Ansible
    inventory; the run is killed once the second step changed its host, then resumed:
    no host is changed twice, every host reaches the target."""
    h1, h2 = names(env)
    fleet = ansible_yaml(env)
    argv = [sys.executable, "-m", "patchset.cli", "rollout", "--exclude",
            "nvfp4-cutlass-swiglu-clamp", "--batch", "1", "--baseline",
            str(env["work"] / "baseline.json"), *GATES, "--inventory", str(fleet),
            "--series", str(env["series"])]
    logs = env["work"] / "state" / "patchset" / "rollout"
    seen = set(logs.glob("*.jsonl")) if logs.exists() else set()
    proc = subprocess.Popen(argv, cwd=env["work"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(
                                ROOT)}, start_new_session=True)
    try:
        path = _wait_for(logs, seen, lambda e: e["event"] == "changed" and e["step"] == 1,
                         proc)
        os.killpg(proc.pid, signal.SIGKILL)            # the controller dies mid-step
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    code, run = rollout(env, capsys, "--resume", "--log", str(path), inventory=fleet)
    assert code == 0, run["stopped"]
    assert run["resumed"] and run["done"] == [0, 1]
    changed = [e for e in log_events(run) if e["event"] == "changed"]
    assert [(e["step"], e["host"]) for e in changed] == [(0, h1), (1, h2), (1, h2)]
    assert changed[1]["restarted"] and changed[2]["restarted"] == []   # not redone
    assert [g["step"] for g in run["gates"]] == [1] * 4                # step 0 not re-gated
    gates = {g["gate"]: g for g in run["gates"]}       # gated as the run started, not as
    assert gates["drift"]["verdict"] == "pass"         # the resuming command's defaults
    assert gates["throughput"]["figures"]["max_drop"] == 1.0
    for host, state in snapshot(env, capsys).items():
        assert "indexer-bf16-gemm" in [n for n, _ in state["applied"]], host


def _wait_for(logs: Path, seen: set, match, proc, timeout: float = 400) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the rollout ended before the point of the kill"
        for path in set(logs.glob("*.jsonl")) - seen if logs.exists() else ():
            lines = path.read_text().splitlines()
            if any(match(json.loads(line)) for line in lines if line.endswith("}")):
                return path
        time.sleep(0.2)
    raise AssertionError("the rollout never reached the point of the kill")
