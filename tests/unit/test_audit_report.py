"""Reports: the JSON schema, every format from the seed's facts, secrets redacted in all
of them (evidence included), the HTML rendered by headless Chromium, CLI exit codes."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tests.audit_facts import synth

from patchset.auditor import api, measured, report
from patchset.auditor.model import ProbeResult
from patchset.auditor.rank import Access
from patchset.auditor.render import FORMATS, chart, render
from patchset.isolate.measure import drift, driftview
from patchset.cli import main
from tests.unit.test_audit_rank import ENDPOINT, K, ORDER, PROMPTS, bisect_file, state_run

SECRET, TOKEN, PASSWORD = "sk-live-0123456789abcdefXYZ", "hf_AbCdEfGhIjKlMnOpQrStUv", "hunter2pw!"


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory):
    return synth.real_series(tmp_path_factory.mktemp("series"))


def seed_with_secrets() -> dict:
    desc = copy.deepcopy(synth.load("seed.yaml"))
    dec = desc["servers"][1]
    dec["argv"] += ["--api-key", SECRET, f"--ssl-keyfile-password={PASSWORD}"]
    dec["env"].update({"HF_TOKEN": TOKEN, "MY_SERVICE_PASSWORD": PASSWORD})
    dec["server_info"] = dict(dec["server_info"], api_key=SECRET, ssl_keyfile_password=PASSWORD)
    desc["units"][dec["unit"]]["env_files"]["/etc/sglang/decode.env"].update(
        {"mode": "0644"})
    desc["units"][dec["unit"]]["env_files"]["/etc/sglang/decode.env"]["values"].update(
        {"HF_TOKEN": TOKEN})
    return desc


@pytest.fixture(scope="module")
def seed_report(series):
    return api.evaluate(series, [synth.facts(synth.load("seed.yaml"), series)], "context-loss")


def test_json_report_matches_its_schema(seed_report) -> None:
    data = report.to_dict(seed_report)
    assert report.validate(data) == []
    assert data["schema"] == "patchset-audit-report" and data["schema_version"] == "1.7"
    # + resolved-args: 10 passes, 2 notes (attention_backend unset -> dsv4, severity info)
    assert data["summary"]["checks"] == {"pass": 40, "fail": 2, "warn": 3, "unknown": 0}
    assert data["summary"]["exit_code"] == 1
    assert [f["status"] for f in data["findings"][:3]] == ["fail", "fail", "warn"]
    broken = copy.deepcopy(data)
    broken["findings"][0]["status"] = "bad"
    del broken["hosts"][0]["states"][0]["reason"]
    assert report.validate(broken) == [
        "$.hosts[0].states[0]: missing 'reason'",
        "$.findings[0].status: 'bad' not in ['pass', 'fail', 'warn', 'unknown', 'waived']"]


def test_every_finding_has_the_record_fields(seed_report) -> None:
    for f in report.to_dict(seed_report)["findings"]:
        assert set(f) >= {"id", "host", "subject", "expected", "found", "status", "severity",
                          "evidence"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_secrets_never_shown_in_any_format(series, fmt: str) -> None:
    rep = api.evaluate(series, [synth.facts(seed_with_secrets(), series)], "context-loss")
    text = render(report.to_dict(rep), fmt)
    for secret in (SECRET, TOKEN, PASSWORD, "hunter2"):
        assert secret not in text
    if fmt == "json":                      # where every value is shown in full
        assert '"--api-key", "<redacted>"' in text.replace("\n", "").replace("  ", "") \
            or '"<redacted>"' in text


def test_secret_findings_say_where_secrets_live(series) -> None:
    rep = api.evaluate(series, [synth.facts(seed_with_secrets(), series)])
    found = {(f.id, f.status) for f in rep.findings if f.id.startswith("secrets")}
    assert ("secrets[cmdline]", "warn") in found
    assert ("secrets[server-info]", "warn") in found
    assert ("secrets[env-file]", "fail") in found
    data = report.to_dict(rep)
    leaked = next(f for f in data["findings"] if f["id"] == "secrets[server-info]")
    assert leaked["found"] == "api_key, ssl_keyfile_password"


def test_junit_has_one_suite_per_host(series, seed_report) -> None:
    down = synth.facts(synth.load("seed.yaml"), series, host="gpu2")
    down.reachable, down.error = False, "gpu2: unreachable (Connection refused)"
    rep = api.evaluate(series, [synth.facts(synth.load("seed.yaml"), series), down])
    root = ET.fromstring(render(report.to_dict(rep), "junit"))
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["gpu1", "gpu2"]
    assert suites[0].get("tests") == "45" and suites[0].get("failures") == "3"
    assert suites[1].find("testcase/error").get("message") == \
        "gpu2: unreachable (Connection refused)"
    assert api.exit_code(rep) == 3


def test_markdown_report(seed_report) -> None:
    md = render(report.to_dict(seed_report), "md")
    assert "## Suspects for: multi-turn context loss / long-prefill quality" in md
    assert "| 1 | **mhc-bf16** | patch | 1.5 |" in md
    assert "| triton-dsa-indexer | gated-off | active |" in md
    assert "   patchset revert mhc-bf16 --host gpu1 && systemctl restart " in md


def chromium() -> str:
    path = shutil.which("chromium")
    assert path, "chromium not installed (.ci/install-host-deps installs it)"
    return path


def dump_dom(text: str, tmp_path: Path) -> str:
    """The DOM headless Chromium builds from the page (offline: nothing to fetch)."""
    html = tmp_path / "report.html"
    html.write_text(text)
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        proc = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--dump-dom", html.as_uri()],
            capture_output=True, text=True, timeout=120, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_html_report_renders_in_chromium(seed_report, tmp_path: Path) -> None:
    dom = dump_dom(render(report.to_dict(seed_report), "html"), tmp_path)
    assert "<title>patchset audit: gpu1</title>" in dom
    assert dom.count('class="suspect"') == 6
    assert dom.count('<tr class="finding fail">') == 2
    assert '<span class="badge gated-off">gated-off</span>' in dom


def test_drift_charts_render_in_chromium_with_their_points(series, tmp_path: Path) -> None:
    """A probe[drift] finding (figures computed from logprob series) and a --measured
    bisect: the report's charts are inline SVG, every binned point a circle, no script."""
    figures = drift.prefill_vs_decode(state_run(set(ORDER)))
    result = ProbeResult(probe="drift", name="drift", ok=figures.verdict.above is False,
                         reason=figures.verdict.why, url=ENDPOINT,
                         expected="prefill and decode within the noise",
                         drift=figures.to_json(points=True))
    path = bisect_file(tmp_path / "bisect.json")
    runs = measured.load_all([path], ["gpu1"], series, "decode-quality")
    rep = api.evaluate(series, [synth.facts(synth.load("seed.yaml"), series)],
                       "decode-quality", Access(measured=runs), probes={"gpu1": [result]})
    data = report.to_dict(rep)
    assert report.validate(data) == []
    assert any(f["id"] == "probe[drift]" and f["status"] == "fail" for f in data["findings"])
    dom = dump_dom(render(data, "html"), tmp_path)
    assert "<script" not in dom.lower()
    charts = re.findall(r"<svg\b.*?</svg>", dom, re.S)
    by_position = [c for c in charts if 'class="drift-chart"' in c]
    titles = [re.search(r'aria-label="([^"]*)"', c).group(1) for c in by_position]
    sequences = [s.name for s in figures.per_sequence]
    assert titles == [f"overall at {ENDPOINT}: drift by position"] + sequences
    for svg, comparison in zip(by_position, [figures.overall] + [
            s.comparison for s in figures.per_sequence]):
        binned = chart._binned(comparison.points)
        circles = re.findall(r'<circle class="point"[^>]*data-position="(\d+)"[^>]*'
                             r'data-drift="([^"]+)"', svg)
        assert [int(p) for p, _ in circles] == [p for p, _ in binned]
        assert [float(v) for _, v in circles] == pytest.approx([v for _, v in binned],
                                                               rel=1e-5)
        assert 'class="noise"' in svg                    # the threshold, dashed
    # --measured: one bar per suspect's contribution, one per test state's A/B drift
    bars = [c for c in charts if 'class="bar-chart"' in c]
    saved = json.loads(path.read_text())
    assert len(bars) == 2
    labels = re.findall(r'<rect class="bar"[^>]*data-label="([^"]+)"', bars[0])
    assert labels == [c["suspect"] for c in saved["contributions"]]
    steps = [s for s in saved["steps"] if s["action"] == "group"]
    assert len(re.findall(r'<rect class="bar"', bars[1])) == len(steps)
    assert 'class="measured"' in dom and "above the noise" in dom


