"""The audit as Prometheus metrics (auditor/metrics.py), the exporter's schedule and HTTP
side (auditor/exporter.py) fed fixture reports, `audit --format prometheus`, `serve`'s
option checks, and what ships in monitoring/ (rules checked and unit-tested by promtool,
every dashboard query valid PromQL over the exporter's own metric names) and systemd/."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from tests.audit_facts import synth
from prometheus_client.parser import text_string_to_metric_families

from patchset.auditor import api, exporter, metrics, report
from patchset.auditor.model import HostFacts, ProbeResult
from tests.hostutil import cli
from patchset.isolate.measure import drift
from patchset.errors import UsageError
from tests.unit.test_standin import http
from tests.system.test_audit_hosts import D, P, SEED_STATES
from tests.unit.test_audit_rank import K, ORDER, state_run

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"
RULES, RULES_TEST = MONITORING / "patchset-alerts.yml", MONITORING / "patchset-alerts.test.yml"
DASHBOARD = MONITORING / "patchset-dashboard.json"
UNIT = ROOT / "systemd" / "patchset-serve.service"
SECRET = "sk-metrics-0123456789abcdefXYZ"


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory):
    return synth.real_series(tmp_path_factory.mktemp("series"))


def seed_data(series, host: str = "gpu1", desc: dict | None = None,
              probes: list[ProbeResult] | None = None, cohorts: tuple = ()) -> dict:
    facts = synth.facts(desc or synth.load("seed.yaml"), series, host=host)
    return report.to_dict(api.evaluate(series, [facts],
                                       probes={host: probes} if probes else None,
                                       cohorts=cohorts))


def samples(text: str) -> dict[str, list[tuple[dict, float]]]:
    """name -> [(labels, value)] of every sample in the exposition text."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def probe_results() -> list[ProbeResult]:
    figures = drift.prefill_vs_decode(state_run(set(ORDER))).to_json()
    return [ProbeResult(probe="recall", name="recall", ok=False, reason="lost", expected="T",
                        answer=f"I don't know {SECRET}", latency_ms=250.0, url="gpu1 x"),
            ProbeResult(probe="drift", name="drift", ok=False, reason="above the noise",
                        expected="", latency_ms=1500.0, url="gpu1 x", drift=figures)]


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None):
    return subprocess.run(["promtool", *args], input=stdin, capture_output=True, text=True,
                          cwd=cwd, timeout=60)


# ---------------------------------------------------------------- report -> metrics

def test_seed_report_as_metrics(series) -> None:
    data = seed_data(series)
    got = samples(metrics.render(data))
    states = {(lb["server"], lb["patch"]): lb["state"] for lb, v in got["patchset_patch_state"]}
    assert states == SEED_STATES
    assert {lb["evidence"] for lb, _ in got["patchset_patch_state"]} == {"declared"}
    assert all(v == 1 for _, v in got["patchset_patch_state"])
    firing = {(lb["server"], lb["hazard"]): v for lb, v in got["patchset_hazard_firing"]}
    assert firing == {(P, "nvfp4-cutlass-no-swiglu-clamp"): 1,
                      (D, "nvfp4-cutlass-no-swiglu-clamp"): 1}
    assert {lb["status"]: v for lb, v in got["patchset_findings"]} == \
        {s: n for s, n in data["summary"]["checks"].items()}
    checks = {(lb["server"], lb["check"], lb["status"]): v
              for lb, v in got["patchset_check_findings"]}
    assert checks[(P, "hazard[nvfp4-cutlass-no-swiglu-clamp]", "fail")] == 1
    assert checks[("", "checkpoint-dtypes[narrowed]", "warn")] == 1
    assert checks[(D, "gate-env", "pass")] == 2
    assert sum(checks.values()) == len(data["findings"])
    assert {lb["server"]: v for lb, v in got["patchset_stale_process"]} == {P: 0, D: 0}
    assert got["patchset_host_up"] == [({"host": "gpu1"}, 1.0)]
    assert got["patchset_gather_duration_seconds"] == [({"host": "gpu1"}, 0.012)]
    assert got["patchset_last_success_timestamp_seconds"][0][1] == \
        metrics.epoch(data["generated"])
    assert "patchset_patch_deployed_state" not in got      # one-shot: no record of a deploy
    info = got["patchset_build_info"][0][0]
    assert info["schema_version"] == data["schema_version"] and info["upstream_version"] == \
        "0.5.14"


