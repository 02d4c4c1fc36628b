"""Requested vs resolved (`resolved-args`): the command line's flags against what the server
runs, from /server_info, its internal_states, then the startup `server_args=` line of its
unit's journal (redacted on the host).

Unit tests run the check on the seed deployment with fixture facts (the gatherer's raw
records, through the real parsers); tests/system/test_resolved_args_hosts.py runs it on a
real nspawn host whose stand-in servers resolve their backends as a real GPU would
(STANDIN_RESOLVED_ARGS) or only log them (STANDIN_LOGGED_ARGS).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import xml.etree.ElementTree as ET
from tests.audit_facts import synth

from patchset.auditor import api, hostfacts, policy, report
from patchset.agent.lib import wire
from patchset.auditor.render import render
from patchset.auditor.resolved import ANY
from patchset.agent.lib.facts import FactValue, get
from patchset.agent.lib.facts.journal import ServerArgsLog, parse_server_args
from patchset.agent.lib.redact import Redactor
from patchset.agent.runner import Runner
from tests.hostutil import free_port
from tests.system.test_audit_hosts import D, P
from tests.unit.test_standin import MODEL, http, wait_status
from tests.unit.test_standin import launch, tree, venv_python  # noqa: F401 - the fixtures used here

SECRET = "sk-resolved-args-0123456789abcdef"
FLAG = "resolved-args[moe_runner_backend]"
MD_FLAG = "resolved-args\\[moe_runner_backend\\]"   # as Markdown shows it


def line(**fields) -> str:
    """A startup line as SGLang 0.5.14 logs it (entrypoints/engine.py:784)."""
    return ("[2026-11-28 11:00:02] server_args=ServerArgs(" +
            ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")")


def journal(text: str | None, unit: str = D, pid: int = 2000) -> dict:
    """The gatherer's raw record of the journal read (no line found: exit 1, no output)."""
    cmd = ServerArgsLog().command(unit=unit, pid=pid).render()
    return {"kind": "run", "command": cmd, "duration_ms": 3.0, "exit_code": 0 if text else 1,
            "stdout": (text + "\n") if text else "", "stderr": "", "error": None}


def facts(series, desc: dict, logs: dict[str, dict] | None = None):
    result = synth.gather_result(desc, series)
    for spec, rec in zip(desc["servers"], result["raw"]["servers"]):
        if logs and spec["unit"] in logs:
            rec["server_args_log"] = logs[spec["unit"]]
    return hostfacts.build("gpu1", wire.decode_result("audit", result))


def findings(series, desc: dict, logs: dict | None = None, symptom: str | None = None):
    rep = api.evaluate(series, [facts(series, desc, logs)], symptom)
    return rep, {(f.id, f.subject.split()[0]): f for f in rep.findings
                 if f.id.startswith("resolved-args")}


def config_file(*keys: str) -> dict:
    """The gatherer's record of a --config file: its key names only, and its mode."""
    return {"kind": "read", "command": "read /etc/sglang/prefill.secrets.yaml",
            "duration_ms": 1.0, "exit_code": 0, "stdout": "\n".join(keys), "stderr": "",
            "error": None, "stat": {"mode": "0600", "uid": 0, "gid": 0, "mtime": 0.0,
                                    "size": 10}}


def with_config(series, desc: dict, *keys: str):
    server(desc, P)["argv"] += ["--config", "/etc/sglang/prefill.secrets.yaml"]
    result = synth.gather_result(desc, series)
    result["raw"]["servers"][0]["config_file"] = config_file(*keys)      # servers[0]: P
    return {(f.id, f.subject.split()[0]): f for f in api.evaluate(
        series, [hostfacts.build("gpu1", wire.decode_result("audit", result))]).findings}


def server(desc: dict, unit: str) -> dict:
    return next(s for s in desc["servers"] if s["unit"] == unit)


def set_flag(desc: dict, unit: str, flag: str, value: str | None) -> None:
    argv = server(desc, unit)["argv"]
    if flag in argv:
        del argv[argv.index(flag):argv.index(flag) + 2]
    if value is not None:
        argv += [flag, value]


def set_info(desc: dict, unit: str, **fields) -> None:
    s = server(desc, unit)
    s["server_info"] = dict(s["server_info"], **fields)


# ---------------------------------------------------------------- the check, on fixture facts

