"""Secrets never leave redaction (hardening point 10).

Deploy writes api_key / admin_api_key (and any secret flag of extra_args) to a root-only
`--config` file instead of the unit and the command line; everything deploy prints (the
dry-run and real diffs, the journal tail of a failed unit, errors, progress) is redacted
with auditor/redact.py; the `secrets` audit check flags world-readable unit, env and
config files that hold one; the stand-in reads `--config` like the pinned server.

Fast tests: rendering, redaction, the deploy library and CLI against a scripted channel,
the runner's file handling on this machine, the check on synthetic facts, the stand-in
from a local venv. The real-host proof is in tests/system/test_deploy.py.
"""

from __future__ import annotations

import copy
import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from tests.audit_facts import synth

from patchset.agent.lib.records import Event
from patchset.auditor import api, hostfacts
from patchset.agent.lib.facts import procs
from patchset.agent import gather
from patchset.agent import runner as runner_mod
from patchset.agent.lib.redact import MARK, Redactor, redact_text, spellings
from patchset.deploy import deploy as dep
from patchset.connect.resolve import Hosts
from patchset import transport as wire
from patchset.agent import main as agent_main
from patchset.agent.lib import wire as agentwire
from tests.faketransport import FakeTransport
from patchset.connect import settings
from patchset.deploy import units
from patchset.agent import deployer
from patchset.connect.inventory import Host, load
from patchset.cli import main
from patchset.errors import ManifestError, TargetError, UsageError
from tests.hostutil import http_status
from tests.standin.install import PAYLOAD, install_standin_local

if str(PAYLOAD) not in sys.path:
    sys.path.insert(0, str(PAYLOAD))

from sglang_standin import yaml_subset  # noqa: E402

# Planted secrets: hostile characters (quotes, $, backtick, %, backslash, '#', ': ', a
# comma, a semicolon), one shaped like an HF token, one not shaped like anything.
API_KEY = 'Zq9-api "key" $HOME `t` %d back\\slash #x: y'
ADMIN_KEY = "adm1n-K3y,s3cr3t;value"
HF_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWx"
SERVICE_PASSWORD = "p4ss,w0rd;x'y"
SSL_PASSWORD = 'ssl"pw-7781'
OLD_KEY = "old-rotated-key-42"
OLD_HF = "old-token-value-9"
SECRETS = (API_KEY, ADMIN_KEY, HF_TOKEN, SERVICE_PASSWORD, SSL_PASSWORD)
ALL = SECRETS + (OLD_KEY, OLD_HF)

APPLIED = [{"name": "idx-c", "sha256": "c" * 64, "path": "decode",
            "gate": {"env": "TRITON_INDEXER", "on": "1"}}]


def assert_clean(text: str, secrets=ALL) -> None:
    """No secret in any spelling (raw, JSON-escaped, repr'd, env- or unit-escaped)."""
    for secret in secrets:
        for form in spellings(secret):
            if len(form) >= 4:
                assert form not in text, f"{secret!r} shown as {form!r}"


def host(**roles) -> Host:
    base = {"prefill": {"gpus": "0,1", "port": 30000},
            "decode": {"gpus": "2,3", "port": 30001, "admin_api_key": ADMIN_KEY,
                       "extra_args": ["--mem-fraction-static", "0.8",
                                      f"--ssl-keyfile-password={SSL_PASSWORD}"],
                       "env": {"HF_TOKEN": HF_TOKEN, "MY_SERVICE_PASSWORD": SERVICE_PASSWORD}},
            "router": {"port": 8000}}
    base.update(roles)
    return Host(name="gpu1", address="10.0.0.5", python="/opt/venv/bin/python",
                tree="/opt/sglang", roles={k: v for k, v in base.items() if v is not None},
                serving={"model_path": "/models/DeepSeek-V4", "transfer_backend": "nixl",
                         "api_key": API_KEY})


def rendered(h: Host | None = None) -> dict[str, units.Rendered]:
    h = h or host()
    return units.render(h, units.resolve(h, [r for r in settings.ROLES if r in h.roles],
                                         "/opt/sglang", {"applied": APPLIED}, "git"))


# ---------------------------------------------------------------- rendering

