"""Bisect by drift on a real nspawn host (real systemd, real sshd) running the stand-in
under the units `patchset deploy` rendered, with the project's real series applied.

The stand-in's toy model follows the served tree and environment through numerics rules
(tests/standin/README.md, STANDIN_NUMERICS_RULES): here either "the tree carries
mhc-bf16's change -> the carried state is rounded to bf16" (an unconditional patch: found
by reverting) or "MMA_FLASHMLA=1 in the server's environment -> fp16" (the gate of
mma-splitk-decode: found by unsetting the gate, no code change). Batch-order noise is on
(STANDIN_NONDETERMINISM), so every verdict is against measured noise. The probe reaches
the decode server through the host's SSH connection (connect/tunnel.py)."""

from __future__ import annotations

import json
import math

import pytest

from tests.hostutil import cli, free_ports, on_host
from tests.system.test_audit_hosts import (  # noqa: F401 - env and audit_env are the fixtures used here
    audit_env,
    deploy,
    env,
    prepare_host,
)

pytestmark = pytest.mark.hosts

MHC_TEXT = "mixes = F.linear(x.flatten(1).bfloat16(), hc_fn.bfloat16()).float()"
RULES = "/etc/standin-numerics.json"
NOISE = {"STANDIN_STARTUP_DELAY": "0.2", "STANDIN_NONDETERMINISM": "1e-6",
         "STANDIN_NUMERICS_RULES": RULES}
# 1k conversations give 2 sequences a round; a budget of 24 lets the probe add rounds
# until its outcome is decided (isolate/measure/driftdecide.py: the sequence is the unit); the
# tolerance is below the stand-in's drifts (SGLang's 0.002 would bound them all)
BUDGET = ("--budget", "24", "--tolerance", "1e-9")   # the stand-in's drifts: 1e-7..1e-4
PROBE = ("--probe", "drift", "--sizes", "1k", "--output-tokens", "48", "--symptom",
         "decode-quality", *BUDGET)


def rules(env: dict, *rule: dict) -> None:
    (env["host"].live_root / RULES.lstrip("/")).write_text(json.dumps(list(rule)))


def snapshot(env: dict) -> dict:
    host = env["host"]
    return {"tree": on_host(host, "cd /opt/sglang && git rev-parse HEAD && git status "
                                  "--porcelain --untracked-files=no"),
            "files": on_host(host, "cat /etc/sglang/*.env /etc/systemd/system/sglang-*.service"),
            "record": on_host(host, "test -e /opt/sglang/.patchset/bisect.json && echo yes "
                                    "|| echo no")}


def bisect(env: dict, capsys) -> tuple[int, dict]:
    out_file = env["work"] / "drift-bisect.json"
    code, out, err = cli(capsys, "bisect", env["host"].name, *PROBE, "--json", "-o",
                         str(out_file), "--series", str(env["series"]))
    assert out, err
    return code, json.loads(out)


@pytest.fixture()
def served(audit_env, capsys):
    """The host at the baseline with the stand-in's numerics rules in its environment."""
    if not audit_env.get("drift"):
        prepare_host(audit_env, capsys)
        rules(audit_env)
        audit_env["drift"] = True
    deploy(audit_env, capsys, serving={"env": NOISE})
    return audit_env


def restart(env: dict, capsys, version: str) -> None:
    """The servers read the rules at start: a deploy with a changed env file restarts them
    and waits for /health."""
    deploy(env, capsys, serving={"env": {**NOISE, "RULES_VERSION": version}})


def probe(env: dict, capsys) -> tuple[int, dict]:
    code, out, err = cli(capsys, "probe", env["host"].name, "--kind", "drift", "--sizes", "1k",
                         "--output-tokens", "48", "--format", "json", *BUDGET)
    assert out, err
    return code, json.loads(out)


