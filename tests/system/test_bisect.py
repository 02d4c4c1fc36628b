"""`patchset bisect` on a real nspawn host (real systemd, real sshd) whose units, rendered
by `patchset deploy`, serve the project's real series through the SGLang stand-in.

The stand-in is told which code breaks context (STANDIN_FAULT_RULES): "the tree's
deepseek_v4.py has mhc-bf16's bf16 GEMM" or "flash_mla_sm120.py has the split-K
switch and MMA_FLASHMLA=1 is in the server's environment". The bisect must find exactly
that change, and the host must end byte for byte as it started: tree, HEAD, state, unit
and env files, running units; also after Ctrl-C and after the controller is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostutil import cli, on_host
from tests.system.test_audit_hosts import TREE, inventory, prepare_host, write_series

pytestmark = pytest.mark.hosts

MHC = {"fault": "drop_history", "file": "srt/models/deepseek_v4.py",
       "contains": "mixes = F.linear(x.flatten(1).bfloat16(), hc_fn.bfloat16()).float()"}
MMA = {"fault": "drop_history", "file": "srt/layers/attention/flash_mla_sm120.py",
       "contains": '_sm120_splitk_mma = os.environ.get("MMA_FLASHMLA") == "1"',
       "env": "MMA_FLASHMLA", "equals": "1"}
STARTING = ["default-thinking-reasoning", "triton-dsa-indexer", "indexer-bf16-gemm",
            "mma-splitk-decode", "mhc-bf16"]
ENV_FILES = "/etc/sglang/prefill.env /etc/sglang/decode.env"
UNITS = "sglang-prefill.service sglang-decode.service"


@pytest.fixture(scope="module")
def env(host_factory, tmp_path_factory, host_client_key) -> dict:
    from tests.hosts.nspawn import write_known_hosts
    from tests.hostutil import free_ports
    [host] = host_factory.start(1, prefix="bisect")
    work = tmp_path_factory.mktemp("bisect")
    known = write_known_hosts([host], work / "known_hosts")
    (work / "ssh_config").write_text("")
    prefill, decode, bootstrap = free_ports(3)
    yield {"host": host, "work": work, "known": known, "series": write_series(work / "series"),
           "ports": {"prefill": prefill, "decode": decode, "bootstrap": bootstrap}}
    host_factory.stop([host])


@pytest.fixture()
def benv(env, monkeypatch, capsys):
    for name, value in _env_vars(env).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(env["work"])
    return env


def _env_vars(env: dict) -> dict[str, str]:
    return {"PATCHSET_KNOWN_HOSTS": str(env["known"]),
            "PATCHSET_SSH_CONFIG": str(env["work"] / "ssh_config"),
            "PATCHSET_HOME": str(env["work"] / "home"),
            "XDG_STATE_HOME": str(env["work"] / "state")}


def serve_with(env: dict, capsys, name: str, rules: list[dict]) -> None:
    """Deploy units whose stand-in breaks context under `rules` (a new rules file name
    changes the env file, so the deploy restarts the servers)."""
    host = env["host"]
    path = f"/etc/standin-{name}.json"
    (host.live_root / path.lstrip("/")).write_text(json.dumps(rules))
    inventory(env, serving={"env": {"STANDIN_STARTUP_DELAY": "0.2",
                                    "STANDIN_FAULT_RULES": path}})
    code, _, err = cli(capsys, "deploy", host.name, "--series", str(env["series"]))
    assert code == 0, err


def snapshot(env: dict) -> dict:
    """Everything the bisect may touch on the host."""
    host = env["host"]
    return {
        "head": on_host(host, f"git -C {TREE} rev-parse HEAD").strip(),
        # the whole state but its `updated` time (a restore is a new transaction)
        "state": {k: v for k, v in json.loads(on_host(
            host, f"cat {TREE}/.patchset/state.json")).items() if k != "updated"},
        "files": on_host(host, f"cd {TREE} && git ls-files -s python/sglang | sha256sum"),
        "env": on_host(host, f"cat {ENV_FILES}"),
        "units": on_host(host, "cat /etc/systemd/system/sglang-prefill.service "
                               "/etc/systemd/system/sglang-decode.service"),
        "active": on_host(host, f"systemctl is-active {UNITS}").split(),
        "record": on_host(host, f"test -e {TREE}/.patchset/bisect.json && echo yes || echo no"),
    }


def bisect(env: dict, capsys, *extra: str) -> tuple[int, dict, str]:
    out_file = env["work"] / "report.json"
    code, out, err = cli(capsys, "bisect", env["host"].name, "--probe", "recall", "--json",
                         "-o", str(out_file), "--series", str(env["series"]), *extra)
    assert out, err
    report = json.loads(out)
    assert report["saved"] == str(out_file)
    assert json.loads(out_file.read_text()) == report          # printed and saved: the same
    return code, report, err


def test_prepare(benv, capsys) -> None:
    prepare_host(benv, capsys)


def test_unconditional_culprit_is_found_by_revert_and_host_restored(benv, capsys) -> None:
    serve_with(benv, capsys, "mhc", [MHC])
    before = snapshot(benv)
    code, report, err = bisect(benv, capsys)
    assert code == 0, err
    assert report["starting"] == STARTING
    plans = [(c["patch"], c["plan"]) for c in report["candidates"]]
    # gates first (the decode runs both gated patches), then the unconditional suspects
    assert plans[:2] == [("mma-splitk-decode", "gate-off"), ("triton-dsa-indexer", "gate-off")] \
        or plans[:2] == [("triton-dsa-indexer", "gate-off"), ("mma-splitk-decode", "gate-off")]
    assert plans[2] == ("mhc-bf16", "revert")
    actions = [(s["action"], s["probe_ok"]) for s in report["steps"]]
    assert actions == [("baseline", False), ("gate-off", False), ("gate-off", False),
                       ("revert", True), ("restore", None)]
    revert = report["steps"][3]
    assert revert["applied"] == [n for n in STARTING if n != "mhc-bf16"]
    assert sorted(revert["restarted"]) == ["decode", "prefill"]    # both run mhc-bf16
    assert report["steps"][1]["restarted"] == ["decode"]           # the gate is decode-only
    assert report["culprit"] == {"patch": "mhc-bf16", "action": "revert",
                                 "change": "revert mhc-bf16, restart", "step": 3}
    assert report["restored"] is True and report["restore_error"] is None
    assert snapshot(benv) == before
    saved = sorted((benv["work"] / "state" / "patchset" / "bisect").glob("*.json"))
    assert not saved, "with -o the report goes only there"
    # the restored host really is broken again: the bisect did not fix it by accident
    code, report2, _ = bisect(benv, capsys)
    assert report2["steps"][0]["probe_ok"] is False


def test_gated_culprit_is_found_by_its_gate_without_any_revert(benv, capsys) -> None:
    serve_with(benv, capsys, "mma", [MMA])
    before = snapshot(benv)
    code, report, err = bisect(benv, capsys)
    assert code == 0, err
    assert report["culprit"]["patch"] == "mma-splitk-decode"
    assert report["culprit"]["action"] == "gate-off"
    assert report["culprit"]["change"] == "MMA_FLASHMLA unset (gate of mma-splitk-decode), restart"
    assert "revert" not in [s["action"] for s in report["steps"]]
    assert report["steps"][-1]["action"] == "restore"
    assert snapshot(benv) == before


def test_no_fault_means_nothing_to_bisect_and_nothing_touched(benv, capsys) -> None:
    serve_with(benv, capsys, "none", [])
    before = snapshot(benv)
    code, report, err = bisect(benv, capsys)
    assert code == 0, err
    assert [s["action"] for s in report["steps"]] == ["baseline"]
    assert report["verdict"] == "the probe passes in the starting state: nothing to bisect"
    assert snapshot(benv) == before


def test_fault_outside_the_series_is_reported_after_trying_every_candidate(benv, capsys) -> None:
    serve_with(benv, capsys, "always", [{"fault": "drop_history"}])
    before = snapshot(benv)
    code, report, err = bisect(benv, capsys)
    assert code == 1, err
    actions = [s["action"] for s in report["steps"]]
    assert actions[0] == "baseline" and actions[-2:] == ["all", "restore"]
    assert not any(s["probe_ok"] for s in report["steps"][:-1])
    assert report["culprit"] is None
    assert report["verdict"].startswith("no change of the series flips the probe")
    assert snapshot(benv) == before


def test_ctrl_c_restores_the_starting_state(benv, capsys, monkeypatch) -> None:
    serve_with(benv, capsys, "mhc2", [MHC])
    before = snapshot(benv)
    from patchset.isolate.search import bisect as bisector
    real = bisector._converge
    calls = []

    def converge_then_ctrl_c(t, bisect_id, applied, gates_off, restarted=None):
        restarted = real(t, bisect_id, applied, gates_off, restarted)
        calls.append(applied)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)      # the operator's Ctrl-C, mid-bisect
        return restarted
    monkeypatch.setattr(bisector, "_converge", converge_then_ctrl_c)
    # Python leaves SIGINT ignored when it was ignored at start (a test run started in the
    # background by a non-interactive shell): the operator's Ctrl-C needs the default
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, report, err = bisect(benv, capsys)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130, err
    assert report["interrupted"] is True and report["restored"] is True
    # the interrupted step is in the report, with the restarts it made (issue 15)
    assert [s["action"] for s in report["steps"]] == ["baseline", "gate-off", "restore"]
    step, restore = report["steps"][1], report["steps"][2]
    assert step["probe_ok"] is None and step["restarted"] == ["decode"]   # its gate's role
    assert report["unit_restarts"] == len(step["restarted"]) + len(restore["restarted"]) == 2
    assert report["states"] == 1
    assert snapshot(benv) == before


def test_an_unreachable_probe_refuses_to_start_and_touches_nothing(benv, capsys) -> None:
    """Before: every step ran (14 restarts) and ended "outside the candidates"."""
    serve_with(benv, capsys, "mhc4", [MHC])
    before = snapshot(benv)
    code, report, err = bisect(benv, capsys, "--url", "http://127.0.0.1:9")
    assert code == 3, err
    assert report["unreachable"] is True and report["verdict"].startswith("not started")
    assert "cannot reach the endpoint in the starting state" in report["error"]
    assert [s["action"] for s in report["steps"]] == [] and report["unit_restarts"] == 0
    assert snapshot(benv) == before


def test_killed_controller_leaves_a_record_and_the_next_apply_restores(benv, capsys) -> None:
    serve_with(benv, capsys, "mhc3", [MHC])
    before = snapshot(benv)
    host = benv["host"]
    proc = subprocess.run(
        [sys.executable, "-m", "patchset.cli", "bisect", host.name, "--probe", "recall",
         "--series", str(benv["series"])],
        env={**os.environ, **_env_vars(benv), "PATCHSET_TEST_CRASH_AT": "bisect-step-1",
             "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        cwd=benv["work"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    during = snapshot(benv)
    assert during["record"].strip() == "yes"
    assert during["env"] != before["env"]                  # a gate is off: a test state
    code, out, _ = cli(capsys, "status", host.name, "--json", "--series", str(benv["series"]))
    assert code == 1 and json.loads(out)[0]["bisect"]["starting"] == STARTING
    # a deploy from elsewhere must not pretend the host is fine: it finishes the restore
    code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp", host.name,
                       "--series", str(benv["series"]))
    assert code == 0, err
    assert "finishing the restore of the bisect started" in err
    assert snapshot(benv) == before


def test_a_bisect_started_elsewhere_is_refused_then_restored_with_restore(benv, capsys) -> None:
    from patchset import api
    from patchset.series.manifest import load_series
    from patchset.connect.resolve import Hosts
    serve_with(benv, capsys, "mhc4", [MHC])
    before = snapshot(benv)
    series = load_series(benv["series"])
    record = {"id": "elsewhere-1", "started": "2026-11-29T00:00:00+00:00",
              "by": "ops@other-box (pid 1)", "controller": "other-box", "pid": 1,
              "probe": "recall", "starting": STARTING, "roles": ["prefill", "decode"]}
    with Hosts(series, None, None, False) as hosts:
        api.bisect_mark(series, hosts.transport(benv["host"].name, provision_local=False),
                        "elsewhere-1", record)
    code, _, err = cli(capsys, "revert", "mhc-bf16", "--host", benv["host"].name,
                       "--series", str(benv["series"]))
    assert code == 4
    assert "a bisect from other-box (ops@other-box (pid 1), since 2026-11-29" in err
    assert f"patchset bisect {benv['host'].name} --restore" in err
    assert snapshot(benv)["state"] == before["state"]        # nothing reverted
    code, _, err = cli(capsys, "bisect", benv["host"].name, "--restore",
                       "--series", str(benv["series"]))
    assert code == 0, err
    assert snapshot(benv) == before


def test_bad_probe_is_exit_2(benv, capsys) -> None:
    code, _, err = cli(capsys, "bisect", benv["host"].name, "--probe", "vibes",
                       "--series", str(benv["series"]))
    assert code == 2 and "--probe 'vibes': expected one of recall, needle, all" in err