def test_auto_resolved_is_a_note_with_both_values_and_the_source_line(series, seed) -> None:
    set_flag(seed, D, "--moe-runner-backend", None)            # unset: auto
    set_info(seed, D, moe_runner_backend="marlin")
    rep, found = findings(series, seed)
    f = found[(FLAG, D)]
    assert (f.status, f.severity) == ("warn", "info")          # a note: never counted
    assert (f.expected, f.found) == ("auto", "marlin (/server_info)")
    assert f.message == (
        "not on the command line (default auto, server_args.py:1617-1623); resolved at "
        "startup to marlin: sglang server_args.py:3787-3792: DeepSeek-V4 on sm_120")
    assert {e.what for e in f.evidence} >= {"requested", "server_info moe_runner_backend",
                                            "checkpoint.model_type eq deepseek_v4",
                                            "gpu.compute_cap in [12.0, 12.1]"}
    assert found[(FLAG, P)].status == "pass"                   # triton asked, triton runs
    rep.hosts[0].findings = [f]                                # a note alone: exit code 0
    assert api.exit_code(rep) == 0


def test_explicit_backend_overridden_warns_with_both_values(series, seed) -> None:
    set_info(seed, P, moe_runner_backend="marlin")             # --moe-runner-backend triton
    set_flag(seed, D, "--attention-backend", "flashinfer")     # DeepSeek-V4 forces dsv4
    _, found = findings(series, seed)
    f = found[(FLAG, P)]
    assert (f.status, f.severity) == ("warn", "medium")
    assert (f.expected, f.found) == ("triton", "marlin (/server_info)")
    assert f.message.startswith(
        "--moe-runner-backend triton on the command line, but the server runs marlin: no "
        "rewrite of the pinned sglang that resolved_args.yaml lists explains it. The unit "
        "asks for what it does not get")
    a = found[("resolved-args[attention_backend]", D)]
    assert (a.status, a.severity, a.expected, a.found) == ("warn", "medium", "flashinfer",
                                                           "dsv4 (/server_info)")
    assert "sglang arg_groups/deepseek_v4_hook.py:16: DeepSeek-V4 always runs its own dsv4 " \
        "attention backend" in a.message


def test_auto_in_server_info_is_corroborated_by_the_journal_line(series, seed) -> None:
    set_flag(seed, D, "--moe-runner-backend", None)
    set_info(seed, D, moe_runner_backend="auto")
    logs = {D: journal(line(model_path="/models/x", moe_runner_backend="marlin",
                            api_key=SECRET, page_size=256))}
    rep, found = findings(series, seed, logs)
    f = found[(FLAG, D)]
    assert (f.status, f.severity, f.expected) == ("warn", "info", "auto")
    assert f.found == "marlin (the server_args= line it logged at startup (journal))"
    assert "server_args.py:3787-3792" in f.message
    log = rep.hosts[0].facts.server(D).server_args_log
    assert log.source == f"journal of {D}, pid 2000: its startup server_args= line"
    assert log.value["args"]["api_key"] == "<redacted>"        # redacted by name, too
    assert SECRET not in json.dumps(report.to_dict(rep))


@pytest.mark.parametrize("log,why", [
    (journal(line(moe_runner_backend="auto")), "its startup server_args= line says auto"),
    (journal(None), "found no server_args= line in this boot's journal"),
])
def test_auto_nowhere_resolved_is_unknown_with_why(series, seed, log, why) -> None:
    set_flag(seed, D, "--moe-runner-backend", None)
    set_info(seed, D, moe_runner_backend="auto")
    _, found = findings(series, seed, {D: log})
    f = found[(FLAG, D)]
    assert (f.status, f.severity, f.found) == ("unknown", "info", "unknown")
    assert "/server_info says auto" in f.message and why in f.message
    assert f.message.endswith("decided by the quantization method when the MoE layers are "
                              "built (e.g. layers/quantization/modelopt_quant.py:2317, "
                              "fp8.py:897) and never reported")


def test_explicit_flag_of_a_server_that_shows_nothing_is_unverified(series, seed) -> None:
    server(seed, P)["server_info"] = None                      # not answering
    rep, found = findings(series, seed)                        # no journal: not gathered
    f = found[(FLAG, P)]
    assert (f.status, f.severity, f.expected) == ("unknown", "low", "triton")
    assert "/server_info unavailable" in f.message and "Connection refused" in f.message
    assert api.exit_code(rep) == 1
    down = facts(series, seed)
    down.servers[0].server_args_log = ServerArgsLog().collect(journal(
        line(moe_runner_backend="triton")))                    # the journal still tells
    f = next(x for x in api.evaluate(series, [down]).findings
             if x.id == FLAG and x.subject.startswith(P))
    assert (f.status, f.found) == ("pass", "triton (the server_args= line it logged at "
                                           "startup (journal))")