def test_drift_above_noise_with_the_mhc_rule_within_without(served, capsys) -> None:
    rules(served, {"op": "state", "precision": "bf16", "file": "srt/models/deepseek_v4.py",
                   "contains": MHC_TEXT})
    restart(served, capsys, "probe-mhc")
    code, loud = probe(served, capsys)
    assert code == 1 and loud["report"]["verdict"]["above"] is True, loud["report"]["verdict"]
    assert "via ssh" in loud["report"]["endpoint"]
    rules(served)
    restart(served, capsys, "probe-none")
    code, quiet = probe(served, capsys)
    assert code == 0 and quiet["report"]["verdict"]["outcome"] == "bounded", \
        quiet["report"]["verdict"]
    assert loud["report"]["overall"]["overall"]["mean"] > 100 * quiet["report"]["overall"][
        "overall"]["mean"]


def bound(report: dict) -> int:
    n = len([c for c in report["candidates"] if c["plan"] != "skip"])
    return math.ceil(math.log2(n)) + 1 if n > 1 else 1


def test_bisect_attributes_the_drift_to_mhc_bf16_within_the_bound(served, capsys) -> None:
    rules(served, {"op": "state", "precision": "bf16", "file": "srt/models/deepseek_v4.py",
                   "contains": MHC_TEXT})
    restart(served, capsys, "bisect-mhc")
    before = snapshot(served)
    code, report = bisect(served, capsys)
    assert code == 0, report["verdict"]
    assert report["strategy"] == "group-testing" and report["restored"] is True
    assert report["culprit"]["patch"] == "mhc-bf16" and report["culprit"]["action"] == "revert"
    assert report["states"] <= bound(report), (report["states"], report["candidates"])
    values = {c["suspect"]: c for c in report["contributions"]}
    assert values["mhc-bf16"]["value"] > values["mhc-bf16"]["low"] > 0
    assert all(c["value"] is None or c["value"] < values["mhc-bf16"]["low"]
               for name, c in values.items() if name != "mhc-bf16")
    assert report["unit_restarts"] == sum(len(s["restarted"]) for s in report["steps"])
    assert report["steps"][-1]["action"] == "restore"
    assert report["undecided"] == []
    for step in report["steps"][1:-1]:      # each state judged against the start's noise
        ab, here = step["probes"]
        assert ab["verdict"]["outcome"] in ("above", "bounded"), ab["verdict"]
        # a state clears only when its own prefill vs decode is bounded (on 16 sequences)
        assert (here["verdict"]["outcome"] == "bounded") is step["probe_ok"], (here, step)
    assert snapshot(served) == before


def test_a_gate_driven_culprit_is_found_without_a_revert(served, capsys) -> None:
    rules(served, {"op": "state", "precision": "fp16", "env": "MMA_FLASHMLA", "equals": "1"})
    restart(served, capsys, "bisect-gate")
    before = snapshot(served)
    code, report = bisect(served, capsys)
    assert code == 0, report["verdict"]
    assert report["culprit"]["patch"] == "mma-splitk-decode"
    assert report["culprit"]["action"] == "gate-off"
    tests = [s for s in report["steps"] if s["action"] not in ("baseline", "restore")]
    starting = report["starting"]
    assert tests and all(s["applied"] == starting for s in tests)     # no revert, ever
    assert report["states"] <= bound(report)
    assert snapshot(served) == before


def test_through_the_router_the_prefill_server_is_compared_with_the_decode_server(
        served, capsys) -> None:
    """With a router, generation runs prefill then decode, the replay is the prefill
    server's: a rule in the decode server's environment only (MMA_FLASHMLA=1 there; the
    prefill role sets it to 0) is the prefill/decode drift of the users' symptom."""
    rules(served, {"op": "state", "precision": "bf16", "env": "MMA_FLASHMLA", "equals": "1"})
    [port] = free_ports(1)
    deploy(served, capsys, serving={"env": {**NOISE, "RULES_VERSION": "router"}},
           roles={"router": {"port": port, "host": "127.0.0.1"}})
    try:
        code, data = probe(served, capsys)
        report = data["report"]
        assert f"127.0.0.1:{port} via ssh" in report["endpoint"]       # the router's port
        assert code == 1 and report["verdict"]["above"] is True, report["verdict"]
        names = [s["name"] for s in report["sequences"]]
        assert names[:2] == ["ops-1k/turn-1", "ops-1k/turn-2"] and len(names) <= 24
    finally:
        deploy(served, capsys, serving={"env": {**NOISE, "RULES_VERSION": "router-off"}})