def test_one_chart_implementation_for_the_probe_and_the_audit() -> None:
    assert driftview.svg is chart.svg
    page = driftview.html(drift.DriftOutcome(drift.prefill_vs_decode(state_run(set(ORDER))),
                                             None))
    assert page.count("<svg") == 1 + len(PROMPTS) and "<script" not in page   # overall + each


def test_a_drift_record_without_points_charts_its_position_buckets() -> None:
    from patchset.auditor.render import view
    figures = drift.prefill_vs_decode(state_run(set(ORDER))).to_json()    # no points
    charts = view.drift_charts({"probes": [{"probe": "drift", "url": ENDPOINT,
                                            "drift": figures}]})
    assert len(charts) == 1 + len(figures["sequences"])
    overall = charts[0]["svg"]
    assert 'class="bar-chart"' in overall and 'class="point"' not in overall
    assert re.findall(r'data-label="([^"]+)"', overall) == list(figures["overall"]["buckets"])


def test_markdown_lists_the_measured_contributions(series, tmp_path: Path) -> None:
    path = bisect_file(tmp_path / "bisect.json")
    rep = api.evaluate(series, [synth.facts(synth.load("seed.yaml"), series)],
                       "decode-quality", dataclasses.replace(
                           Access(), measured=measured.load_all([path], ["gpu1"], series,
                                                                "decode-quality")))
    md = render(report.to_dict(rep), "md")
    assert f"### Measured on gpu1 (bisect b-gpu1, `{path}`)" in md
    assert "| mhc-bf16 | - | [0, " in md and "| cleared-group |" in md