def test_scheduler_value_alias_and_config_file(series, seed) -> None:
    seed["checkpoints"]["/models/DeepSeek-V4-Flash-NVFP4"]["config"]["model_type"] = "other"
    seed["checkpoints"]["/models/DeepSeek-V4-Flash-NVFP4"]["config"]["quantization_config"][
        "kv_cache_quant_algo"] = "FP8"
    set_info(seed, D, kv_cache_dtype="auto", internal_states=[{"kv_cache_dtype": "fp8_e4m3"}])
    set_flag(seed, D, "--attention-backend", "compressed")
    found = with_config(series, copy.deepcopy(seed), "api-key", "moe-runner-backend")
    kv = found[("resolved-args[kv_cache_dtype]", D)]
    assert (kv.status, kv.found) == ("pass", "fp8_e4m3 (/server_info internal_states (the "
                                             "scheduler's own value))")
    assert "sglang model_executor/model_runner.py:2337-2353" in kv.message
    alias = found[("resolved-args[attention_backend]", D)]
    assert alias.status == "pass" and alias.message.startswith(
        "--attention-backend compressed on the command line (an alias of dsv4); runs it")
    # --moe-runner-backend triton on the command line wins over the file (as SGLang merges)
    assert found[(FLAG, P)].status == "pass"
    set_flag(seed, P, "--moe-runner-backend", None)            # in the file only
    f = with_config(series, seed, "api-key", "moe-runner-backend")[(FLAG, P)]
    assert (f.status, f.severity, f.found) == ("unknown", "info", "triton (/server_info)")
    assert f.message.startswith("set in the --config file (the audit reads its key names "
                                "only): runs triton")


def test_an_unreadable_command_line_is_not_taken_for_the_defaults(series, seed) -> None:
    host = facts(series, seed)
    host.servers[0].main.cmdline = FactValue.unknown("EACCES: Permission denied")
    f = next(x for x in api.evaluate(series, [host]).findings
             if x.id == FLAG and x.subject.startswith(P))
    assert (f.status, f.severity, f.expected, f.found) == ("unknown", "info", "unknown",
                                                           "triton (/server_info)")
    assert f.message == "the command line could not be read (EACCES: Permission denied): " \
                        "runs triton"


def test_an_override_ranks_for_throughput_and_a_note_does_not(series, seed) -> None:
    notes_only = copy.deepcopy(seed)
    rep, _ = findings(series, notes_only, symptom="throughput")
    assert not [s for s in rep.symptom.suspects if s.name.startswith("resolved-args")]
    set_info(seed, P, moe_runner_backend="marlin")
    rep, _ = findings(series, seed, symptom="throughput")
    [suspect] = [s for s in rep.symptom.suspects if s.name == "resolved-args on gpu1"]
    assert suspect.score == 0.2 and suspect.reasons[0].startswith(
        f"{P} moe_runner_backend: --moe-runner-backend triton on the command line, but")
    assert [st.command for st in suspect.steps] == ["patchset deploy gpu1 --dry-run"]


def test_the_finding_is_in_every_format(series, seed) -> None:
    set_info(seed, P, moe_runner_backend="marlin")
    data = report.to_dict(api.evaluate(series, [facts(series, seed)]))
    assert report.validate(data) == []
    for fmt in ("terminal", "md", "html"):
        text = render(data, fmt, width=300)
        assert (MD_FLAG if fmt == "md" else FLAG) in text, fmt
        assert "marlin (/server_info)" in text, fmt
    suite = ET.fromstring(render(data, "junit")).find("testsuite")
    case = next(c for c in suite.findall("testcase") if c.get("classname") == FLAG and
                c.get("name") == f"{P} moe_runner_backend")
    assert case.find("failure").get("type") == "warning"
    assert "expected triton, found marlin (/server_info)" in case.find("failure").text


# ---------------------------------------------------------------- policy data

def test_policy_lists_the_flags_with_their_source_lines() -> None:
    flags = {f.name: f for f in policy.load().resolved_args}
    assert set(flags) == {"moe_runner_backend", "attention_backend", "page_size",
                          "kv_cache_dtype", "max_running_requests", "swa_full_tokens_ratio"}
    sm120 = next(r for r in flags["moe_runner_backend"].rewrites if r.to == "marlin")
    assert (sm120.sources, sm120.at) == (("auto",), "server_args.py:3787-3792")
    assert [q.fact for q in sm120.when] == ["checkpoint.model_type", "gpu.compute_cap"]
    assert flags["attention_backend"].rewrites[0].sources is None      # any: forced dsv4
    assert flags["attention_backend"].rewrites[1].to == ANY
    assert flags["attention_backend"].aliases == {"compressed": "dsv4"}