def test_credentials_go_to_a_root_only_config_file_not_the_unit() -> None:
    r = rendered()
    for role, expected in (("prefill", {"api-key": API_KEY}),
                           ("decode", {"api-key": API_KEY, "admin-api-key": ADMIN_KEY,
                                       "ssl-keyfile-password": SSL_PASSWORD})):
        f = r[role]
        assert_clean(f.unit_text, SECRETS)
        assert_clean(f.env_text, (API_KEY, ADMIN_KEY, SSL_PASSWORD))
        assert f.config_path == f"/etc/sglang/{role}.secrets.yaml"
        assert yaml.safe_load(f.config_text) == expected
        assert yaml_subset.safe_load(f.config_text) == expected     # the stand-in agrees
        argv = units.resolve(host(), [role], "/opt/sglang", {"applied": APPLIED}, "git")[
            role].argv
        assert argv[-2:] == ["--config", f.config_path]
        assert not any(a.startswith(("--api-key", "--admin-api-key", "--ssl-keyfile-password"))
                       for a in argv)
        assert f"--config {f.config_path}" in f.unit_text
    decode_env = units.parse_env_file(r["decode"].env_text)
    assert decode_env["HF_TOKEN"] == HF_TOKEN                       # 0600 env file: allowed
    assert decode_env["MY_SERVICE_PASSWORD"] == SERVICE_PASSWORD
    assert "--mem-fraction-static 0.8" in r["decode"].unit_text      # other args stay
    assert r["router"].config_text is None and r["router"].config_path is None
    assert "--config" not in r["router"].unit_text
    # no credentials: no config file and no --config
    plain = units.render(Host(name="g", address="a", python="/p", tree="/t",
                              roles={"decode": {"gpus": "0", "port": 1}},
                              serving={"model_path": "/m"}),
                         units.resolve(Host(name="g", address="a", python="/p", tree="/t",
                                            roles={"decode": {"gpus": "0", "port": 1}},
                                            serving={"model_path": "/m"}),
                                       ["decode"], "/t", None, "git"))
    assert plain["decode"].config_text is None and "--config" not in plain["decode"].unit_text


HOSTILE_KEYS = ['"', "\\", "'", "a\\\"b", "$(id)", "`id`", "${HOME}", "%n%%", "k: v",
                "#comment", " spaced ", "ünïcødé-ключ", "tab-less\u00e9", "x" * 4096,
                "[1, 2]", "{a: b}", "&anchor", "*alias", "!tag", "null", "true", "0x1f",
                "012", "1e3", "~", "a\\nb", "yes"]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_any_printable_key_round_trips_through_the_config_file(key: str) -> None:
    h = host(decode={"gpus": "2,3", "port": 30001, "api_key": key})
    f = rendered(h)["decode"]
    assert yaml.safe_load(f.config_text) == {"api-key": key}
    assert yaml_subset.safe_load(f.config_text) == {"api-key": key}
    assert "--api-key" not in f.unit_text
    if len(key.strip()) >= 6:
        assert key not in f.unit_text and key not in f.env_text


INVENTORY = """\
version: 1
hosts:
  gpu1:
    address: 10.0.0.5
    python: /opt/venv/bin/python
    tree: /opt/sglang
    serving:
      model_path: /models/DeepSeek-V4
%s
    roles:
      prefill: {gpus: "0,1", port: 30000}
%s
      router: {port: 8000%s}
"""


@pytest.mark.parametrize("serving, decode, router, field, message, hidden", [
    ('      api_key: "-starts-with-dash-K3Y"', "", "", "serving.api_key",
     "starts with '-'", "-starts-with-dash-K3Y"),
    ('      api_key: "line\\nbreak-K3Y"', "", "", "serving.api_key",
     "contains a newline, tab or control character", "break-K3Y"),
    ('      api_key: ""', "", "", "serving.api_key", "is empty", None),
    ('      env: {MY_TOKEN: "ctl\\x01-T0K3N"}', "", "", "serving.env.MY_TOKEN",
     "contains a newline or control character", "T0K3N"),
    ("", '      decode: {gpus: "2", port: 1, api_key: "tab\\there-K3Y"}', "",
     "roles.decode.api_key", "tab", "here-K3Y"),
    ("", '      decode: {gpus: "2", port: 1, extra_args: [--api-key, "it\'s-K3Y\\n"]}', "",
     "roles.decode.extra_args[1]", "--api-key: the value contains", "s-K3Y"),
    ("", '      decode: {gpus: "2", port: 1, extra_args: [--x, "1", --api-key]}', "",
     "roles.decode.extra_args[2]", "--api-key needs a value", None),
    ("", "", ", extra_args: [--api-key, r0uter-K3Y]", "roles.router.extra_args[0]",
     "the router reads no --config file", "r0uter-K3Y"),
    ("", '      decode: {gpus: "2", port: 1, api_key: 12345678, admin_api_key: [x]}', "",
     "roles.decode.admin_api_key", "must be a string", None),
])
def test_bad_credentials_are_refused_without_showing_them(tmp_path: Path, serving: str,
                                                          decode: str, router: str, field: str,
                                                          message: str, hidden) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(INVENTORY % (serving, decode, router))
    with pytest.raises(ManifestError) as info:
        load(path)
    text = str(info.value)
    assert f"hosts.gpu1.{field}" in text and message in text, text
    if hidden:
        assert hidden not in text