# ---------------------------------------------------------------- the CLI

@pytest.fixture()
def cli_env(series, tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("PATCHSET_HOME", str(home))
    monkeypatch.setenv("PATCHSET_INVENTORY", str(tmp_path / "none.yaml"))
    monkeypatch.chdir(Path(series.root))
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_on_localhost_and_exit_codes(cli_env: Path, capsys) -> None:
    code, out, _ = run(capsys, "audit", "localhost", "--format", "json")
    data = json.loads(out)
    assert report.validate(data) == []
    assert code == 1 and data["summary"]["exit_code"] == 1        # no tree: unknown
    tree = data["hosts"][0]["facts"]["tree"]
    assert not tree["known"] and "does not exist" in tree["reason"]
    assert tree["provenance"]["command"].startswith("patchset-engine status ")


def test_cli_output_file_and_bad_input(cli_env: Path, capsys) -> None:
    out_file = cli_env / "r.xml"
    code, out, err = run(capsys, "audit", "localhost", "--format", "junit", "-o", str(out_file))
    assert code == 1 and out == ""
    assert ET.parse(out_file).getroot().tag == "testsuites"
    assert f"report written to {out_file}" in err
    code, _, err = run(capsys, "audit", "localhost", "--format", "xml")
    assert code == 2 and err == ("patchset: error: --format 'xml': use one of terminal, md, "
                                 "html, json, junit, prometheus\n")
    code, _, err = run(capsys, "audit", "localhost", "--symptom", "vibes")
    assert code == 2 and "unknown symptom 'vibes'" in err


def test_cli_unreachable_host_exits_3(cli_env: Path, capsys, monkeypatch) -> None:
    known = cli_env / "known_hosts"
    known.write_text("")
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(known))
    cfg = cli_env / "ssh_config"
    cfg.write_text("")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(cfg))
    code, out, _ = run(capsys, "audit", "root@127.0.0.1:1", "--format", "json")
    data = json.loads(out)
    assert code == 3
    assert data["summary"]["unreachable"] == ["root@127.0.0.1:1"]
    assert data["hosts"][0]["error"].startswith("root@127.0.0.1:1: unreachable")


def test_a_measured_cell_says_bounded_only_for_a_bound() -> None:
    """A contribution not above the noise reads as what the search found: only a
    `cleared-group` rests on a bound below the tolerance; `undecided` never reads cleared."""
    from patchset.auditor.render.view import measured_cell

    def cell(how: str, value) -> str:
        return measured_cell({"measured": [{"host": "gpu1", "value": value, "low": 0.0,
                                            "high": 1e-3, "above": False, "how": how}]})
    assert "bounded below the tolerance" in cell("cleared-group", None)
    assert "undecided" in cell("undecided", None) and "bounded" not in cell("undecided", None)
    assert "not needed" in cell("not-needed", None)
