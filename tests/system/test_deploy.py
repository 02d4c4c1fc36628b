"""`patchset deploy`, `apply --restart` and stale units, on real nspawn hosts (real systemd,
real sshd) running the stand-in SGLang server (tests/standin/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from patchset.connect import settings
from patchset.deploy import units
from tests.hosts.nspawn import TestHost, run_ssh
from tests.standin.install import install_standin
from tests.hostutil import cli, free_ports, http_status, on_host

pytestmark = pytest.mark.hosts

TREE = "/opt/sglang"
VENV = "/opt/venv"
PYTHON = f"{VENV}/bin/python"
UNITS = [f"sglang-{r}.service" for r in settings.ROLES]
NASTY = 'two words, a "quote", $HOME, `tick`, back\\slash and 50%'
API_KEY = 'k3y with "q" $HOME %d back\\slash'       # only ever in /etc/sglang/ROLE.secrets.yaml
ADMIN_KEY = "adm1n-k3y-for-decode"
HF_TOKEN = "hf_DeployTestTokenAbCdEf123"








@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return dict(zip(settings.ROLES, free_ports(3)))


@pytest.fixture()
def deploy_env(one_host: TestHost, series_dir: Path, patchset_home: Path, monkeypatch,
               tmp_path: Path, known_hosts_file, ports: dict[str, int]):
    """A host with no sglang units, the tree at `selection`, the stand-in venv; returns a
    function that writes hosts.yaml with the given role settings (merged over defaults)."""
    monkeypatch.chdir(series_dir)
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(ssh_config))
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(known_hosts_file([one_host])))
    reset_units(one_host)

    def write(roles: dict | None = None, serving: dict | None = None, **extra) -> Path:
        base = {"prefill": {"gpus": "0,1", "port": ports["prefill"],
                            "bootstrap_port": ports["prefill"] + 1000},
                "decode": {"gpus": "2,3", "port": ports["decode"]},
                "router": {"port": ports["router"], "host": "127.0.0.1"}}
        for role, given in (roles or {}).items():
            base[role] = None if given is None else {**base[role], **given}
        host = {"address": one_host.ip, "port": one_host.port, "user": "root",
                "identity_file": str(one_host.client_key), "tree": TREE, "python": PYTHON,
                "serving": {"model_path": "/models/DeepSeek-V4-Flash", "transfer_backend":
                            "fake", "env": {"NASTY": NASTY}, **(serving or {})},
                "roles": {r: s for r, s in base.items() if s is not None}, **extra}
        path = series_dir / "hosts.yaml"
        path.write_text(yaml.safe_dump({"version": 1, "default": one_host.name,
                                        "hosts": {one_host.name: host}}, sort_keys=False))
        return path
    return write


def reset_units(host: TestHost) -> None:
    on_host(host, "systemctl disable --now " + " ".join(UNITS) + " >/dev/null 2>&1; "
            "rm -f /etc/systemd/system/sglang-*.service; rm -rf /etc/sglang /var/lib/patchset; "
            "systemctl daemon-reload; systemctl reset-failed; true")


def prepare_tree(host: TestHost, capsys, *selection: str) -> None:
    """The tree at `selection` (apply is declarative: an earlier test's tree is fine), with
    the stand-in venv importing it."""
    code, _, err = cli(capsys, "apply", *selection, host.name)
    assert code == 0, err
    install_standin(host, venv=VENV, tree=TREE)


def main_pid(host: TestHost, unit: str) -> int:
    return int(on_host(host, f"systemctl show -p MainPID --value {unit}").strip())


def proc_cmdline(host: TestHost, pid: int) -> list[str]:
    raw = on_host(host, f"tr '\\0' '\\n' < /proc/{pid}/cmdline")
    return raw.rstrip("\n").split("\n")


def proc_environ(host: TestHost, pid: int) -> dict[str, str]:
    raw = on_host(host, f"python3 -c 'import sys, json; print(json.dumps(dict(x.split(\"=\", 1) "
                  f"for x in open(\"/proc/{pid}/environ\", \"rb\").read().decode()"
                  f".split(\"\\0\") if \"=\" in x)))'")
    return json.loads(raw)


def all_cmdlines(host: TestHost) -> list[str]:
    """/proc/PID/cmdline of every process on the host, NULs as spaces."""
    script = ("import os\nfor p in os.listdir(\"/proc\"):\n    if p.isdigit():\n        try:\n"
              "            print(open(\"/proc/\" + p + \"/cmdline\", \"rb\").read().replace("
              "b\"\\0\", b\" \").decode(errors=\"replace\"))\n        except OSError:\n"
              "            pass\n")
    return on_host(host, f"python3 -c '{script}'").splitlines()


def exec_argv(unit_text: str) -> list[str]:
    """ExecStart= as systemd splits it (the subset the templates write)."""
    import shlex
    line = next(l for l in unit_text.splitlines() if l.startswith("ExecStart="))
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line[len("ExecStart="):])]


def files_on(host: TestHost) -> dict[str, str | None]:
    """The unit and env files of every role on the host (None: absent), in one ssh call."""
    paths = [p for role, unit in zip(settings.ROLES, UNITS)
             for p in (f"/etc/systemd/system/{unit}", f"/etc/sglang/{role}.env")]
    script = ("import json, os, sys; print(json.dumps({p: open(p).read() if os.path.exists(p) "
              "else None for p in sys.argv[1:]}))")
    return json.loads(on_host(host, f"python3 -c '{script}' " + " ".join(paths)))


# ---------------------------------------------------------------- deploy

def test_deploy_all_roles_runs_exactly_what_was_rendered(one_host: TestHost, deploy_env,
                                                         capsys, ports) -> None:
    deploy_env(serving={"api_key": API_KEY},
               roles={"decode": {"admin_api_key": ADMIN_KEY, "env": {"HF_TOKEN": HF_TOKEN}}})
    prepare_tree(one_host, capsys, "--tier", "moderate")   # chat-a, dsv4-b (prefill), idx-c
    code, out, err = cli(capsys, "deploy", one_host.name, "--dry-run")
    assert code == 0, err
    for secret in (API_KEY, ADMIN_KEY, HF_TOKEN):
        assert secret not in out + err
    assert '+api-key: "<redacted>"' in out and "+HF_TOKEN=<redacted>" in out
    assert "+++ b/etc/systemd/system/sglang-decode.service" in out
    assert f"{one_host.name}: decode sglang-decode.service: would install and restart" in out
    assert files_on(one_host) == dict.fromkeys(files_on(one_host))        # nothing installed

    code, out, err = cli(capsys, "deploy", one_host.name, "--json")
    assert code == 0, err
    assert not any(s in out + err for s in (API_KEY, ADMIN_KEY, HF_TOKEN))
    [result] = json.loads(out)
    assert result["ok"] and result["changed"]
    assert [r["actions"] for r in result["roles"]] == [["installed", "enabled", "restarted"]] * 3
    assert "decode: healthy after" in err and "systemd-analyze verify: 3 unit(s) clean" in err
    for unit in UNITS:
        assert on_host(one_host, f"systemctl is-active {unit}").strip() == "active"
        assert on_host(one_host, f"systemctl is-enabled {unit}").strip() == "enabled"

    files = files_on(one_host)
    for role, unit in zip(settings.ROLES, UNITS):
        pid = main_pid(one_host, unit)
        assert proc_cmdline(one_host, pid) == exec_argv(files[f"/etc/systemd/system/{unit}"])
        env = units.parse_env_file(files[f"/etc/sglang/{role}.env"])
        environ = proc_environ(one_host, pid)
        assert {k: environ.get(k) for k in env} == env
        assert environ["NASTY"] == NASTY
        assert API_KEY not in files[f"/etc/systemd/system/{unit}"] + files[f"/etc/sglang/{role}.env"]
    # The key is in the root-only --config file only: not in the unit, the env file or the
    # command line of any process of the server units, and the servers require it.
    assert on_host(one_host, "stat -c '%a %U %G %n' /etc/sglang/*").splitlines() == [
        f"600 root root /etc/sglang/{name}" for name in (
            "decode.env", "decode.secrets.yaml", "prefill.env", "prefill.secrets.yaml",
            "router.env")]
    lines = all_cmdlines(one_host)
    assert sum("sglang::" in line for line in lines) >= 2           # the scheduler children
    assert not [line for line in lines if API_KEY in line or ADMIN_KEY in line]
    for role, unit in zip(settings.SERVER_ROLES, UNITS):
        config = f"/etc/sglang/{role}.secrets.yaml"
        assert yaml.safe_load(on_host(one_host, f"cat {config}"))["api-key"] == API_KEY
        assert any("sglang.launch_server" in line and f"--config {config}" in line
                   for line in lines)
        assert f"--config {config}" in files[f"/etc/systemd/system/{unit}"]
        models = f"http://127.0.0.1:{ports[role]}/v1/models"
        assert http_status(models) == 401 and http_status(models, "wrong") == 401
        assert http_status(models, API_KEY) == 200
    assert "api-key" not in on_host(one_host, "cat /etc/sglang/router.env")
    decode = units.parse_env_file(files["/etc/sglang/decode.env"])
    prefill = units.parse_env_file(files["/etc/sglang/prefill.env"])
    assert decode["TRITON_INDEXER"] == "1" and "TRITON_INDEXER" not in prefill
    assert decode["CUDA_VISIBLE_DEVICES"] == "2,3" and prefill["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert [p.split(":")[0] for p in decode["PATCHSET_PATCHES"].split()] == ["chat-a", "idx-c"]
    assert [p.split(":")[0] for p in prefill["PATCHSET_PATCHES"].split()] == ["chat-a", "dsv4-b"]
    argv = exec_argv(files["/etc/systemd/system/sglang-prefill.service"])
    assert argv[:3] == [PYTHON, "-m", "sglang.launch_server"] and "--disaggregation-mode" in argv

    # The second deploy changes nothing: same files, same processes, no restart.
    pids = {unit: main_pid(one_host, unit) for unit in UNITS}
    stamps = on_host(one_host, "stat -c '%n %Y.%y' /etc/systemd/system/sglang-* /etc/sglang/*")
    code, out, err = cli(capsys, "deploy", one_host.name, "--json")
    assert code == 0, err
    [again] = json.loads(out)
    assert not again["changed"] and all(r["actions"] == [] for r in again["roles"])
    assert {unit: main_pid(one_host, unit) for unit in UNITS} == pids
    assert on_host(one_host, "stat -c '%n %Y.%y' /etc/systemd/system/sglang-* "
                             "/etc/sglang/*") == stamps
    code, out, _ = cli(capsys, "deploy", one_host.name, "--dry-run")
    assert code == 0 and "---" not in out and out.count(": unchanged") == 3
    # the same inventory spelled another way renders the same files: nothing to restart
    code, out, err = cli(capsys, "deploy", one_host.name, "--json", "--inventory",
                         str(Path("hosts.yaml").resolve()))
    assert code == 0, err
    assert not json.loads(out)[0]["changed"]
    assert {unit: main_pid(one_host, unit) for unit in UNITS} == pids
    assert str(Path.cwd()) not in on_host(one_host, "cat /etc/systemd/system/sglang-*.service "
                                                    "/etc/sglang/*.env")

    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    [st] = json.loads(out)
    assert {u["unit"]: u["stale"] for u in st["units"]} == {UNITS[0]: False, UNITS[1]: False}


def test_the_tracer_runs_in_every_process_of_a_deployed_unit(one_host: TestHost, deploy_env,
                                                             capsys) -> None:
    """deploy installs the tracer (trace: true by default): every Python process of a
    server unit, the scheduler children included, writes its record into the unit's
    root-only runtime directory, which systemd removes when the unit stops; a role with
    `trace: false` runs without it."""
    from patchset.agent.lib import tracer
    deploy_env(roles={"prefill": {"trace": False}})
    prepare_tree(one_host, capsys, "--tier", "moderate")
    code, _, err = cli(capsys, "deploy", one_host.name)
    assert code == 0 and "the tracer watches only" not in err, err
    run_dir = f"{tracer.RUN_DIR}/decode"
    assert on_host(one_host, f"stat -c '%a %U' {run_dir}").split() == ["700", "root"]
    pids = {int(n.split(".")[0]) for n in on_host(one_host, f"ls {run_dir}").split()}
    main = main_pid(one_host, UNITS[1])
    children = {int(x) for x in on_host(one_host, f"pgrep -P {main} || true").split()}
    assert main in pids and children & pids, (pids, main, children)
    records = [json.loads(on_host(one_host, f"cat {run_dir}/{pid}.json")) for pid in pids]
    assert {r["role"] for r in records} == {"decode"}
    titles = {pid: on_host(one_host, f"tr '\\0' ' ' < /proc/{pid}/cmdline").split()[0]
              for pid in children & pids}
    assert any(t.startswith("sglang::scheduler") for t in titles.values()), titles
    env = units.parse_env_file(on_host(one_host, "cat /etc/sglang/decode.env"))
    watched = {f"{m}:{q}": ps for (m, q), ps in tracer.parse(env["PATCHSET_TRACE"]).items()}
    for r in records:                  # every process watches what deploy rendered
        assert r["targets"] == watched and r["unavailable"] == [], r
    # the test series' patches change comments only: no code of theirs to watch, only the
    # server's forward entry (tests/unit/test_tracetargets.py covers the shipped series)
    assert {p for ps in watched.values() for p in ps} == {"~forward"}
    assert on_host(one_host, f"stat -c '%a' {run_dir}/{main}.json").strip() == "600"
    import hashlib
    local = hashlib.sha256(Path(tracer.__file__).read_bytes()).hexdigest()
    assert on_host(one_host, f"sha256sum {tracer.HOME}/patchset_tracer.py").split()[0] == local
    assert "PATCHSET_TRACE" not in proc_environ(one_host, main_pid(one_host, UNITS[0]))
    assert run_ssh(one_host, f"test -e {tracer.RUN_DIR}/prefill").returncode == 1
    on_host(one_host, f"systemctl stop {UNITS[1]}")
    assert run_ssh(one_host, f"test -e {run_dir}").returncode == 1      # removed on stop
    assert cli(capsys, "deploy", one_host.name)[0] == 0                # back as it was


def test_a_unit_that_fails_health_is_rolled_back(one_host: TestHost, deploy_env,
                                                 capsys) -> None:
    deploy_env()
    prepare_tree(one_host, capsys, "--tier", "safe")
    assert cli(capsys, "deploy", one_host.name)[0] == 0
    before = files_on(one_host)
    pids = {unit: main_pid(one_host, unit) for unit in UNITS}

    deploy_env(roles={"decode": {"env": {"STANDIN_FAIL_HEALTH": "1"}},
                      "prefill": {"extra_args": ["--mem-fraction-static", "0.8"]}})
    code, _, err = cli(capsys, "deploy", one_host.name, "--health-timeout", "6")
    assert code == 4
    assert (f"{one_host.name}: deploy FAILED: sglang-decode.service did not report healthy at "
            f"http://127.0.0.1:") in err
    assert "within 6s (last: HTTP 503); rolled back: previous unit files restored" in err
    assert "sglang-prefill.service restarted with the previous files" in err
    assert "last journal lines of sglang-decode.service:" in err
    assert "decode: healthy after" in err and "(rollback)" in err
    assert files_on(one_host) == before
    for unit in UNITS[:2]:
        assert on_host(one_host, f"systemctl is-active {unit}").strip() == "active"
        assert main_pid(one_host, unit) != pids[unit]               # restarted twice
        environ = proc_environ(one_host, main_pid(one_host, unit))
        assert "STANDIN_FAIL_HEALTH" not in environ
    assert main_pid(one_host, UNITS[2]) == pids[UNITS[2]]           # router never touched
    assert "--mem-fraction-static" not in proc_cmdline(one_host, main_pid(one_host, UNITS[0]))


def test_a_new_unit_that_fails_is_removed_again(one_host: TestHost, deploy_env,
                                                capsys) -> None:
    deploy_env(roles={"decode": {"env": {"STANDIN_FAIL_HEALTH": "1"}}, "router": None})
    prepare_tree(one_host, capsys, "--tier", "safe")
    code, _, err = cli(capsys, "deploy", one_host.name, "--health-timeout", "4")
    assert code == 4 and "sglang-decode.service removed (it was new)" in err
    assert "sglang-prefill.service removed (it was new)" in err
    assert set(files_on(one_host).values()) == {None}
    for unit in UNITS[:2]:
        assert run_ssh(one_host, f"systemctl is-active {unit}").stdout.strip() == "inactive"


def test_unsafe_values_are_refused_before_anything_is_installed(one_host: TestHost, deploy_env,
                                                                capsys) -> None:
    path = deploy_env(roles={"decode": {"extra_args": ["--chat-template", "it's"]}})
    code, _, err = cli(capsys, "deploy", one_host.name)
    assert code == 2
    assert (f"hosts.yaml:{_line(path, '- it' + chr(39) + 's')}: hosts.{one_host.name}.roles.decode.extra_args[1]: "
            "argument \"it's\" contains a quote") in err
    path = deploy_env(serving={"env": {"NCCL_DEBUG": "WARN\nExecStartPre=/bin/sh -c id"}})
    code, _, err = cli(capsys, "deploy", one_host.name)
    assert code == 2 and f"hosts.{one_host.name}.serving.env.NCCL_DEBUG: " in err
    assert "contains a newline" in err
    deploy_env(roles={"prefill": {"model_path": '/models/a"b'}})
    code, _, err = cli(capsys, "deploy", one_host.name)
    assert code == 2 and "roles.prefill.model_path" in err
    assert set(files_on(one_host).values()) == {None}

    # A value the inventory accepts but systemd refuses: nothing is installed either.
    deploy_env()
    prepare_tree(one_host, capsys, "--tier", "safe")
    deploy_env(python="/opt/venv/bin/no-such-python")
    code, _, err = cli(capsys, "deploy", one_host.name)
    assert code == 4 and "systemd-analyze verify refused the units (nothing was installed)" in err
    assert "no-such-python is not executable" in err
    assert set(files_on(one_host).values()) == {None}


def _line(path: Path, text: str) -> int:
    return next(i for i, l in enumerate(path.read_text().splitlines(), 1) if l.strip() == text)


# ---------------------------------------------------------------- stale units after apply

def test_apply_marks_units_stale_and_restart_restarts_only_the_affected_role(
        one_host: TestHost, deploy_env, capsys) -> None:
    deploy_env()
    prepare_tree(one_host, capsys, "--only", "chat-a,dsv4-b")
    assert cli(capsys, "deploy", one_host.name)[0] == 0
    pids = {unit: main_pid(one_host, unit) for unit in UNITS}
    code, out, _ = cli(capsys, "status", one_host.name)
    assert code == 0 and "STALE" not in out

    # idx-c runs in decode only: the decode unit is stale, prefill is not.
    code, _, err = cli(capsys, "apply", "--only", "chat-a,dsv4-b,idx-c", one_host.name)
    assert code == 0, err
    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    [st] = json.loads(out)
    assert code == 1
    assert {u["role"]: u["stale"] for u in st["units"]} == {"prefill": False, "decode": True}
    code, out, _ = cli(capsys, "status", one_host.name)
    assert "STALE: sglang-decode.service started before the tree changed" in out
    assert "patchset apply --restart" in out

    code, out, err = cli(capsys, "apply", "--only", "chat-a,dsv4-b,idx-c", "--restart",
                         one_host.name, "--json")
    assert code == 0, err
    [result] = json.loads(out)
    assert not result["changed"]                                  # the tree was already there
    assert [r["role"] for r in result["restart"]["roles"]] == ["decode"]
    assert f"{one_host.name}: restart: decode restarted" in err
    assert main_pid(one_host, UNITS[0]) == pids[UNITS[0]]
    assert main_pid(one_host, UNITS[1]) != pids[UNITS[1]]
    assert main_pid(one_host, UNITS[2]) == pids[UNITS[2]]
    environ = proc_environ(one_host, main_pid(one_host, UNITS[1]))
    assert environ["TRITON_INDEXER"] == "1" and "idx-c:" in environ["PATCHSET_PATCHES"]
    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    assert code == 0 and not any(u["stale"] or u["need_daemon_reload"]
                                 for u in json.loads(out)[0]["units"])

    # Nothing changed: --restart has nothing to do.
    code, _, err = cli(capsys, "apply", "--only", "chat-a,dsv4-b,idx-c", "--restart",
                       one_host.name)
    assert code == 0 and "restart: nothing to restart" in err
    assert main_pid(one_host, UNITS[1]) != pids[UNITS[1]]


def test_a_tree_that_changed_since_render_or_is_locked_is_refused(one_host: TestHost,
                                                                  deploy_env, monkeypatch,
                                                                  capsys) -> None:
    import threading
    import time

    from patchset.connect.ssh import SshTransport
    deploy_env()
    prepare_tree(one_host, capsys, "--tier", "safe")
    original = SshTransport.call

    def racing(self, request, files=None, on_event=None):  # an apply lands in between
        if request.op == "deploy":
            on_host(one_host, f"echo >> {TREE}/.patchset/state.json")
        return original(self, request, files, on_event)

    monkeypatch.setattr(SshTransport, "call", racing)
    code, _, err = cli(capsys, "deploy", one_host.name)
    monkeypatch.setattr(SshTransport, "call", original)
    assert code == 4 and "changed since the units were rendered" in err and "run deploy again" in err
    assert set(files_on(one_host).values()) == {None}

    holder = threading.Thread(target=run_ssh, args=(one_host, (
        f"python3 -c 'import fcntl, time; f = open(\"{TREE}/.patchset/lock\", \"a+\"); "
        "fcntl.flock(f, fcntl.LOCK_EX); time.sleep(4)'")))
    holder.start()
    time.sleep(1.5)
    code, _, err = cli(capsys, "deploy", one_host.name)
    holder.join()
    assert code == 4 and f"{TREE} is locked by" in err and "--lock-wait" in err
    assert set(files_on(one_host).values()) == {None}


def test_a_deploy_killed_half_way_is_rolled_back_by_the_next(one_host: TestHost, deploy_env,
                                                             capsys) -> None:
    import os
    import subprocess
    import sys
    import time
    deploy_env()
    prepare_tree(one_host, capsys, "--tier", "safe")
    assert cli(capsys, "deploy", one_host.name)[0] == 0
    before = files_on(one_host)

    deploy_env(roles={"decode": {"env": {"STANDIN_FAIL_HEALTH": "1"}}})
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "patchset.cli", "deploy", one_host.name,
                             "--health-timeout", "120"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while "STANDIN_FAIL_HEALTH" not in run_ssh(one_host, "cat /etc/sglang/decode.env").stdout:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    time.sleep(1)
    on_host(one_host, "kill -9 $(pgrep -f 'patchset-deploy-[0-9a-f]')")   # the runner, mid-wait
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 4 and "the deploy runner" in err, err
    assert ("killed" in err or "ended without an exit status" in err) and "python3" not in err
    assert on_host(one_host, "test -e /var/lib/patchset/deploy/txn.json && echo yes") == "yes\n"

    deploy_env()
    code, out, err = cli(capsys, "deploy", one_host.name, "--dry-run")
    assert code == 0 and "left files behind; the next deploy rolls it back first" in err
    code, out, err = cli(capsys, "deploy", one_host.name, "--json")
    assert code == 0, err
    [result] = json.loads(out)
    assert [r["action"] for r in result["recovered"]] == ["restarted with the previous files"]
    assert "rolled back an interrupted deploy first: sglang-decode.service restarted" in err
    assert files_on(one_host) == before
    assert "STANDIN_FAIL_HEALTH" not in proc_environ(one_host, main_pid(one_host, UNITS[1]))
    assert run_ssh(one_host, "test -e /var/lib/patchset/deploy/txn.json").returncode == 1