def test_conflicting_or_deploy_owned_credential_flags_are_refused() -> None:
    twice = host(decode={"gpus": "2", "port": 1, "api_key": API_KEY,
                         "extra_args": ["--api-key", "other-K3Y-value"]})
    with pytest.raises(UsageError, match="--api-key is given twice") as info:
        units.resolve(twice, ["decode"], "/opt/sglang", None, "git")
    assert_clean(str(info.value), (API_KEY, "other-K3Y-value"))
    own = host(decode={"gpus": "2", "port": 1, "extra_args": ["--config", "/etc/x.yaml"]})
    with pytest.raises(UsageError, match="--config is rendered by deploy"):
        units.resolve(own, ["decode"], "/opt/sglang", None, "git")


def test_secret_flags_of_extra_args_move_to_the_config_file() -> None:
    h = Host(name="g", address="a", python="/p", tree="/t", serving={"model_path": "/m"},
             roles={"decode": {"gpus": "0", "port": 1, "extra_args": [
                 "--api-key", "moved-K3Y-1", "--admin-api-key=moved=K3Y=2", "--log-level",
                 "info"]}})
    u = units.resolve(h, ["decode"], "/t", None, "git")["decode"]
    assert u.config == {"api-key": "moved-K3Y-1", "admin-api-key": "moved=K3Y=2"}
    assert u.argv[-4:] == ["--log-level", "info", "--config", "/etc/sglang/decode.secrets.yaml"]
    f = units.render(h, {"decode": u})["decode"]
    assert_clean(f.unit_text, ("moved-K3Y-1", "moved=K3Y=2"))


# ---------------------------------------------------------------- the redactor

@pytest.mark.parametrize("line, secret", [
    ('HF_TOKEN="a\\"b c"', 'b c'),                             # escaped quote in an env file
    ("MY_SERVICE_PASSWORD=p4ss,w0rd;x", "w0rd;x"),              # a plain env value with , ;
    ('ExecStart=/p -m sglang.launch_server --api-key ab"cd --port 1', 'cd'),
    ("ExecStart=/p --api-key=Zq9secret --port 3", "Zq9secret"),
    ('+api-key: "abc def #x: y"', "abc def"),                   # the --config diff
    ("-admin-api-key: plain value here", "plain value"),
    ("server_args=ServerArgs(model_path='/m', api_key='s3cr3t-v', admin_api_key=None)",
     "s3cr3t-v"),
    ("{'api_key': 'x1y2z3w4', 'port': 3}", "x1y2z3w4"),
    ('{"api_key": "x1y2\\"z3w4", "port": 3}', "z3w4"),
    ("FOO=bar,HF_TOKEN=tok-xyz-123 rest", "tok-xyz-123"),
    ("X-Api-Key: abcdef123", "abcdef123"),
    ('Environment="SOME_SECRET=two words"', "two words"),
    ("MY_KEY='it\\'s-a-key'", "s-a-key"),
    ("MY_KEY=\"unterminated-secret-value", "unterminated-secret"),
])
def test_redaction_masks_secrets_in_every_syntax(line: str, secret: str) -> None:
    out = redact_text(line)
    assert secret not in out and MARK in out, out


@pytest.mark.parametrize("line", [
    "tokenizer_path: /models/x", "MAX_TOTAL_TOKENS=5", "credentials: chmod 0640",
    "sglang-decode.service: deploy FAILED: x", '{"api_key": null, "port": 3}',
    "CUDA_VISIBLE_DEVICES=0,1,2,3", "--ssl-keyfile /etc/ssl/key.pem",
])
def test_redaction_leaves_what_is_not_a_secret(line: str) -> None:
    assert redact_text(line) == line


def test_known_values_are_masked_in_any_spelling() -> None:
    red = Redactor(known=[API_KEY, ADMIN_KEY])
    text = (f"Traceback: ValueError({API_KEY!r}) json {json.dumps(API_KEY)} env "
            f"{settings.env_value(API_KEY)} unit {API_KEY.replace('%', '%%').replace('$', '$$')} "
            f"prose {ADMIN_KEY} end")
    out = red.text(text)
    assert_clean(out, (API_KEY, ADMIN_KEY))
    assert out.count(MARK) >= 5 and out.startswith("Traceback: ValueError(") and "end" in out
    assert Redactor(known=["abc"]).text("abc") == "abc"     # too short to mask by value


# ---------------------------------------------------------------- deploy, scripted

class ScriptedChannel(FakeTransport):
    def __init__(self, facts: dict, deploy: dict | None = None) -> None:
        super().__init__("gpu1")
        self.facts, self.deploy = facts, deploy

    def answer(self, request: dict, on_event=None) -> dict:
        if request["op"] == "facts":
            return dict(self.facts, root=True) if self.facts.get("ok") else self.facts
        for event in self.deploy.get("events", []) if on_event else []:
            on_event(Event(**event))
        return {k: v for k, v in self.deploy.items() if k != "events"}