def test_an_unreachable_host_has_no_state_series_and_no_success_time(series) -> None:
    down = synth.facts(synth.load("seed.yaml"), series, host="gpu2")
    down.reachable, down.error = False, "gpu2: unreachable (Connection refused)"
    data = report.to_dict(api.evaluate(series, [down]))
    got = samples(metrics.render(data))
    assert got["patchset_host_up"] == [({"host": "gpu2"}, 0.0)]
    assert got["patchset_host_reachable"] == [({"host": "gpu2"}, 0.0)]
    assert "patchset_patch_state" not in got
    assert "patchset_last_success_timestamp_seconds" not in got


def test_probe_and_drift_figures(series) -> None:
    data = seed_data(series, probes=probe_results())
    figures = data["hosts"][0]["probes"][1]["drift"]
    text = metrics.render(data)
    got = samples(text)
    ok = {lb["name"]: v for lb, v in got["patchset_probe_ok"]}
    assert ok == {"recall": 0, "drift": 0}
    assert {lb["name"]: v for lb, v in got["patchset_probe_latency_seconds"]} == \
        {"recall": 0.25, "drift": 1.5}
    assert got["patchset_probe_drift_mean"] == [({"host": "gpu1", "probe": "drift",
                                                  "name": "drift"},
                                                 figures["overall"]["overall"]["mean"])]
    assert got["patchset_probe_drift_tolerance"][0][1] == figures["verdict"]["tolerance"]
    assert got["patchset_probe_drift_upper"][0][1] == figures["verdict"]["upper"]
    assert got["patchset_probe_drift_above"][0][1] == 1
    assert got["patchset_probe_drift_noise_mean"][0][1] == pytest.approx(
        figures["verdict"]["noise"])
    assert "patchset_probe_drift_mean" not in {n for n, rows in got.items()
                                               for lb, _ in rows if lb.get("name") == "recall"}
    assert SECRET not in text and "I don" not in text        # answers are no label


def test_statuses_come_from_the_report_not_from_a_list(series) -> None:
    """A status this module never heard of (waivers' `waived`) gets its series, and a
    waived hazard does not fire."""
    data = seed_data(series)
    hazard = next(f for f in data["findings"] if f["id"].startswith("hazard[")
                  and f["subject"].startswith(P))
    hazard["status"] = "accepted-by-ops"
    data["summary"]["checks"] = {**data["summary"]["checks"], "fail": 1, "muted": 0}
    got = samples(metrics.render(data))
    by_status = {lb["status"]: v for lb, v in got["patchset_findings"]}
    assert by_status["accepted-by-ops"] == 1 and by_status["muted"] == 0
    assert by_status["fail"] == 1
    firing = {lb["server"]: v for lb, v in got["patchset_hazard_firing"]}
    assert firing == {P: 0, D: 1}


def test_label_values_are_ids_only(series) -> None:
    """Subjects, messages and found values never become labels; an id with characters
    outside the safe set is cut to it (no quotes, spaces or newlines; at most 128)."""
    desc = copy.deepcopy(synth.load("seed.yaml"))
    desc["servers"][1]["argv"] += ["--api-key", SECRET]
    data = seed_data(series, desc=desc)
    data["hosts"][0]["states"][0]["patch"] = 'evil"patch\nname ' + "x" * 300
    text = metrics.render(data)
    assert SECRET not in text and "<redacted" not in text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            for value in s.labels.values():
                assert re.fullmatch(r"[A-Za-z0-9_.:@/+=\[\]-]{0,128}", value), value
    assert any(lb["patch"].startswith("evil_patch_name_x")
               for lb, _ in samples(text)["patchset_patch_state"])


