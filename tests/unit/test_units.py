"""Unit rendering without a host: schema, systemd escaping, gates per role, the runner's
pieces, and the deploy library against a scripted channel."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from patchset.agent.lib.records import Event
from patchset.deploy import deploy as dep
from patchset.connect.local import LocalTransport
from patchset import transport as wire
from patchset.agent.lib import wire as agentwire
from tests.faketransport import FakeTransport
from patchset.connect import settings
from patchset.deploy import units
from patchset.agent import deployer
from patchset.connect.inventory import Host, load
from patchset.agent import engine
from patchset.agent.lib import staleness
from patchset.cli import DeployView, main
from patchset.errors import ManifestError, TargetError, UsageError

SHA = {"chat-a": "a" * 64, "idx-c": "c" * 64, "dsv4-b": "b" * 64, "both-g": "d" * 64}
APPLIED = [
    {"name": "chat-a", "sha256": SHA["chat-a"], "path": "both", "gate": None},
    {"name": "dsv4-b", "sha256": SHA["dsv4-b"], "path": "prefill",
     "gate": {"env": "PREFILL_FAST", "on": "1"}},
    {"name": "idx-c", "sha256": SHA["idx-c"], "path": "decode",
     "gate": {"env": "TRITON_INDEXER", "on": "1"}},
    {"name": "both-g", "sha256": SHA["both-g"], "path": "both",
     "gate": {"env": "MMA_FLASHMLA", "on": "1"}},
]


def host(**roles) -> Host:
    base = {"prefill": {"gpus": "0,1,2,3", "port": 30000},
            "decode": {"gpus": "4,5,6,7", "port": 30001},
            "router": {"port": 8000}}
    base.update(roles)
    return Host(name="gpu1", address="10.0.0.5", python="/opt/venv/bin/python",
                tree="/opt/sglang", roles={k: v for k, v in base.items() if v is not None},
                serving={"model_path": "/models/DeepSeek-V4", "transfer_backend": "nixl"})


def rendered(h: Host | None = None, applied=APPLIED, layout: str = "git") -> dict:
    h = h or host()
    return units.render(h, units.resolve(h, [r for r in settings.ROLES if r in h.roles],
                                         "/opt/sglang", {"applied": applied}, layout))


# ---------------------------------------------------------------- systemd escaping

NASTY_ENV = ["plain", "two words", "dollar $HOME and ${X}", 'a "quoted" word', "back\\slash",
             "it's", "`tick`", "#not a comment", "a=b=c", "tab\there", "", "ünïcødé",
             "trailing space ", " leading", "semi;colon", "%percent%n", "\\\"$`"]


@pytest.mark.parametrize("value", NASTY_ENV)
def test_env_values_round_trip_through_systemds_parser(value: str) -> None:
    text = f"# c\nK={settings.env_value(value)}\n"
    assert units.parse_env_file(text) == {"K": value}


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\0b", "a\x1bb"])
def test_env_values_with_newlines_or_control_characters_are_refused(value: str) -> None:
    with pytest.raises(settings.SettingError, match="no newlines or control characters"):
        settings.env_value(value)


def test_exec_words_escape_specifiers_and_quote_spaces() -> None:
    assert settings.exec_line(["/opt/venv/bin/python", "-m", "x", "--a", "50%", "$HOME",
                            "two words"]) == (
        '/opt/venv/bin/python -m x --a 50%% "$$HOME" "two words"')
    for bad in ['a"b', "a'b", "a\\b", "a\nb", ";", ""]:
        with pytest.raises(settings.SettingError):
            settings.exec_word(bad)


# ---------------------------------------------------------------- the schema

def test_settings_schema_refuses_with_the_key_path() -> None:
    cases = [
        ("prefill", {"gpus": "0;1"}, ("gpus",), "GPU list"),
        ("prefill", {"port": 70000}, ("port",), "TCP port"),
        ("decode", {"bootstrap_port": 8998}, ("bootstrap_port",), "unknown key"),
        ("router", {"gpus": "0"}, ("gpus",), "unknown key"),
        ("decode", {"extra_args": "--foo bar"}, ("extra_args",), "must be a list"),
        ("decode", {"extra_args": ["--x", 'it"s']}, ("extra_args", 1), "contains a quote"),
        ("decode", {"extra_args": ["--x", "a\nb"]}, ("extra_args", 1), "a newline"),
        ("decode", {"env": {"A": "x\ny"}}, ("env", "A"), "no newlines"),
        ("decode", {"env": {"1A": "x"}}, ("env", "1A"), "not an environment variable"),
        ("decode", {"env": {"CUDA_VISIBLE_DEVICES": "0"}}, ("env", "CUDA_VISIBLE_DEVICES"),
         "set by deploy"),
        ("decode", {"env": {"A": True}}, ("env", "A"), "quote it"),
        ("decode", {"timeout_start_sec": 600}, ("timeout_start_sec",), ">= 1800"),
        ("decode", {"limit_nofile": 1024}, ("limit_nofile",), ">= 65535"),
        ("decode", {"model_path": "/m/x y"}, ("model_path",), "model path"),
        ("router", {"prefill": ["ftp://x"]}, ("prefill", 0), "URL"),
        (None, {"port": 1}, ("port",), "unknown key"),
    ]
    for role, given, path, message in cases:
        with pytest.raises(settings.SettingError, match=message) as info:
            settings.check_settings(role, given)
        assert info.value.path == path, (role, given)
    good = settings.check_settings("prefill", {"gpus": "0,1", "port": 30000, "tp": 2,
                                            "extra_args": ["--mem-fraction-static", 0.85],
                                            "env": {"NCCL_DEBUG": "WARN", "N": 1}})
    assert good["extra_args"] == ["--mem-fraction-static", "0.85"]
    assert good["env"] == {"NCCL_DEBUG": "WARN", "N": "1"}


def test_role_settings_take_every_default_from_the_schema() -> None:
    """RoleSettings has one attribute per SCHEMA key, and a setting nobody gave is the
    schema's default (the router's own where it has one), or derived from another one
    (tp, health_timeout): deploy/units.py restates none of them."""
    fields = {f.name for f in dataclasses.fields(settings.RoleSettings)}
    assert fields == {"role", *settings.SCHEMA}
    for role in settings.ROLES:
        got = settings.RoleSettings.of(role, {}, {})
        for key, spec in settings.SCHEMA.items():
            if key not in ("tp", "health_timeout", "extra_args"):
                assert getattr(got, key) == spec.default_for(role), (role, key)
        assert got.extra_args == () and got.health_timeout == got.timeout_start_sec
    assert settings.RoleSettings.of("router", {}, {}).host == "0.0.0.0"
    decode = settings.RoleSettings.of("decode", {"tp": 8, "trace": False, "env": {"A": "1"}},
                                      {"gpus": "4,5", "env": {"B": "2"}})
    assert (decode.tp, decode.trace, decode.env) == (8, False, {"A": "1", "B": "2"})
    assert settings.RoleSettings.of("decode", {}, {"gpus": "4,5"}).tp == 2
    router = settings.RoleSettings.of("router", {"tp": 8, "pythonpath": False}, {})
    assert router.tp is None and router.pythonpath is True       # the servers' settings
    source = (Path(units.__file__)).read_text("utf-8")
    assert "settings.get(" not in source and "settings[" not in source


INVENTORY = """\
version: 1
hosts:
  gpu1:
    address: 10.0.0.5
    python: /opt/venv/bin/python
    tree: /opt/sglang
    serving:
      model_path: /models/DeepSeek-V4
      env: {NCCL_DEBUG: WARN}
    roles:
      prefill: {gpus: "0,1,2,3", port: 30000, bootstrap_port: 8998}
      decode:
        gpus: "4,5,6,7"
        port: 30001
        extra_args: [--mem-fraction-static, "0.85", %s]
      router: {port: 8000}