def old_files() -> dict:
    """What an older deploy left: the key on ExecStart, an old token, an old config."""
    return {
        "decode": {
            "unit_text": "[Service]\nEnvironmentFile=/etc/sglang/decode.env\nExecStart="
                         f"/opt/venv/bin/python -m sglang.launch_server --api-key {OLD_KEY}"
                         " --port 30001\n",
            "env_text": f"HF_TOKEN={OLD_HF}\nMY_SERVICE_PASSWORD=\"{SERVICE_PASSWORD}\"\n",
            "config_text": f'api-key: "{OLD_KEY}"\n', "insecure": [
                {"path": "/etc/sglang/decode.env", "mode": "0644", "uid": 0}]},
    }


def facts(installed: dict | None = None) -> dict:
    installed = installed or {}
    return {"ok": True, "systemd": True,
            "tree": {"root": "/opt/sglang", "layout": "git", "managed": True,
                     "state_sha256": "s" * 64, "applied": APPLIED, "updated": "x"},
            "roles": {r: {"unit_text": None, "env_text": None, "config_text": None,
                          "systemd": {"ActiveState": "active"}, "stale": False,
                          **installed.get(r, {})} for r in settings.ROLES}}


def test_dry_run_result_never_holds_a_secret_old_or_new() -> None:
    channel = ScriptedChannel(facts(old_files()))
    result = dep.deploy_units(host(), channel, "/opt/sglang", dry_run=True)
    dumped = json.dumps(result.to_json())
    assert_clean(dumped)
    by = {r.role: r for r in result.roles}
    diff = by["decode"].diff
    assert "--- a/etc/sglang/decode.secrets.yaml\n+++ b/etc/sglang/decode.secrets.yaml" in diff
    assert '-api-key: "<redacted>"' in diff and '+api-key: "<redacted>"' in diff
    assert "--api-key <redacted>" in diff                       # the old unit's - line
    assert "-HF_TOKEN=<redacted>" in diff and "+HF_TOKEN=<redacted>" in diff
    assert "+++ b/etc/sglang/prefill.secrets.yaml" in by["prefill"].diff
    assert by["decode"].changed and any("mode 0644" in n for n in by["decode"].notes)
    assert [r["op"] for r in channel.requests] == ["facts"]


def test_the_runner_request_carries_the_config_and_what_to_redact() -> None:
    done = {"ok": True, "deployed": True, "changed": True, "failed": None, "rollback": None,
            "actions": {r: ["installed"] for r in settings.ROLES}, "restart_reasons": {}}
    channel = ScriptedChannel(facts(old_files()), done)
    dep.deploy_units(host(), channel, "/opt/sglang")
    request = channel.requests[-1]
    assert request["op"] == "deploy"
    decode = request["roles"]["decode"]
    assert yaml.safe_load(decode["config_text"])["api-key"] == API_KEY
    assert decode["config_path"] == "/etc/sglang/decode.secrets.yaml"
    assert_clean(decode["unit_text"], SECRETS)
    assert set(request["redact"]) >= set(ALL)
    assert request["roles"]["router"]["config_path"] is None


def failed_deploy() -> dict:
    journal = [
        f"2026-11-29T12:00:00+0000 gpu1 python[77]: [x] server_args=ServerArgs(model_path="
        f"'/m', api_key={API_KEY!r}, admin_api_key={ADMIN_KEY!r}, port=30001)",
        f"2026-11-29T12:00:01+0000 gpu1 python[77]: HF_TOKEN={HF_TOKEN} MY_SERVICE_PASSWORD="
        f"{SERVICE_PASSWORD}",
        f"2026-11-29T12:00:02+0000 gpu1 python[77]: ValueError: bad key {API_KEY} / "
        f"{json.dumps(API_KEY)} / old {OLD_KEY}",
        "2026-11-29T12:00:03+0000 gpu1 python[77]: plain line that stays",
    ]
    return {"ok": True, "deployed": False, "changed": True,
            "actions": {"prefill": ["installed", "restarted"], "decode": ["installed",
                                                                          "restarted"],
                        "router": []},
            "restart_reasons": {"prefill": "unit or env file changed",
                                "decode": "unit or env file changed"},
            "failed": {"role": "decode", "unit": "sglang-decode.service",
                       "reason": f"systemctl restart failed: {ADMIN_KEY} rejected",
                       "journal": journal},
            "rollback": [{"role": "decode", "unit": "sglang-decode.service",
                          "action": "restarted with the previous files", "healthy": False,
                          "error": f"refused key {OLD_KEY}"}],
            "events": [{"event": "step", "message": f"verify saw --api-key {API_KEY}"},
                       {"event": "wait", "role": "decode", "url": "http://127.0.0.1:1/health",
                        "elapsed": 0, "timeout": 5, "detail": f"HTTP 401 {ADMIN_KEY}"}]}


