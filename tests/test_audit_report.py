"""Reports: the JSON schema, every format from the seed's facts, secrets redacted in all
of them (evidence included), the HTML rendered by headless Chromium, CLI exit codes."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from audit_facts import synth

from auditor import api, report
from auditor.render import FORMATS, render
from patchset.cli import main

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
    assert data["schema"] == "patchset-audit-report" and data["schema_version"] == "1.3"
    assert data["summary"]["checks"] == {"pass": 30, "fail": 2, "warn": 1, "unknown": 0}
    assert data["summary"]["exit_code"] == 1
    assert [f["status"] for f in data["findings"][:3]] == ["fail", "fail", "warn"]
    broken = copy.deepcopy(data)
    broken["findings"][0]["status"] = "bad"
    del broken["hosts"][0]["states"][0]["reason"]
    assert report.validate(broken) == [
        "$.hosts[0].states[0]: missing 'reason'",
        "$.findings[0].status: 'bad' not in ['pass', 'fail', 'warn', 'unknown']"]


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
    assert suites[0].get("tests") == "33" and suites[0].get("failures") == "3"
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


def test_html_report_renders_in_chromium(seed_report, tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    html.write_text(render(report.to_dict(seed_report), "html"))
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
    dom = proc.stdout
    assert "<title>patchset audit: gpu1</title>" in dom
    assert dom.count('class="suspect"') == 6
    assert dom.count('<tr class="finding fail">') == 2
    assert '<span class="badge gated-off">gated-off</span>' in dom


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
                                 "html, json, junit\n")
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