"""


def test_inventory_refuses_a_quote_in_a_unit_value_with_file_line_field(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(INVENTORY % '"--chat-template=x\'y"')
    with pytest.raises(ManifestError) as info:
        load(path)
    assert info.value.field == "hosts.gpu1.roles.decode.extra_args[2]"
    assert info.value.line == 15 and "contains a quote" in str(info.value)
    path.write_text(INVENTORY % '"--x"')
    inv = load(path)
    assert inv.hosts["gpu1"].serving["env"] == {"NCCL_DEBUG": "WARN"}
    path.write_text(INVENTORY.replace("NCCL_DEBUG: WARN", 'NCCL_DEBUG: "a\\nb"') % '"--x"')
    with pytest.raises(ManifestError, match=r"hosts\.gpu1\.serving\.env\.NCCL_DEBUG: .*newline"):
        load(path)


# ---------------------------------------------------------------- resolving and rendering

def test_gates_go_only_to_the_roles_whose_patches_run_there() -> None:
    out = rendered()
    env = {r: units.parse_env_file(out[r].env_text) for r in out}
    assert env["prefill"]["PREFILL_FAST"] == "1" and "TRITON_INDEXER" not in env["prefill"]
    assert env["decode"]["TRITON_INDEXER"] == "1" and "PREFILL_FAST" not in env["decode"]
    assert env["prefill"]["MMA_FLASHMLA"] == env["decode"]["MMA_FLASHMLA"] == "1"
    assert env["router"] == {}
    assert env["decode"]["PATCHSET_PATCHES"] == (
        f"chat-a:{'a' * 12} idx-c:{'c' * 12} both-g:{'d' * 12}")
    assert env["decode"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert env["decode"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["decode"]["SPT_NOENV"] == env["prefill"]["SPT_NOENV"] == "1"   # audit reads children
    assert env["decode"]["PYTHONPATH"] == f"{units.TRACE_HOME}:/opt/sglang/python"
    assert "# gate of idx-c (applied, runs in decode)\nTRITON_INDEXER=1\n" in out["decode"].env_text
    assert units.patches_value(APPLIED, "decode") == " ".join(staleness.role_patch_ids(APPLIED, "decode"))


def test_units_have_the_production_essentials() -> None:
    out = rendered()
    for role, r in out.items():
        text = r.unit_text
        lines = text.splitlines()
        assert f"EnvironmentFile=/etc/sglang/{role}.env" in lines
        assert int(next(l for l in lines if l.startswith("TimeoutStartSec="))
                   .split("=")[1]) >= 1800
        assert int(next(l for l in lines if l.startswith("LimitNOFILE=")).split("=")[1]) >= 65535
        assert "Restart=on-failure" in lines and not any(l.startswith("KillMode=") for l in lines)
        assert "WantedBy=multi-user.target" in lines
        assert not any("#" in l and not l.startswith("#") for l in lines)   # no trailing comments
    prefill = out["prefill"].unit_text
    assert ("ExecStart=/opt/venv/bin/python -m sglang.launch_server --model-path "
            "/models/DeepSeek-V4 --disaggregation-mode prefill --host 127.0.0.1 --port 30000 "
            "--tp-size 4 --disaggregation-transfer-backend nixl "
            "--disaggregation-bootstrap-port 8998\n") in prefill
    assert "X-Patchset-Tree=/opt/sglang\n" in prefill
    router = out["router"].unit_text
    assert ("ExecStart=/opt/venv/bin/python -m sglang_router.launch_router --pd-disaggregation "
            "--prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30001 "
            "--host 0.0.0.0 --port 8000\n") in router
    assert "X-Patchset-Tree" not in router and "sglang-prefill.service" in router


def test_role_settings_override_serving_and_wheel_trees_import_from_the_root() -> None:
    h = host(decode={"gpus": "4,5", "port": 30001, "tp": 1, "model_path": "/m2",
                     "host": "0.0.0.0", "env": {"NCCL_DEBUG": "INFO"},
                     "extra_args": ["--chat-template", "my template.jinja", "--x=50%"]},
             router={"port": 8000, "prefill": [{"url": "http://10.0.0.9:30000",
                                                "bootstrap_port": 9000}],
                     "decode": ["http://10.0.0.10:30001"]})
    h = Host(**{**h.__dict__, "serving": dict(h.serving, env={"NCCL_DEBUG": "WARN", "X": "1"})})
    out = rendered(h, layout="wheel")
    decode = out["decode"].unit_text
    assert "--model-path /m2" in decode and "--tp-size 1" in decode
    assert '--chat-template "my template.jinja" --x=50%%' in decode
    env = units.parse_env_file(out["decode"].env_text)
    assert env["NCCL_DEBUG"] == "INFO" and env["X"] == "1"
    assert env["PYTHONPATH"] == f"{units.TRACE_HOME}:/opt/sglang"
    assert ("--prefill http://10.0.0.9:30000 9000 --decode http://10.0.0.10:30001"
            in out["router"].unit_text)


def test_an_inventory_env_may_turn_a_gate_off_and_deploy_says_so() -> None:
    h = host(decode={"gpus": "4", "port": 30001, "env": {"TRITON_INDEXER": "0"}})
    u = units.resolve(h, ["decode"], "/opt/sglang", {"applied": APPLIED}, "git")["decode"]
    assert u.env["TRITON_INDEXER"] == "0"
    assert u.notes == [("gate TRITON_INDEXER of idx-c is set to '0' by hosts.yaml (the patch "
                        "is applied but gated off)")]


def test_render_time_refusals_name_what_to_fix() -> None:
    cases = [
        (host(decode={"gpus": "4", "port": 30001, "extra_args": ["--port", "1"]}),
         APPLIED, "--port is rendered by deploy"),
        (host(decode={"port": 30001}), APPLIED, r"roles\.decode\.gpus is required"),
        (host(prefill=None, router={"port": 8000}), APPLIED,
         r"roles\.router\.prefill is required"),
        (host(), [{"name": "x;rm", "sha256": "a" * 64, "path": "both"}],
         "not a valid patch record"),
        (host(), [dict(APPLIED[2], name="idx-c"), dict(APPLIED[2], name="idx-z",
                                                          gate={"env": "TRITON_INDEXER",
                                                                "on": "2"})],
         "gate on TRITON_INDEXER with different values"),
        (host(), [dict(APPLIED[2], gate={"env": "A", "on": "x\ny"})], "is not a plain gate value"),
    ]
    for h, applied, message in cases:
        with pytest.raises(UsageError, match=message):
            rendered(h, applied)
    h = Host(**{**host().__dict__, "python": "python3"})
    with pytest.raises(UsageError, match="python must be an absolute path"):
        rendered(h)
    h = Host(**{**host().__dict__, "serving": {}})
    with pytest.raises(UsageError, match=r"model_path is required .*or hosts\.gpu1\.serving"):
        rendered(h)


def test_rendered_units_pass_systemd_analyze_verify_silently(tmp_path: Path) -> None:
    h = Host(**{**host().__dict__, "python": "/usr/bin/env"})
    for r in rendered(h).values():
        (tmp_path / r.unit).write_text(r.unit_text)
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no",
                           *map(str, sorted(tmp_path.iterdir()))],
                          capture_output=True, text=True, check=False)
    ours = [l for l in (proc.stdout + proc.stderr).splitlines() if "sglang-" in l]
    assert ours == []


# ---------------------------------------------------------------- the runner's pieces

def test_line_sink_splits_events_result_and_noise() -> None:
    got: list[Event] = []
    sink = wire.LineSink(got.append)
    line = json.dumps(Event(event="wait", role="decode", elapsed=1.0).to_json())
    sink.write(line[:10])
    sink.write(line[10:] + '\nnoise\n{"event": "wait", "rol": 1}\n{"result": {"ok": true}}')
    sink.close()
    assert got == [Event(event="wait", role="decode", elapsed=1.0)]    # a typed record
    assert sink.result == {"ok": True}
    assert sink.other == ["noise", '{"event": "wait", "rol": 1}']      # not an event of ours


def test_events_survive_a_closed_stdout() -> None:
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    events = deployer.Events(Closed())
    events("step", message="x")
    events("step", message="y")
    assert events.alive is False


def test_unit_facts_find_the_units_serving_a_tree(tmp_path: Path, monkeypatch) -> None:
    tree = tmp_path / "tree"
    (tree / "python" / "sglang").mkdir(parents=True)
    (tree / ".patchset").mkdir()
    (tree / ".patchset" / "state.json").write_text(json.dumps(
        {"format": 1, "applied": APPLIED}))
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    (unit_dir / "sglang-decode.service").write_text(
        f"[Service]\nX-Patchset-Role=decode\nX-Patchset-Tree={tree}\n")
    (unit_dir / "other.service").write_text("[Service]\nX-Patchset-Tree=/elsewhere\n")
    monkeypatch.setenv("PATCHSET_UNIT_DIR", str(unit_dir))
    monkeypatch.setenv("PATH", str(tmp_path))            # no systemctl: nothing is running
    target = engine.Target(str(tree), "python/", "sglang")
    [fact] = engine.unit_facts(target, target.state())
    assert fact.unit == "sglang-decode.service" and fact.role == "decode"
    assert fact.stale is False and fact.main_pid == 0
    assert fact.patches == units.patches_value(APPLIED, "decode")


# ---------------------------------------------------------------- the library, scripted

class ScriptedChannel(FakeTransport):
    """Answers the agent's unit ops from a script; records the requests."""

    def __init__(self, facts: dict, deploy: dict | None = None, root: bool = True) -> None:
        super().__init__("gpu1")
        self.facts, self.deploy, self.root = facts, deploy, root

    def answer(self, request: dict, on_event=None) -> dict:
        if request["op"] == "facts":
            return dict(self.facts, root=self.root or self.sudo) if self.facts.get("ok") \
                else self.facts
        for event in self.deploy.pop("events", []):
            on_event(Event(**event))
        return self.deploy