def test_a_failed_deploy_shows_a_redacted_journal_and_error() -> None:
    seen: list[Event] = []
    result = dep.deploy_units(host(), ScriptedChannel(facts(old_files()), failed_deploy()),
                        "/opt/sglang", timeout=5, on_event=seen.append)
    assert not result.ok and result.exit_code == 4
    assert_clean(json.dumps(result.to_json()) + json.dumps([e.to_json() for e in seen]))
    assert "last journal lines of sglang-decode.service:" in result.details
    assert "api_key='<redacted>'" in result.details and "HF_TOKEN=<redacted>" in result.details
    assert "plain line that stays" in result.details and MARK in result.error
    assert "admin_api_key='<redacted>'" in result.details


def test_errors_raised_by_deploy_are_redacted() -> None:
    bad = {"ok": False, "error": {"kind": "target",
                                  "message": f"could not read the config: {API_KEY} / "
                                             f"{OLD_KEY}"}}
    with pytest.raises(TargetError) as info:
        dep.deploy_units(host(), ScriptedChannel(bad), "/opt/sglang", dry_run=True)
    assert_clean(str(info.value), SECRETS)          # the old key is not known yet: no facts
    assert MARK in str(info.value)


# ---------------------------------------------------------------- the CLI

CLI_INVENTORY = f"""\
version: 1
default: gpu1
hosts:
  gpu1:
    address: 10.0.0.5
    python: /opt/venv/bin/python
    tree: /opt/sglang
    serving:
      model_path: /models/DeepSeek-V4
      api_key: {json.dumps(API_KEY)}
    roles:
      prefill: {{gpus: "0,1", port: 30000}}
      decode:
        gpus: "2,3"
        port: 30001
        admin_api_key: {json.dumps(ADMIN_KEY)}
        extra_args: [--ssl-keyfile-password, {json.dumps(SSL_PASSWORD)}]
        env: {{HF_TOKEN: {json.dumps(HF_TOKEN)}, MY_SERVICE_PASSWORD: {json.dumps(SERVICE_PASSWORD)}}}
      router: {{port: 8000}}
"""


