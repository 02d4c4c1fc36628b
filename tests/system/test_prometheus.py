"""A real Prometheus scraping `patchset serve`, which audits a real nspawn host (real
systemd, real sshd) running the SGLang stand-in under the units `patchset deploy`
rendered, with the project's real series applied (the host of tests/system/test_audit_hosts.py,
set up by its helpers), with the drift probe in every audit (and the tracer off: the states
stay declared).

Prometheus runs on loopback with its own config and data directory, a free port, a 1 s
scrape and evaluation interval and the shipped alert rules (monitoring/, `for:` set to 0 s
so an alert fires on the first evaluation that holds). Everything is asserted through
Prometheus' HTTP API: the series and their values, a state change after a redeploy, the
stale-process alert after an apply without a restart, every dashboard panel's query.
The exporter and Prometheus are stopped (SIGTERM) by the fixtures' finalizers and must
exit by themselves; the host is stopped by the module's `env` fixture."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from patchset.auditor import report as report_mod
from tests.hostutil import cli
from tests.system.test_audit_hosts import (  # noqa: F401 - env and audit_env are the fixtures used here
    D,
    P,
    SEED_STATES,
    audit_env,
    deploy,
    env,
    prepare_host,
)
from tests.system.test_drift_hosts import MHC_TEXT, NOISE, rules
from tests.unit.test_metrics import DASHBOARD, RULES, get as http, promql

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 3                     # seconds between the audits of the host
PROBE = ("--probe", "drift", "--probe-sizes", "1k")
MHC_RULE = {"op": "state", "precision": "bf16", "file": "srt/models/deepseek_v4.py",
            "contains": MHC_TEXT}
EXPECTED = SEED_STATES
# The tracer off: with it on, the probes' requests are served work and the stand-in runs
# none of the patched functions, so the states would turn `inert` (observed) from the
# second audit on (tests/system/test_observed_hosts.py has that); here they stay declared.
SERVING = {"env": NOISE, "trace": False}


def free_port() -> int:
    from tests.hosts.hostsetup import free_ports
    return free_ports(1)[0]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90.0,
             until: Callable[[Any], Any] = bool) -> Any:
    """check()'s first answer that `until` accepts (truthy by default), polled; fails
    naming `what` and the last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if until(last):
            return last
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}; last: {last!r}")