def facts(installed: dict | None = None, applied=APPLIED, active: str = "active") -> dict:
    installed = installed or {}
    return {"ok": True, "systemd": True,
            "tree": {"root": "/opt/sglang", "layout": "git", "managed": True,
                     "state_sha256": "s" * 64, "applied": applied, "updated": "x"},
            "roles": {r: {"unit_text": installed.get(r, (None, None))[0],
                          "env_text": installed.get(r, (None, None))[1],
                          "systemd": {"ActiveState": active}, "stale": False}
                      for r in settings.ROLES}}


def test_dry_run_shows_the_diff_and_what_would_restart() -> None:
    now = rendered()
    installed = {"prefill": (now["prefill"].unit_text, now["prefill"].env_text),
                 "decode": (now["decode"].unit_text, now["decode"].env_text.replace(
                     "TRITON_INDEXER=1", "TRITON_INDEXER=0"))}
    channel = ScriptedChannel(facts(installed))
    result = dep.deploy_units(host(), channel, "/opt/sglang", dry_run=True)
    assert result.ok and result.dry_run and [r.role for r in result.roles] == list(settings.ROLES)
    by = {r.role: r for r in result.roles}
    assert not by["prefill"].changed and by["prefill"].restart is None and by["prefill"].diff == ""
    assert by["decode"].changed and "-TRITON_INDEXER=0\n+TRITON_INDEXER=1\n" in by["decode"].diff
    assert by["router"].diff.startswith("--- /dev/null\n+++ b/etc/systemd/system/sglang-router")
    assert [r["op"] for r in channel.requests] == ["facts"]