@pytest.fixture()
def cli_env(series_dir: Path, patchset_home: Path, monkeypatch, tmp_path: Path):
    """cwd = a series with the inventory above; no ssh config or known_hosts of the user;
    the deploy channel scripted (`set(channel)`)."""
    monkeypatch.chdir(series_dir)
    (series_dir / "hosts.yaml").write_text(CLI_INVENTORY)
    for name in ("PATCHSET_SSH_CONFIG", "PATCHSET_KNOWN_HOSTS"):
        empty = tmp_path / name.lower()
        empty.write_text("")
        monkeypatch.setenv(name, str(empty))
    holder: dict = {}
    monkeypatch.setattr(Hosts, "transport", lambda self, spec, provision_local=True:
                        holder["channel"])
    return lambda channel: holder.__setitem__("channel", channel)


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_dry_run_never_prints_a_secret(cli_env, capsys, as_json: bool) -> None:
    cli_env(ScriptedChannel(facts(old_files())))
    code = main(["deploy", "gpu1", "--dry-run"] + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert_clean(out + err)
    assert MARK in out
    if as_json:
        [result] = json.loads(out)
        assert '+api-key: "<redacted>"' in result["roles"][1]["diff"]
    else:
        assert '+api-key: "<redacted>"' in out and "+HF_TOKEN=<redacted>" in out
        assert "gpu1: decode sglang-decode.service: would install and restart" in out


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_failed_deploy_prints_a_redacted_journal(cli_env, capsys, as_json: bool) -> None:
    cli_env(ScriptedChannel(facts(old_files()), failed_deploy()))
    code = main(["deploy", "gpu1"] + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert code == 4
    assert_clean(out + err)
    assert MARK in (out if as_json else err)
    if not as_json:
        assert "gpu1: deploy FAILED:" in err and "last journal lines of" in err
        assert "api_key='<redacted>'" in err


def test_cli_errors_never_print_a_secret(cli_env, capsys) -> None:
    cli_env(ScriptedChannel({"ok": False, "error": {
        "kind": "target", "message": f"boom {API_KEY} {HF_TOKEN} {ADMIN_KEY}"}}))
    code = main(["deploy", "gpu1", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 4 and "patchset: error:" in err
    assert_clean(out + err)


# ---------------------------------------------------------------- the runner, on this machine

@pytest.fixture()
def runner_host(tmp_path: Path, monkeypatch):
    """The deploy runner with systemd and HTTP scripted: real files under tmp_path."""
    assert os.geteuid() == 0, ("the runner writes root-owned files: run the suite as root, "
                               "as make test does (the nspawn hosts need it too)")
    monkeypatch.setattr(deployer, "RECORD_DIR", str(tmp_path / "record"))
    monkeypatch.setattr(deployer, "verify", lambda roles, events: None)
    monkeypatch.setattr(deployer, "show", lambda unit: {
        "ActiveState": "active", "UnitFileState": "enabled", "MainPID": "1", "NRestarts": "0"})
    monkeypatch.setattr(deployer, "systemctl", lambda *a: None)
    monkeypatch.setattr(deployer, "run", lambda args, timeout=0: subprocess.CompletedProcess(
        args, 0, "", ""))
    monkeypatch.setattr(deployer, "units_by_name", lambda target, state: {})
    monkeypatch.setattr(deployer.engine, "refuse_during_bisect", lambda t, r: None)
    state = tmp_path / "state.json"
    state.write_text('{"applied": []}')
    target = types.SimpleNamespace(root=tmp_path, state_file=state, state=lambda: {})
    etc = tmp_path / "etc"
    spec = {"unit": "sglang-decode.service", "unit_path": str(etc / "sglang-decode.service"),
            "env_path": str(etc / "decode.env"), "config_path": str(etc / "decode.secrets.yaml"),
            "unit_text": "[Service]\nExecStart=/p --config /etc/sglang/decode.secrets.yaml\n",
            "env_text": f"HF_TOKEN={HF_TOKEN}\n", "config_text": f"api-key: {json.dumps(API_KEY)}\n",
            "effective": True, "health_url": "http://127.0.0.1:9/health", "health_timeout": 1}
    request = agentwire.DeployRequest(roles={"decode": spec}, redact=list(SECRETS),
                                      tree=str(tmp_path),
                                      state_sha256=deployer.sha256(state.read_bytes()))
    return types.SimpleNamespace(target=target, request=request, spec=spec, etc=etc,
                                 record=tmp_path / "record")


def mode_owner(path: str | Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def test_runner_writes_credentials_root_only_and_fixes_loose_modes(runner_host, monkeypatch) -> None:
    h = runner_host
    monkeypatch.setattr(deployer, "wait_healthy", lambda *a: 0.1)
    out = deployer._deploy_locked(h.request, h.target, deployer.Events(io.StringIO()))
    assert out.deployed and out.actions["decode"][:2] == ["installed", "restarted"]
    assert mode_owner(h.spec["config_path"]) == (0o600, 0, 0)
    assert mode_owner(h.spec["env_path"]) == (0o600, 0, 0)
    assert mode_owner(h.spec["unit_path"])[0] == 0o644
    assert yaml.safe_load(Path(h.spec["config_path"]).read_text()) == {"api-key": API_KEY}
    assert not list(h.etc.glob(".*"))                          # no temporary file left
    # Someone loosened the modes: the same content is rewritten 0600, without a restart.
    os.chmod(h.spec["config_path"], 0o644)
    os.chmod(h.spec["env_path"], 0o640)
    assert {x["path"] for x in deployer.insecure(h.spec)} == {h.spec["config_path"],
                                                                h.spec["env_path"]}
    again = deployer._deploy_locked(replace(h.request, roles={"decode": dict(
        h.spec, effective=False)}), h.target, deployer.Events(io.StringIO()))
    assert again.actions["decode"] == ["installed"]
    assert mode_owner(h.spec["config_path"]) == (0o600, 0, 0)
    assert mode_owner(h.spec["env_path"]) == (0o600, 0, 0)
    # No credentials any more: the config file goes.
    deployer._deploy_locked(replace(h.request, roles={"decode": dict(
        h.spec, config_text=None)}), h.target, deployer.Events(io.StringIO()))
    assert not Path(h.spec["config_path"]).exists()


def test_runner_redacts_the_journal_and_rolls_the_config_back(runner_host, monkeypatch) -> None:
    h = runner_host
    h.etc.mkdir()
    Path(h.spec["unit_path"]).write_text("[Service]\nExecStart=/p\n")
    Path(h.spec["env_path"]).write_text(f"HF_TOKEN={OLD_HF}\n")
    os.chmod(h.spec["env_path"], 0o644)
    during: dict = {}

    def wait_healthy(role, spec, events, phase):
        if phase == "rollback":
            return 0.1
        during["config"] = mode_owner(spec["config_path"])
        during["env"] = mode_owner(spec["env_path"])
        during["txn"] = mode_owner(h.record / "txn.json")
        during["record"] = mode_owner(h.record)[0]
        raise deployer.Failure(role, spec["unit"], f"unhealthy with key {API_KEY}")

    monkeypatch.setattr(deployer, "wait_healthy", wait_healthy)
    monkeypatch.setattr(deployer, "journal", lambda unit: [
        f"server_args=ServerArgs(api_key={API_KEY!r}, admin_api_key=None)",
        f"HF_TOKEN={HF_TOKEN}", f"raw {API_KEY} and {SERVICE_PASSWORD}", "a plain line"])
    out = agentwire.encode_result(
        deployer._deploy_locked(h.request, h.target, deployer.Events(io.StringIO())))
    assert during == {"config": (0o600, 0, 0), "env": (0o600, 0, 0), "txn": (0o600, 0, 0),
                      "record": 0o700}
    assert_clean(json.dumps(out), SECRETS)
    assert out["failed"]["journal"][0] == "server_args=ServerArgs(api_key='<redacted>', " \
                                          "admin_api_key=None)"
    assert out["failed"]["journal"][-1] == "a plain line" and MARK in out["failed"]["reason"]
    assert not Path(h.spec["config_path"]).exists()                 # it was new: removed
    assert Path(h.spec["env_path"]).read_text() == f"HF_TOKEN={OLD_HF}\n"
    assert mode_owner(h.spec["env_path"])[0] == 0o600               # restored root-only
    assert not (h.record / "txn.json").exists()
    bad = agent_main.serve_json({"op": f"nope {API_KEY}", "protocol": agentwire.PROTOCOL,
                                 "redact": [API_KEY]}, h.etc, deployer.Events(io.StringIO()))
    assert_clean(json.dumps(bad), (API_KEY,))
    assert bad["error"] == {"kind": "usage", "message": "unknown op (not shown)", "details": ""}
    # a refusal of the deploy runner is redacted with the request's secrets

    def refuse(request, events):
        raise deployer.engine.EngineError(f"refused with {API_KEY}", "usage", API_KEY)

    monkeypatch.setattr(deployer, "op_deploy", refuse)
    refused = agentwire.encode_result(deployer.serve(h.request))
    assert_clean(json.dumps(refused), (API_KEY,)) and MARK in refused["error"]["message"]



def test_the_bundle_ships_the_redactor() -> None:
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(wire.bundle(agentwire.FactsRequest()))) as tar:
        assert {f"{wire.AGENT_NAME}/{n}" for n in ("engine.py", "deployer.py", "lib/redact.py")} \
            | {"request.json"} <= set(tar.getnames())
        assert all(m.mode == 0o600 for m in tar.getmembers())


# ---------------------------------------------------------------- the audit's secrets check

def with_files(seed: dict, series, edit) -> list:
    raw = synth.gather_result(seed, series)
    edit(raw["raw"])
    return api.evaluate(series, [hostfacts.build("gpu1", agentwire.decode_result("audit", raw))]).findings


def secret_findings(findings) -> dict:
    return {(f.id, f.subject): f for f in findings if f.id.startswith("secrets")}


P, D = "sglang-prefill.service", "sglang-decode.service"


def test_secrets_check_flags_world_readable_files_holding_a_secret(series, seed) -> None:
    for s in seed["servers"]:
        s["argv"] = [str(a) for a in s["argv"]] + [
            "--config", f"/etc/sglang/{s['unit'].split('-')[1].split('.')[0]}.secrets.yaml"]

    def edit(raw: dict) -> None:
        units_ = raw["units"]
        units_[D]["file"]["stdout"] += ("ExecStart=/opt/venv/bin/python -m sglang.launch_server "
                                        "--api-key <redacted:1a2b3c4d>\n")
        units_[D]["file"]["stat"]["mode"] = "0644"
        decode_env = units_[D]["env_files"]["/etc/sglang/decode.env"]
        decode_env["stdout"] += "HF_TOKEN=<redacted:99aa88bb>\n"
        decode_env["stat"]["mode"] = "0644"
        prefill_env = units_[P]["env_files"]["/etc/sglang/prefill.env"]
        prefill_env["stdout"] += "HF_TOKEN=<redacted:99aa88bb>\n"
        prefill_env["stat"]["mode"] = "0600"
        for srv, mode in zip(raw["servers"], ("0600", "0644")):
            role = "prefill" if mode == "0600" else "decode"
            srv["config_file"] = {"kind": "read", "command": f"read /etc/sglang/{role}.secrets.yaml",
                                  "duration_ms": 1.0, "exit_code": 0, "stdout": "api-key\nlog-level",
                                  "stderr": "", "error": None,
                                  "stat": {"mode": mode, "uid": 0, "gid": 0, "mtime": 1.0,
                                           "size": 9}}

    found = secret_findings(with_files(seed, series, edit))
    unit = found[("secrets[unit-file]", f"{D} unit file")]
    assert (unit.status, unit.severity) == ("fail", "high") and "--api-key" in unit.found
    env = found[("secrets[env-file]", "/etc/sglang/decode.env")]
    assert env.status == "fail" and env.found == "mode 0644 holding HF_TOKEN"
    assert found[("secrets[env-file]", "/etc/sglang/prefill.env")].status == "pass"
    bad = found[("secrets[config-file]", f"{D} --config /etc/sglang/decode.secrets.yaml")]
    assert (bad.status, bad.found) == ("fail", "mode 0644 holding api-key")
    good = found[("secrets[config-file]", f"{P} --config /etc/sglang/prefill.secrets.yaml")]
    assert good.status == "pass"
    assert ("secrets[unit-file]", f"{P} unit file") not in found


def test_secrets_check_is_quiet_about_clean_files_and_says_unknown(series, seed) -> None:
    def edit(raw: dict) -> None:
        raw["servers"][0]["config_file"] = {
            "kind": "read", "command": "read /etc/sglang/prefill.secrets.yaml",
            "duration_ms": 1.0, "exit_code": 13, "stdout": "", "stderr": "Permission denied",
            "error": None}
    found = secret_findings(with_files(seed, series, edit))
    assert not any(k[0] in ("secrets[unit-file]", "secrets[env-file]") for k in found)
    [cfg] = [f for (i, _), f in found.items() if i == "secrets[config-file]"]
    assert cfg.status == "unknown" and "EACCES" in cfg.message


def test_the_gatherer_sends_a_config_files_keys_never_its_values(tmp_path: Path) -> None:
    path = tmp_path / "decode.secrets.yaml"
    path.write_text(f"# x\napi-key: {json.dumps(API_KEY)}\nadmin-api-key: '{ADMIN_KEY}'\n")
    os.chmod(path, 0o644)
    runner = runner_mod.Runner(Redactor(tagged=True))
    rec = runner.read(procs.ConfigFile().command(path=str(path)), "keys", stat=True)
    assert rec["stdout"] == "api-key\nadmin-api-key" and rec["stat"]["mode"] == "0644"
    assert_clean(json.dumps(rec), (API_KEY, ADMIN_KEY))
    value = procs.ConfigFile().collect(rec).value
    assert value["keys"] == ["api-key", "admin-api-key"]
    assert gather._config_value(str(path), "api-key") == API_KEY     # to authenticate, locally
    assert gather._config_value(str(path), "admin-api-key") == ADMIN_KEY
    assert gather._config_value(str(tmp_path / "none.yaml"), "api-key") is None


# ---------------------------------------------------------------- the stand-in reads --config

@pytest.fixture(scope="module")
def standin(pinned_base, tmp_path_factory: pytest.TempPathFactory) -> str:
    return install_standin_local(tmp_path_factory.mktemp("standin") / "venv", pinned_base.repo)





def _serve(python: str, args: list[str], tmp_path: Path) -> subprocess.Popen:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8",
           "STANDIN_STARTUP_DELAY": "0.1"}
    return subprocess.Popen([python, "-m", "sglang.launch_server", *args], env=env, cwd="/",
                            stdout=open(tmp_path / "server.log", "wb"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_standin_takes_the_key_from_config_and_requires_it(standin: str, tmp_path: Path) -> None:
    from tests.hostutil import free_port
    config = tmp_path / "decode.secrets.yaml"
    config.write_text(f"# deploy's format\napi-key: {json.dumps(API_KEY)}\n")
    os.chmod(config, 0o600)
    port = free_port()
    proc = _serve(standin, ["--model-path", "/models/m", "--host", "127.0.0.1", "--port",
                            str(port), "--config", str(config)], tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while http_status(f"{base}/health") != 200:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert http_status(f"{base}/v1/models") == 401
        assert http_status(f"{base}/v1/models", "wrong-key") == 401
        assert http_status(f"{base}/v1/models", API_KEY) == 200
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        assert API_KEY not in cmdline and str(config) in cmdline
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)


@pytest.mark.parametrize("name, text, code, message", [
    ("c.yaml", 'api_key: "x"\n', 2, "unrecognized arguments: --api_key x"),
    ("c.txt", 'api-key: "x"\n', 1, "Config file must be YAML format, got: .txt"),
    ("c.yaml", "api-key: [a, b]\n", 1, "not in the subset read here"),
    ("c.yaml", "- a\n", 1, "not a `key: value` line"),
])
def test_standin_refuses_a_config_the_way_the_pinned_code_does(standin: str, tmp_path: Path,
                                                               name, text, code, message) -> None:
    config = tmp_path / name
    config.write_text(text)
    res = subprocess.run([standin, "-m", "sglang.launch_server", "--model-path", "/m",
                          "--config", str(config)], capture_output=True, text=True, timeout=60,
                         cwd="/", env={"PATH": os.environ["PATH"]})
    assert res.returncode == code and message in res.stderr, res.stderr[-2000:]


def test_standin_merges_config_like_prepare_server_args(pinned_base, tmp_path: Path) -> None:
    """CLI > config > defaults; one --config only; the pinned merger, not a copy."""
    from sglang_standin import derive
    spec = derive.load(str(pinned_base.repo / "python/sglang")).server_args
    assert spec.config_step is not None and spec.config_step[0] == "--config"
    config = tmp_path / "c.yaml"
    config.write_text(f"api-key: {json.dumps(API_KEY)}\nadmin-api-key: \"a-k\"\ntp-size: 2\n")
    values = spec.parse(["--model-path", "/m", "--config", str(config), "--tp-size", "4"])
    assert (values["api_key"], values["admin_api_key"], values["tp_size"]) == (API_KEY, "a-k", 4)
    values = spec.parse(["--model-path", "/m", "--api-key", "from-cli", "--config", str(config)])
    assert values["api_key"] == "from-cli"
    with pytest.raises(ValueError, match="Multiple config files"):
        spec.parse(["--model-path", "/m", "--config", str(config), "--config", str(config)])