def stop(proc: subprocess.Popen, name: str) -> int:
    """SIGTERM, then the process must exit by itself within 30 s (killed and failed
    otherwise): nothing is left running."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"{name} did not stop on SIGTERM")
    return proc.returncode


class Prom:
    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str) -> list[dict]:
        code, body = http(f"{self.base}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}))
        doc = json.loads(body or b"{}")
        assert code == 200 and doc.get("status") == "success", (expr, code, body[:500])
        return doc["data"]["result"]

    def alerts(self, name: str, state: str = "firing") -> list[dict]:
        code, body = http(f"{self.base}/api/v1/alerts")
        assert code == 200, body[:500]
        return [a["labels"] for a in json.loads(body)["data"]["alerts"]
                if a["labels"]["alertname"] == name and a["state"] == state]

    def states(self) -> dict[tuple[str, str], str]:
        return {(r["metric"]["server"], r["metric"]["patch"]): r["metric"]["state"]
                for r in self.query("patchset_patch_state")}


def test_prepare(audit_env, capsys) -> None:
    """The host of test_audit_hosts (series but the clamp applied, stand-in, checkpoint)
    with the stand-in's numerics rule for mhc-bf16's change: its drift is above the noise."""
    prepare_host(audit_env, capsys)
    rules(audit_env, MHC_RULE)
    deploy(audit_env, capsys, serving=SERVING)


@pytest.fixture(scope="module")
def exporter(env) -> dict:
    """`patchset serve HOST` as a real process, on a free loopback port."""
    port = free_port()
    work: Path = env["work"]
    child_env = dict(os.environ, PATCHSET_KNOWN_HOSTS=str(env["known"]),
                     PATCHSET_SSH_CONFIG=str(work / "ssh_config"),
                     PATCHSET_HOME=str(work / "home"),
                     PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "patchset.cli", "serve", env["host"].name,
                             "--listen", f"127.0.0.1:{port}", "--interval", f"{INTERVAL}s",
                             "--series", str(env["series"]), *PROBE],
                            cwd=work, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("the exporter's /healthz", lambda: proc.poll() is None and
                 http(base + "/healthz")[0] == 200 or proc.poll() is not None, 60)
        assert proc.poll() is None, (work / "serve.log").read_text()
        yield {"base": base, "port": port, "proc": proc, "log": work / "serve.log"}
    finally:
        code = stop(proc, "patchset serve")
        log.close()
        assert code == 0, (work / "serve.log").read_text()[-3000:]
        assert "patchset serve: stopped" in (work / "serve.log").read_text()


@pytest.fixture(scope="module")
def prometheus(exporter, tmp_path_factory) -> Prom:
    """Prometheus on loopback scraping the exporter every second, with the shipped rules."""
    root = tmp_path_factory.mktemp("prometheus")
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"                   # the expressions exactly as shipped
    (root / "rules.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (root / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "scrape_timeout": "1s"},
        "rule_files": [str(root / "rules.yml")],
        "scrape_configs": [{"job_name": "patchset", "static_configs": [
            {"targets": [f"127.0.0.1:{exporter['port']}"]}]}]}))
    check = subprocess.run(["promtool", "check", "config", str(root / "prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log = (root / "prometheus.log").open("w")
    proc = subprocess.Popen(["prometheus", f"--config.file={root / 'prometheus.yml'}",
                             f"--storage.tsdb.path={root / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=root)
    try:
        prom = Prom(f"http://127.0.0.1:{port}")
        wait_for("Prometheus ready", lambda: proc.poll() is not None or
                 http(prom.base + "/-/ready")[0] == 200, 60)
        assert proc.poll() is None, (root / "prometheus.log").read_text()[-3000:]
        wait_for("a scrape of the exporter", lambda: [
            t for t in json.loads(http(prom.base + "/api/v1/targets")[1])["data"]
            ["activeTargets"] if t["health"] == "up"], 60)
        yield prom
    finally:
        code = stop(proc, "prometheus")
        log.close()
        assert code == 0, (root / "prometheus.log").read_text()[-3000:]


def test_series_and_values_through_prometheus(exporter, prometheus, audit_env) -> None:
    host = audit_env["host"].name
    wait_for("the patch states", lambda: prometheus.states() == EXPECTED and
             prometheus.query("patchset_probe_drift_mean"))
    up = prometheus.query("patchset_host_up")
    assert [(r["metric"]["host"], r["metric"]["job"], r["value"][1]) for r in up] == \
        [(host, "patchset", "1")]
    firing = {(r["metric"]["server"], r["metric"]["hazard"]): r["value"][1]
              for r in prometheus.query("patchset_hazard_firing")}
    assert firing == {(P, "nvfp4-cutlass-no-swiglu-clamp"): "1",
                      (D, "nvfp4-cutlass-no-swiglu-clamp"): "1"}
    stale = {r["metric"]["server"]: r["value"][1]
             for r in prometheus.query("patchset_stale_process")}
    assert stale == {P: "0", D: "0"}
    deployed = {(r["metric"]["server"], r["metric"]["patch"]): r["metric"]["state"]
                for r in prometheus.query("patchset_patch_deployed_state")}
    assert deployed == EXPECTED
    assert prometheus.query('patchset_check_findings{check="checkpoint-dtypes[narrowed]", '
                            'status="warn"} == 1')
    assert float(prometheus.query("patchset_gather_duration_seconds")[0]["value"][1]) > 0
    age = prometheus.query("time() - patchset_last_success_timestamp_seconds")
    assert 0 <= float(age[0]["value"][1]) < 60
    assert prometheus.query("patchset_audit_interval_seconds")[0]["value"][1] == str(INTERVAL)
    # the drift probe: mhc-bf16's change rounds the stand-in's carried state to bf16
    drift = prometheus.query("patchset_probe_drift_above == 1")
    assert [r["metric"]["name"] for r in drift] == ["drift"]
    assert prometheus.query("patchset_probe_drift_mean > patchset_probe_drift_noise_mean")
    assert prometheus.query('patchset_probe_ok{probe="drift"}')[0]["value"][1] == "0"
    wait_for("PatchsetProbeFailing", lambda: prometheus.alerts("PatchsetProbeFailing"))
    wait_for("PatchsetHazardFiring on both servers", lambda: sorted(
        a["server"] for a in prometheus.alerts("PatchsetHazardFiring")) == [D, P])
    assert prometheus.alerts("PatchsetStaleProcess") == []
    assert prometheus.alerts("PatchsetNoSuccessfulAudit") == []
    # the exporter's own views of the same audit
    code, body = http(exporter["base"] + "/report.json")
    data = json.loads(body)
    assert code == 200 and report_mod.validate(data) == []
    assert {(s["server"], s["patch"]): s["state"] for s in data["hosts"][0]["states"]} == \
        EXPECTED
    health = json.loads(http(exporter["base"] + "/healthz")[1])
    assert health["status"] == "ok" and health["hosts"][host]["audits"] >= 1


def test_every_dashboard_panel_query_returns_data(prometheus) -> None:
    doc = json.loads(DASHBOARD.read_text())
    wait_for("two scrapes of the error counters", lambda: prometheus.query(
        "increase(patchset_audit_errors_total[1m])"))
    empty = [(p["title"], t["expr"]) for p in doc["panels"] for t in p["targets"]
             if not prometheus.query(promql(t["expr"]))]
    assert empty == []
    variable = next(v for v in doc["templating"]["list"] if v["name"] == "host")
    assert variable["query"]["query"] == "label_values(patchset_host_up, host)"
    assert prometheus.query("count by (host) (patchset_host_up)")


def test_stale_process_alert_after_an_apply_without_restart(prometheus, audit_env,
                                                            capsys) -> None:
    host = audit_env["host"].name
    time.sleep(1.1)                         # state.json's time has one-second resolution
    code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp,mhc-bf16",
                       host, "--series", str(audit_env["series"]))
    assert code == 0, err
    try:
        firing = wait_for("PatchsetStaleProcess", lambda: sorted(
            a["server"] for a in prometheus.alerts("PatchsetStaleProcess")) == [D, P] and
            prometheus.alerts("PatchsetStaleProcess"))
        assert {a["host"] for a in firing} == {host}
        assert {a["severity"] for a in firing} == {"warning"}
        # judged by what the processes loaded: the states did not change (waited for, as
        # a fact read late under load shows `unknown` for one audit)
        wait_for("the states as deployed", prometheus.states, 30,
                 until=lambda got: got == EXPECTED)
    finally:
        code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp",
                           host, "--series", str(audit_env["series"]), "--restart")
        assert code == 0, err
    wait_for("the stale processes restarted", lambda: {
        r["value"][1] for r in prometheus.query("patchset_stale_process")} == {"0"} and
        prometheus.alerts("PatchsetStaleProcess") == [])


def test_state_change_after_a_redeploy(prometheus, audit_env, capsys) -> None:
    """A redeploy with the decode unit's gate off: mma-splitk-decode goes gated-off there;
    the new process records its states afresh, so it is no change from what was deployed."""
    deploy(audit_env, capsys, serving=SERVING,
           roles={"decode": {"env": {"MMA_FLASHMLA": "0"}}})
    try:
        wait_for("mma-splitk-decode gated-off in decode, the rest as deployed",
                 prometheus.states,
                 until=lambda got: got == {**EXPECTED, (D, "mma-splitk-decode"): "gated-off"})
        deployed = wait_for("the new process's record", lambda: [
            r["metric"]["state"] for r in prometheus.query(
                f'patchset_patch_deployed_state{{server="{D}", patch="mma-splitk-decode"}}')
            if r["metric"]["state"] == "gated-off"])
        assert deployed == ["gated-off"]
        assert prometheus.alerts("PatchsetPatchStateChanged") == []
        assert prometheus.query('patchset_patch_state{state="gated-off"} unless on (host, '
                                'server, patch, state) patchset_patch_deployed_state') == []
    finally:
        deploy(audit_env, capsys, serving=SERVING)
    wait_for("mma-splitk-decode active again", lambda: prometheus.states() == EXPECTED)


def test_state_changed_alert_after_a_hand_edit(prometheus, audit_env) -> None:
    """A hand edit of mhc-bf16's file under the running servers: the patch is drifted in
    both, while their processes started with it active (what was deployed)."""
    from tests.audit_facts import synth
    from tests.hostutil import on_host
    host = audit_env["host"]
    path = synth.real_series(audit_env["work"] / "compose-prom").by_name()[
        "mhc-bf16"].files[0].path
    on_host(host, f"echo '# hand edit' >> /opt/sglang/{path}")
    try:
        # Rules run with `for: 0s` here, so a fact read late in one audit (a slow host under
        # CI's load: `unknown`) would fire too: wait for the set the hand edit gives.
        drifted = [(D, "mhc-bf16", "drifted"), (P, "mhc-bf16", "drifted")]
        firing = wait_for("PatchsetPatchStateChanged for mhc-bf16 on both servers", lambda:
                          sorted((a["server"], a["patch"], a["state"])
                                 for a in prometheus.alerts("PatchsetPatchStateChanged")),
                          until=lambda got: got == drifted)
        assert firing == drifted
        assert prometheus.query('patchset_check_findings{check="tree-drift[hand-edit]", '
                                'status="fail"} == 1')
        assert prometheus.alerts("PatchsetCheckFailing")
    finally:
        on_host(host, f"git -C /opt/sglang checkout -- {path}")
    wait_for("mhc-bf16 active again, the alert resolved", lambda: prometheus.states() ==
             EXPECTED and prometheus.alerts("PatchsetPatchStateChanged") == [])