def test_a_failed_unit_is_reported_with_its_journal_and_the_rollback() -> None:
    failed = {"ok": True, "deployed": False, "changed": True,
              "actions": {"prefill": ["installed", "restarted"], "decode": ["installed",
                                                                            "restarted"],
                          "router": []},
              "restart_reasons": {"prefill": "unit or env file changed",
                                  "decode": "unit or env file changed"},
              "failed": {"role": "decode", "unit": "sglang-decode.service",
                         "reason": "sglang-decode.service did not report healthy at "
                                   "http://127.0.0.1:30001/health within 5s (last: HTTP 503)",
                         "journal": ["line one", "line two"]},
              "rollback": [{"role": "prefill", "unit": "sglang-prefill.service",
                            "action": "restarted with the previous files", "healthy": True},
                           {"role": "decode", "unit": "sglang-decode.service",
                            "action": "restarted with the previous files", "healthy": True}],
              "events": [{"event": "wait", "role": "decode", "elapsed": 1, "timeout": 5}]}
    seen = []
    result = dep.deploy_units(host(), ScriptedChannel(facts(), failed), "/opt/sglang", timeout=5,
                        on_event=seen.append)
    assert not result.ok and result.exit_code == 4 and seen
    assert "within 5s (last: HTTP 503); rolled back: previous unit files restored, " \
           "sglang-prefill.service restarted with the previous files" in result.error
    assert result.details == ("last journal lines of sglang-decode.service:\n  line one\n"
                              "  line two")