def test_a_bad_policy_file_is_one_line_naming_file_and_field(tmp_path: Path) -> None:
    data = Path(policy.__file__).parent / "data"
    for name in ("hazards.yaml", "tensors.yaml", "symptoms.yaml", "resolved_args.yaml"):
        shutil.copyfile(data / name, tmp_path / name)
    text = (tmp_path / "resolved_args.yaml").read_text()
    (tmp_path / "resolved_args.yaml").write_text(
        text.replace("overridden: {status: warn, severity: medium}",
                     "overridden: {status: loud, severity: medium}", 1))
    with pytest.raises(policy.AuditDataError, match=r"resolved_args\.yaml: report\."
                                                    r"overridden: needs status"):
        policy.load(str(tmp_path))
    (tmp_path / "resolved_args.yaml").write_text(
        text.replace("fact: gpu.compute_cap", "fact: gpu.no_such_fact", 1))
    with pytest.raises(policy.AuditDataError, match=r"flags\.moe_runner_backend\.rewrites"
                                                    r"\[1\]\.when\[1\]\.fact: no such fact"):
        policy.load(str(tmp_path / "."))
    (tmp_path / "resolved_args.yaml").unlink()       # a directory without one: the shipped
    assert len(policy.load(str(tmp_path / "./.")).resolved_args) == 6


# ---------------------------------------------------------------- the journal line

def test_the_parser_reads_literals_and_never_evaluates(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    parsed = parse_server_args(line(a=1) [:-1] + f", b=__import__('os').system('touch "
                               f"{marker}'), c=inf, d=(1, 'x'), e=-3.5, f={{1}}, g=b'x')")
    assert parsed == {"args": {"a": 1, "c": "inf", "d": [1, "x"], "e": -3.5},
                      "unparsed": ["b", "f", "g"], "truncated": False}     # JSON-able only
    assert parse_server_args("server_args=ServerArgs(h=1e999)")["unparsed"] == ["h"]
    assert not marker.exists()


def test_the_journal_line_is_redacted_on_the_host(tmp_path: Path, monkeypatch) -> None:
    """The runner (on the host) redacts journalctl's output before anything is returned:
    a fake journalctl prints the line with an API key and an HF token in it."""
    fake = tmp_path / "bin" / "journalctl"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n" + line(
        moe_runner_backend="marlin", api_key=SECRET, admin_api_key=None,
        model_loader_extra_config='{"hf_token": "hf_ResolvedArgsToken0123456789"}') +
        "\nEOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    fact = get("journal.ServerArgsLog")
    raw = Runner(Redactor(tagged=True)).run(fact.command(unit=D, pid=2000))
    assert raw["exit_code"] == 0 and "server_args=ServerArgs(" in raw["stdout"]
    assert SECRET not in raw["stdout"] and "hf_ResolvedArgsToken" not in raw["stdout"]
    value = fact.collect(raw).value
    assert value["args"]["api_key"].startswith("<redacted:")
    assert value["args"]["admin_api_key"] is None and value["args"]["moe_runner_backend"] == \
        "marlin"
    assert "hf_ResolvedArgsToken" not in value["args"]["model_loader_extra_config"]


# ---------------------------------------------------------------- the stand-in's knobs

def test_the_standin_resolves_or_only_logs_args_as_told(launch, venv_python) -> None:
    port = free_port()
    run = launch("sglang.launch_server", "--model-path", MODEL, "--port", str(port), env={
        "STANDIN_RESOLVED_ARGS": "moe_runner_backend=marlin,page_size=256",
        "STANDIN_LOGGED_ARGS": "attention_backend=dsv4"})
    wait_status(f"http://127.0.0.1:{port}/server_info", 200)
    info = json.loads(http("GET", f"http://127.0.0.1:{port}/server_info")[1])
    assert (info["moe_runner_backend"], info["page_size"], info["attention_backend"]) == (
        "marlin", 256, None)
    [logged] = [ln for ln in run.output().splitlines() if "server_args=ServerArgs(" in ln]
    args = parse_server_args(logged)["args"]
    assert (args["moe_runner_backend"], args["page_size"], args["attention_backend"]) == (
        "marlin", 256, "dsv4")
    bad = launch("sglang.launch_server", "--model-path", MODEL, "--port", str(free_port()),
                 env={"STANDIN_RESOLVED_ARGS": "no_such_field=1"})
    assert bad.proc.wait(timeout=30) == 1
    assert "stand-in: STANDIN_RESOLVED_ARGS: 'no_such_field=1' is not FIELD=VALUE of a " \
        "ServerArgs field" in bad.output()