def test_promtool_accepts_the_exposition(series) -> None:
    from patchset.auditor.cohorts import CohortSpec
    data = seed_data(series, probes=probe_results(), cohorts=(CohortSpec("seed", ("gpu1",)),))
    ex = exporter.Exporter(["gpu1"], lambda h: api.Gathered(HostFacts(h)), lambda g: data,
                           interval=60)
    ex.audit_once("gpu1")
    for text in (metrics.render(data), ex.metrics_text()[0].decode()):
        proc = promtool("check", "metrics", stdin=text)
        assert (proc.returncode, proc.stdout + proc.stderr) == (0, ""), text[:2000]
    assert "patchset_audit_errors_total" in ex.metrics_text()[0].decode()


def test_audit_format_prometheus_writes_the_file_whole(tmp_path: Path, capsys,
                                                       monkeypatch) -> None:
    """`patchset audit localhost --format prometheus -o FILE`: the textfile collector's
    file, written by rename (no partial file, nothing left beside it)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "textfile" / "patchset.prom"
    out.parent.mkdir()
    code, stdout, err = cli(capsys, "audit", "localhost", "--format", "prometheus", "-o",
                            str(out), "--series", str(ROOT / "patches.yaml"))
    assert code in (0, 1) and stdout == "", err
    assert "report written to" in err
    got = samples(out.read_text())
    assert got["patchset_host_up"] == [({"host": "localhost"}, 1.0)]
    assert [p.name for p in out.parent.iterdir()] == ["patchset.prom"]


# ---------------------------------------------------------------- the exporter

def fake_gathered(series, host: str, pid: int = 1000, reachable: bool = True) -> api.Gathered:
    desc = copy.deepcopy(synth.load("seed.yaml"))
    desc["servers"][0]["pid"] = pid
    desc["units"][P]["main_pid"] = pid
    facts = synth.facts(desc, series, host=host)
    if not reachable:
        facts.reachable, facts.error = False, f"{host}: unreachable (Connection refused)"
    return api.Gathered(facts)


def evaluator(series, drifted: list[bool] | None = None):
    """The exporter's `evaluate` as `patchset serve` builds it; with `drifted`, each call
    takes the next flag and shows mhc-bf16 on the prefill server as drifted."""
    def evaluate(gathered: list[api.Gathered]) -> dict:
        data = report.to_dict(api.evaluate_gathered(series, gathered))
        if drifted and drifted.pop(0):
            for h in data["hosts"]:
                for st in h["states"]:
                    if st["server"] == P and st["patch"] == "mhc-bf16":
                        st["state"] = "drifted"
        return data
    return evaluate


def test_backoff_doubles_per_failure_up_to_eight_intervals() -> None:
    assert [exporter.backoff(60, n, 480) for n in range(7)] == \
        [60, 60, 120, 240, 480, 480, 480]


def test_schedule_backs_off_an_unreachable_host_and_resets_on_success(series) -> None:
    now = [1000.0]
    answers = ["down"] * 5 + ["up"]

    def gather(host: str) -> api.Gathered:
        now[0] += 2.0                              # each audit takes 2 s
        return fake_gathered(series, host, reachable=answers.pop(0) == "up")
    ex = exporter.Exporter(["gpu1"], gather, evaluator(series), interval=60,
                           clock=lambda: now[0])
    waits = [ex.audit_once("gpu1") for _ in range(6)]
    assert waits == [58, 118, 238, 478, 478, 58]
    got = samples(ex.metrics_text()[0].decode())
    errors = {lb["reason"]: v for lb, v in got["patchset_audit_errors_total"]}
    assert errors == {"unreachable": 5, "gather": 0, "error": 0}
    assert got["patchset_audits_total"] == [({"host": "gpu1"}, 6.0)]
    assert got["patchset_audit_consecutive_failures"] == [({"host": "gpu1"}, 0.0)]
    assert got["patchset_last_success_timestamp_seconds"] == [({"host": "gpu1"}, 1012.0)]
    assert got["patchset_audit_next_timestamp_seconds"] == [({"host": "gpu1"}, 1070.0)]


def test_an_audit_that_raises_is_an_error_and_never_shows_the_secret(series) -> None:
    logged: list[str] = []

    def gather(host: str) -> api.Gathered:
        raise RuntimeError(f"boom with --api-key {SECRET}")
    ex = exporter.Exporter(["gpu1"], gather, evaluator(series), interval=60,
                           log=logged.append)
    assert ex.audit_once("gpu1") == pytest.approx(60, abs=1)
    got = samples(ex.metrics_text()[0].decode())
    assert {lb["reason"]: v for lb, v in got["patchset_audit_errors_total"]}["error"] == 1
    assert got["patchset_host_up"] == [({"host": "gpu1"}, 0.0)]
    body = ex.report_json().decode()
    assert json.loads(body)["hosts"][0]["error"].startswith("audit failed: boom")
    assert logged and all(SECRET not in line for line in logged) and SECRET not in body
    assert any("Traceback" in line for line in logged)            # a bug: its trace too


def test_deployed_state_is_the_first_audit_of_the_process(series) -> None:
    """A change under a running process keeps the record (the alert's left side differs
    from it); a new process (deploy, restart) records its states afresh."""
    gathered = [fake_gathered(series, "gpu1"), fake_gathered(series, "gpu1"),
                fake_gathered(series, "gpu1", pid=4000)]
    ex = exporter.Exporter(["gpu1"], lambda h: gathered.pop(0),
                           evaluator(series, drifted=[False, True, True]), interval=60)

    def mhc() -> tuple[str, str]:
        got = samples(ex.metrics_text()[0].decode())
        now = next(lb["state"] for lb, _ in got["patchset_patch_state"]
                   if lb["server"] == P and lb["patch"] == "mhc-bf16")
        then = next(lb["state"] for lb, _ in got["patchset_patch_deployed_state"]
                    if lb["server"] == P and lb["patch"] == "mhc-bf16")
        return now, then
    ex.audit_once("gpu1")
    assert mhc() == ("active", "active")
    ex.audit_once("gpu1")
    assert mhc() == ("drifted", "active")
    ex.audit_once("gpu1")
    assert mhc() == ("drifted", "drifted")


def test_merged_report_of_several_hosts_matches_the_schema(series) -> None:
    ex = exporter.Exporter(["gpu1", "gpu2"], lambda h: fake_gathered(series, h,
                                                                     reachable=h == "gpu1"),
                           evaluator(series), interval=60)
    ex.audit_once("gpu1")
    ex.audit_once("gpu2")
    data = json.loads(ex.report_json())
    assert report.validate(data) == []
    assert [h["host"] for h in data["hosts"]] == ["gpu1", "gpu2"]
    assert data["summary"]["unreachable"] == ["gpu2"] and data["summary"]["exit_code"] == 3
    assert data["summary"]["checks"]["fail"] == sum(f["status"] == "fail"
                                                    for f in data["findings"]) == 2
    assert [f["status"] for f in data["findings"][:3]] == ["fail", "fail", "warn"]


def test_nothing_is_published_until_every_host_has_had_its_first_audit(series) -> None:
    """A report of gpu1 alone would be a different audit (pd-consistency over half the
    servers, gpu2's waivers unused): until gpu2's first audit ends, /report.json is 503
    naming it and /metrics has the exporter's own series and gpu1's last success, never a
    patch state."""
    ex = exporter.Exporter(["gpu1", "gpu2"], lambda h: fake_gathered(series, h),
                           evaluator(series), interval=60)
    address, port = ex.serve("127.0.0.1", 0)
    base = exporter.base_url(address, port)
    try:
        ex.audit_once("gpu1")
        code, body = get(base + "/report.json")
        assert code == 503 and json.loads(body)["pending"] == ["gpu2"]
        got = samples(ex.metrics_text()[0].decode())
        assert "patchset_patch_state" not in got and got["patchset_audits_total"]
        # PatchsetNoSuccessfulAudit is to name gpu2 alone, should its first audit hang
        assert [lb["host"] for lb, _ in got["patchset_last_success_timestamp_seconds"]] \
            == ["gpu1"]
        ex.audit_once("gpu2")
        code, body = get(base + "/report.json")
        assert code == 200 and [h["host"] for h in json.loads(body)["hosts"]] == \
            ["gpu1", "gpu2"]
        states = samples(ex.metrics_text()[0].decode())["patchset_patch_state"]
        assert {lb["host"] for lb, _ in states} == {"gpu1", "gpu2"}
    finally:
        ex.stop()


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    return http("GET", url, timeout=timeout)


def test_a_scrape_never_waits_for_an_audit_and_hosts_run_in_parallel(series) -> None:
    """Two hosts audited at once (a barrier only both can pass), never two audits of one
    host at once, and /metrics, /healthz answer while both audits hang."""
    release = threading.Event()
    both = threading.Barrier(2, timeout=10)
    inside = threading.Semaphore(0)
    running: dict[str, int] = {"gpu1": 0, "gpu2": 0}
    overlap: list[str] = []
    lock = threading.Lock()

    def gather(host: str) -> api.Gathered:
        with lock:
            running[host] += 1
            if running[host] > 1:
                overlap.append(host)
        try:
            both.wait()
            inside.release()
            release.wait(20)
            return fake_gathered(series, host)
        finally:
            with lock:
                running[host] -= 1
    ex = exporter.Exporter(["gpu1", "gpu2"], gather, evaluator(series), interval=0.5)
    address, port = ex.serve("127.0.0.1", 0)
    base = f"http://{address}:{port}"
    ex.start()
    try:
        assert inside.acquire(timeout=10) and inside.acquire(timeout=10)   # both in flight
        started = time.monotonic()
        with urllib.request.urlopen(base + "/metrics", timeout=2) as resp:
            code, body, ctype = resp.status, resp.read(), resp.headers["Content-Type"]
        assert time.monotonic() - started < 1.0
        assert code == 200 and ctype.startswith("text/plain")
        assert {lb["host"]: v for lb, v in samples(body.decode())["patchset_audit_in_progress"]} \
            == {"gpu1": 1, "gpu2": 1}
        assert get(base + "/report.json")[0] == 503              # no audit finished yet
        code, body = get(base + "/healthz")
        assert code == 200 and json.loads(body)["status"] == "ok"
        release.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and get(base + "/report.json")[0] != 200:
            time.sleep(0.05)
        data = json.loads(get(base + "/report.json")[1])
        assert sorted(h["host"] for h in data["hosts"]) == ["gpu1", "gpu2"]
        accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        req = urllib.request.Request(base + "/metrics", headers={"Accept": accept})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            assert resp.read().decode().rstrip().endswith("# EOF")
        assert get(base + "/nothing")[0] == 404
    finally:
        release.set()
        ex.stop()
    assert overlap == []
    assert ex.health()[0] == 503                                  # stopped


# ---------------------------------------------------------------- serve's options

def test_serve_refuses_a_public_address_without_the_flag_and_bad_intervals(capsys) -> None:
    code, out, err = cli(capsys, "serve", "gpu1", "--listen", "0.0.0.0:9808")
    assert (code, out) == (2, "") and "not a loopback address" in err and "--public" in err
    code, _, err = cli(capsys, "serve", "gpu1", "--interval", "0s")
    assert code == 2 and "--interval '0s'" in err
    assert exporter.parse_listen("0.0.0.0:9808", public=True) == ("0.0.0.0", 9808)
    assert exporter.parse_listen("[::1]:9808") == ("::1", 9808)
    assert exporter.base_url("::1", 9808) == "http://[::1]:9808"
    assert exporter.base_url("127.0.0.1", 9808) == "http://127.0.0.1:9808"
    assert exporter.parse_listen("localhost:1") == ("localhost", 1)
    assert [exporter.parse_duration(t) for t in ("90", "30s", "5m", "1h", "500ms")] == \
        [90, 30, 300, 3600, 0.5]
    for bad in ("9808", "host:9808", "127.0.0.1:0", "127.0.0.1:99999"):
        with pytest.raises(Exception, match="--listen"):
            exporter.parse_listen(bad)


@pytest.mark.parametrize("bad", ["\uff15m", "\u0665m", "1\u0660s", "0", "-5m", "nan", "inf",
                                 "1e309", "5 m", "5M", ".5m", "8d"])
def test_an_interval_is_ascii_digits_and_a_unit_within_bounds(bad: str) -> None:
    """`\\d` and float() read fullwidth and Arabic-Indic digits (`\uff15m` was 5 minutes)."""
    with pytest.raises(UsageError, match=re.escape(f"--interval {bad!r}: use a duration")):
        exporter.parse_duration(bad)


@pytest.mark.parametrize("bad", ["127.0.0.1:\u0669\u0668\u0660\u0668", "[::1]:\uff11",
                                 "localhost:0", "host:99999", "127.0.0.1:", ":9808"])
def test_a_listen_port_is_ascii_digits(bad: str) -> None:
    with pytest.raises(UsageError, match=re.escape(f"--listen {bad!r}")):
        exporter.parse_listen(bad, public=True)


# ---------------------------------------------------------------- monitoring/ and systemd/

def test_alert_rules_pass_promtool_check_and_their_unit_tests() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0 and "SUCCESS: 7 rules found" in proc.stdout, proc.stderr
    proc = promtool("test", "rules", RULES_TEST.name, cwd=MONITORING)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
    tested = {t["alertname"] for case in yaml.safe_load(RULES_TEST.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
                      for r in g["rules"]}


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def exported_names(series) -> set[str]:
    from patchset.auditor.cohorts import CohortSpec
    data = seed_data(series, probes=probe_results(), cohorts=(CohortSpec("seed", ("gpu1",)),))
    ex = exporter.Exporter(["gpu1"], lambda h: api.Gathered(HostFacts(h)), lambda g: data,
                           interval=60)
    ex.audit_once("gpu1")
    return set(samples(ex.metrics_text()[0].decode()))


def test_dashboard_queries_are_promql_over_the_exporters_metrics(series, tmp_path) -> None:
    """Every panel's expr, with Grafana's variables as the integration test sets them,
    parses as PromQL (promtool checks it as a recording rule) and names only metrics the
    exporter serves; the rules do too."""
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:panel{i}", "expr": promql(e)} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = exported_names(series)
    rule_exprs = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"]
                  for r in g["rules"]]
    used = {n for e in exprs + rule_exprs for n in re.findall(r"\bpatchset_[a-z_]+", e)}
    assert used and used <= names, used - names


def promql(expr: str) -> str:
    """A panel's expr as Prometheus runs it: Grafana's variables substituted."""
    return expr.replace("$__rate_interval", "1m").replace("$host", ".+")


def test_the_serve_unit_binds_loopback_and_holds_no_secret() -> None:
    text = UNIT.read_text()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert " serve " in exec_start and "--listen 127.0.0.1:9808" in exec_start
    assert "--public" not in exec_start
    assert not re.search(r"(?i)(api[_-]?key|token|secret|password)\s*=", text)
    for key in ("NoNewPrivileges=yes", "ProtectSystem=strict", "Restart=on-failure"):
        assert key in text


def test_the_serve_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """As deploy checks its units: any output is a failure (the interpreter stands in for
    the installed /usr/local/bin/patchset, which verify wants to exist)."""
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/patchset", sys.executable))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")