def test_a_non_root_login_reads_and_deploys_through_sudo() -> None:
    channel = ScriptedChannel(facts(), root=False)
    dep.deploy_units(host(), channel, "/opt/sglang", dry_run=True)
    assert channel.sudo is True and len(channel.requests) == 2


def test_bad_settings_fail_before_the_host_is_contacted() -> None:
    channel = ScriptedChannel(facts())
    with pytest.raises(UsageError, match="--role 'gpu'"):
        dep.deploy_units(host(), channel, "/opt/sglang", roles=["gpu"])
    with pytest.raises(UsageError, match="--port is rendered by deploy"):
        dep.deploy_units(host(decode={"gpus": "4", "port": 1, "extra_args": ["--port=2"]}), channel,
                   "/opt/sglang")
    assert channel.requests == []
    missing = facts()
    missing["tree"] = None
    with pytest.raises(TargetError, match="no SGLang tree at /opt/sglang"):
        dep.deploy_units(host(), ScriptedChannel(missing), "/opt/sglang")


def test_affected_roles_are_those_whose_patches_or_gates_changed() -> None:
    now = rendered()
    before = rendered(applied=[a for a in APPLIED if a["name"] != "idx-c"])
    installed = {"prefill": (before["prefill"].unit_text, before["prefill"].env_text),
                 "decode": (before["decode"].unit_text, before["decode"].env_text)}
    roles, _ = dep.affected_roles(host(), ScriptedChannel(facts(installed)), "/opt/sglang")
    assert roles == ["decode"]
    gate_off = rendered(applied=[dict(a, gate=None) if a["name"] == "both-g" else a
                                 for a in APPLIED])
    installed = {r: (gate_off[r].unit_text, gate_off[r].env_text) for r in ("prefill", "decode")}
    roles, _ = dep.affected_roles(host(), ScriptedChannel(facts(installed)), "/opt/sglang")
    assert roles == ["prefill", "decode"]
    installed = {r: (now[r].unit_text, now[r].env_text) for r in ("prefill", "decode")}
    assert dep.affected_roles(host(), ScriptedChannel(facts(installed)), "/opt/sglang")[0] == []
    off = host(decode={"gpus": "4,5,6,7", "port": 30001, "env": {"TRITON_INDEXER": "0"}})
    gated = rendered(off)
    installed = {r: (gated[r].unit_text, gated[r].env_text) for r in ("prefill", "decode")}
    assert dep.affected_roles(off, ScriptedChannel(facts(installed)), "/opt/sglang")[0] == []


