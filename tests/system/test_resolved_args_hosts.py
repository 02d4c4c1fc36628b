"""Requested vs resolved (`resolved-args`) on a real nspawn host whose stand-in servers
resolve their backends as a real GPU would (STANDIN_RESOLVED_ARGS) or only log them
(STANDIN_LOGGED_ARGS); the check on fixture facts: tests/unit/test_resolved_args.py."""

from __future__ import annotations

import json

import pytest

from tests.hostutil import cli
from tests.system.test_audit_hosts import D, P, audit, deploy, finding, prepare_host
from tests.system.test_audit_hosts import audit_env, env  # noqa: F401 - the fixtures used here
from tests.unit.test_resolved_args import FLAG, MD_FLAG, SECRET

pytestmark = pytest.mark.hosts


# ---------------------------------------------------------------- a real host

def test_on_a_host_override_journal_corroboration_and_unknown(audit_env, capsys) -> None:
    """prefill: `--moe-runner-backend triton`, the server resolves marlin (an override);
    decode: no flag (auto), /server_info keeps auto and only its startup line says marlin
    (corroborated from the journal); both: kv_cache_dtype auto everywhere (unknown). The
    API key, moved by deploy into the root-only --config file, is in the startup line as
    upstream logs it, and nowhere in the report."""
    prepare_host(audit_env, capsys)
    common = ["--attention-backend", "dsv4", "--reasoning-parser", "deepseek-v4",
              "--api-key", SECRET]
    deploy(audit_env, capsys, roles={
        "prefill": {"extra_args": ["--moe-runner-backend", "triton", *common],
                    "env": {"STANDIN_RESOLVED_ARGS": "moe_runner_backend=marlin"}},
        "decode": {"extra_args": common,
                   "env": {"STANDIN_LOGGED_ARGS": "moe_runner_backend=marlin"}}})
    code, data = audit(audit_env, capsys)
    assert code == 1
    over = finding(data, FLAG, P)
    assert (over["status"], over["severity"], over["expected"], over["found"]) == (
        "warn", "medium", "triton", "marlin (/server_info)")
    note = finding(data, FLAG, D)
    assert (note["status"], note["severity"], note["expected"], note["found"]) == (
        "warn", "info", "auto",
        "marlin (the server_args= line it logged at startup (journal))")
    assert "/server_info says auto" not in note["message"]     # it resolved: no why needed
    kv = finding(data, "resolved-args[kv_cache_dtype]", D)
    assert (kv["status"], kv["severity"]) == ("unknown", "info")
    assert "/server_info says auto" in kv["message"] and \
        "its startup server_args= line says auto" in kv["message"]
    servers = {s["id"]: s for s in data["hosts"][0]["facts"]["servers"]}
    log = servers[D]["server_args_log"]
    assert log["known"] and log["value"]["args"]["moe_runner_backend"] == "marlin"
    assert log["value"]["args"]["api_key"].startswith("<redacted:")
    assert log["provenance"]["command"].endswith(f"--unit={D} _PID={servers[D]['pid']}")
    assert servers[P]["server_args_log"]["value"]["args"]["moe_runner_backend"] == "marlin"
    assert SECRET not in json.dumps(data)
    code, out, _ = cli(capsys, "audit", audit_env["host"].name, "--format", "md", "--series",
                       str(audit_env["series"]))
    assert code == 1 and f"| **warn** | medium | {MD_FLAG} | {P} moe_runner_backend |" in out
    assert SECRET not in out