def test_deploy_view_prints_plain_lines_when_piped(capsys) -> None:
    view = DeployView()
    view.tty = False
    view.PLAIN_EVERY = 10
    for ev in ({"event": "restart", "role": "decode", "unit": "u", "reason": "r"},
               {"event": "wait", "role": "decode", "url": "http://h/health", "elapsed": 0,
                "timeout": 60, "detail": "starting"},
               {"event": "wait", "role": "decode", "elapsed": 4, "timeout": 60, "detail": "x"},
               {"event": "wait", "role": "decode", "elapsed": 11, "timeout": 60,
                "detail": "HTTP 503"},
               {"event": "healthy", "role": "decode", "elapsed": 12.04, "timeout": 60}):
        view.event(Event(**ev))
    assert capsys.readouterr().err.splitlines() == [
        "decode: restarting u (r)", "decode: waiting for http://h/health (timeout 60s)",
        "decode: still waiting after 11s (HTTP 503)", "decode: healthy after 12.0s"]


def test_deploy_cli_refuses_an_unknown_role_with_exit_2(series_dir: Path, patchset_home: Path,
                                                       monkeypatch, capsys) -> None:
    monkeypatch.chdir(series_dir)
    (series_dir / "hosts.yaml").write_text(INVENTORY % '"--x"')
    code = main(["deploy", "gpu1", "--role", "gpu"])
    assert code == 2 and "--role 'gpu': expected one of prefill, decode, router" in \
        capsys.readouterr().err
    assert main(["deploy", "nohost.example", "--dry-run"]) == 2
    assert "no roles in hosts.yaml" in capsys.readouterr().err


def test_deploy_view_draws_a_bar_on_a_terminal(capsys) -> None:
    view = DeployView()
    view.tty = True
    with view:
        view.event(Event(event="wait", role="decode", url="u", elapsed=0, timeout=9,
                         detail="starting"))
        assert view.bar is not None
        view.event(Event(event="wait", role="decode", elapsed=3, timeout=9, detail="HTTP 503"))
        assert view.bar.tasks[0].completed == 3
        view.event(Event(event="healthy", role="decode", elapsed=3.5, timeout=9))
        assert view.bar is None
    assert "decode: healthy after 3.5s" in capsys.readouterr().err


def test_the_runner_ships_as_a_bundle_and_reads_facts(tmp_path: Path) -> None:
    """The bundle path: bootstrap, the shipped engine next to the runner, JSON lines back."""
    tree = tmp_path / "tree"
    (tree / "sglang").mkdir(parents=True)
    unit = tmp_path / "sglang-decode.service"
    unit.write_text("[Service]\n")
    request = agentwire.FactsRequest(
        tree=str(tree), roles={"decode": {"unit": "sglang-decode.service",
                                          "unit_path": str(unit),
                                          "env_path": str(tmp_path / "decode.env")}})
    result = LocalTransport(tree, in_process=False).call(request)
    assert isinstance(result, agentwire.FactsResult) and result.tree["layout"] == "wheel"
    assert result.tree["managed"] is False and result.interrupted is None
    assert result.roles["decode"]["unit_text"] == "[Service]\n"
    assert result.roles["decode"]["env_text"] is None

    @dataclass
    class Nope(agentwire.FactsRequest):
        op: ClassVar[str] = "nope"

    bad = LocalTransport(tree, in_process=False).call(Nope(**vars(request)))
    assert bad == agentwire.Failure("usage", "unknown op 'nope'")


TRACES = {f"idx-c:{'c' * 12}": [
    {"module": "sglang.srt.layers.idx", "qualname": "Backend.forward.<locals>.kernel_call",
     "kind": "function", "evidence": "new"},
    {"module": "sglang.srt.layers.idx", "qualname": "_triton_kernel", "kind": "kernel"},
    {"module": "sglang.srt.layers.idx", "qualname": "<module>", "kind": "module"}]}


def test_the_tracer_is_on_by_default_with_the_host_derived_targets() -> None:
    """Each role's env gets PATCHSET_TRACE (the targets of every applied patch, each
    marked with what its call shows: `+` the patch's own function, `!` a compiled kernel;
    then the server's forward entry), its records dir and the tracer
    first on PYTHONPATH; the unit gets a root-only RuntimeDirectory for the records."""
    h = host()
    out = units.render(h, units.resolve(h, ["prefill", "decode"], "/opt/sglang",
                                        {"applied": APPLIED, "trace": TRACES}, "git"))
    env = {r: units.parse_env_file(out[r].env_text) for r in out}
    decode = env["decode"]["PATCHSET_TRACE"].split()
    assert decode[0] == (f"idx-c:{'c' * 12}=+sglang.srt.layers.idx:Backend.forward.<locals>."
                         "kernel_call,!sglang.srt.layers.idx:_triton_kernel,"
                         "sglang.srt.layers.idx:<module>")
    assert decode[-1] == f"{units.FORWARD}=" + ",".join(units.FORWARD_ENTRIES)
    # every role watches every applied patch: a path tag is checked against what ran
    assert env["prefill"]["PATCHSET_TRACE"] == env["decode"]["PATCHSET_TRACE"]
    assert env["decode"]["PATCHSET_TRACE_DIR"] == f"{units.TRACE_RUN}/decode"
    assert "RuntimeDirectory=patchset-trace/decode\nRuntimeDirectoryMode=0700\n" in \
        out["decode"].unit_text
    from patchset.agent.lib import tracer
    parsed = tracer.parse(env["decode"]["PATCHSET_TRACE"])
    assert parsed[("sglang.srt.layers.idx", "<module>")] == [f"idx-c:{'c' * 12}"]
    assert parsed[("!sglang.srt.layers.idx", "_triton_kernel")] == [f"idx-c:{'c' * 12}"]


def test_trace_false_renders_no_tracer() -> None:
    h = host(decode={"gpus": "4,5,6,7", "port": 30001, "trace": False})
    out = units.render(h, units.resolve(h, ["prefill", "decode"], "/opt/sglang",
                                        {"applied": APPLIED, "trace": TRACES}, "git"))
    env = units.parse_env_file(out["decode"].env_text)
    assert "PATCHSET_TRACE" not in env and "PATCHSET_TRACE_DIR" not in env
    assert env["PYTHONPATH"] == "/opt/sglang/python"
    assert "RuntimeDirectory" not in out["decode"].unit_text
    assert "PATCHSET_TRACE" in units.parse_env_file(out["prefill"].env_text)


def test_a_bad_trace_target_from_the_host_is_refused() -> None:
    bad = {f"idx-c:{'c' * 12}": [{"module": "x y", "qualname": "f", "kind": "function"}]}
    with pytest.raises(UsageError, match="trace target"):
        units.resolve(host(), ["decode"], "/opt/sglang", {"applied": APPLIED, "trace": bad},
                      "git")


def test_the_tracer_directory_is_made_root_only_and_a_link_is_refused(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """It is first on a root server's PYTHONPATH: a group- or world-writable directory (or
    file) there would be code run as root, a link would point anywhere."""
    import os
    import stat

    from patchset.agent.lib import tracer
    home = tmp_path / "lib" / "patchset" / "trace"
    home.mkdir(parents=True)
    os.chmod(home, 0o777)
    os.chmod(home.parent, 0o777)
    (home / "patchset_tracer.py").write_text("print('planted')\n")
    os.chmod(home / "patchset_tracer.py", 0o666)
    monkeypatch.setattr(tracer, "HOME", str(home))
    monkeypatch.setattr(deployer, "_root_only_dirs",
                        lambda path, top=str(tmp_path / "lib"), real=deployer._root_only_dirs:
                        real(path, top))
    deployer.install_tracer()
    for d in (home, home.parent):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o755 and os.lstat(d).st_uid == 0
    installed = home / "patchset_tracer.py"
    assert installed.read_text() == Path(tracer.__file__).read_text()
    assert stat.S_IMODE(installed.stat().st_mode) == 0o644
    link = tmp_path / "lib" / "evil"
    link.symlink_to(tmp_path)
    monkeypatch.setattr(tracer, "HOME", str(link / "trace"))
    with pytest.raises(deployer.EngineError, match="symbolic link"):
        deployer.install_tracer()
    assert not (tmp_path / "trace").exists()
