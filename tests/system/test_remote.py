"""apply / revert / status over real SSH to real systemd-nspawn hosts (tests/hosts/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.seriesfactory import CHAT, DSV4
from tests.hosts.nspawn import TestHost, run_ssh
from tests.hostutil import TREE, clean_tree, cli, on_host

from patchset.agent.lib.records import STATE_FORMAT

pytestmark = pytest.mark.hosts



def test_apply_status_revert_over_ssh(one_host: TestHost, remote_env, capsys) -> None:
    remote_env([one_host])
    clean_tree(one_host)
    code, out, err = cli(capsys, "apply", "--tier", "moderate", one_host.name, "--json")
    assert code == 0, err
    [result] = json.loads(out)
    assert result["ok"] and result["provisioned"] == "controller"   # github unreachable here
    assert result["after"] == ["chat-a", "dsv4-b", "idx-c"]
    assert "# patch dsv4-b" in on_host(one_host, f"head -3 {TREE}/{DSV4}")
    log = on_host(one_host, f"git -C {TREE} log --format=%s -4")
    assert log.splitlines()[:3] == ["idx-c: test idx-c", "dsv4-b: test dsv4-b",
                                    "chat-a: test chat-a"]

    code, out, _ = cli(capsys, "apply", "--tier", "moderate", one_host.name, "--json")
    [again] = json.loads(out)
    assert code == 0 and not again["changed"] and again["provisioned"] is None

    code, out, _ = cli(capsys, "status", "--json")     # default host from the inventory
    [st] = json.loads(out)
    assert st["host"] == one_host.name and st["state_version"] == STATE_FORMAT
    assert [a["name"] for a in st["applied"]] == ["chat-a", "dsv4-b", "idx-c"]
    assert st["interpreter"]["managed"] is False      # python3 there imports no sglang
    assert code == 1

    code, out, _ = cli(capsys, "revert", "dsv4-b", "--json")
    assert code == 0 and json.loads(out)[0]["after"] == ["chat-a", "idx-c"]
    assert "# patch dsv4-b" not in on_host(one_host, f"head -3 {TREE}/{DSV4}")


def test_status_flags_which_tree_the_interpreter_imports(one_host: TestHost, remote_env,
                                                         capsys) -> None:
    remote_env([one_host], python="/opt/venv/bin/python")
    clean_tree(one_host)
    assert cli(capsys, "apply", "--tier", "safe", one_host.name)[0] == 0
    on_host(one_host, "rm -rf /opt/venv && python3 -m venv /opt/venv && "
            f"echo {TREE}/python > $(/opt/venv/bin/python -c "
            "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/sglang.pth")
    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    [st] = json.loads(out)
    assert st["interpreter"]["imports"] == f"{TREE}/python/sglang/__init__.py"
    assert st["interpreter"]["managed"] is True and code == 0
    on_host(one_host, "rm -f /opt/venv/lib/python3*/site-packages/sglang.pth && mkdir -p "
            "/opt/venv/lib/python3.11/site-packages/sglang && touch "
            "/opt/venv/lib/python3.11/site-packages/sglang/__init__.py")
    code, out, _ = cli(capsys, "status", one_host.name)
    assert code == 1 and "NOT the managed tree" in out


def test_unknown_host_refused_then_accept_new(fresh_host: TestHost, remote_env, tmp_path: Path,
                                              monkeypatch, capsys) -> None:
    remote_env([fresh_host])
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(empty))
    code, _, err = cli(capsys, "apply", "--tier", "safe", fresh_host.name)
    assert code == 3 and "unknown host key" in err and "--accept-new" in err
    assert on_host(fresh_host, f"test -e {TREE} && echo yes || echo no").strip() == "no"
    code, _, err = cli(capsys, "apply", "--tier", "safe", "--accept-new", fresh_host.name)
    assert code == 0, err
    assert f"[{fresh_host.ip}]:{fresh_host.port} ssh-" in empty.read_text()
    code, _, err = cli(capsys, "status", fresh_host.name)   # now known: no flag needed
    assert code in (0, 1) and "unknown host key" not in err


def test_changed_host_key_always_refused(fresh_host: TestHost, remote_env, tmp_path: Path,
                                         monkeypatch, capsys) -> None:
    remote_env([fresh_host])
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[{fresh_host.ip}]:{fresh_host.port} "
                     + " ".join(key.with_suffix(".pub").read_text().split()[:2]) + "\n")
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(wrong))
    for extra in ([], ["--accept-new"]):
        code, _, err = cli(capsys, "apply", "--tier", "safe", *extra, fresh_host.name)
        assert code == 3 and "host key CHANGED" in err and "ssh-keygen -R" in err


def test_fleet_with_one_host_down(fleet: list[TestHost], remote_env, capsys) -> None:
    remote_env(fleet)
    for host in fleet:
        clean_tree(host)
    fleet[2].stop()
    code, out, err = cli(capsys, "apply", "--tier", "safe", "--json",
                         *[h.name for h in fleet])
    results = {r["host"]: r for r in json.loads(out)}
    assert code == 3
    assert results[fleet[0].name]["ok"] and results[fleet[1].name]["ok"]
    assert not results[fleet[2].name]["ok"] and "unreachable" in results[fleet[2].name]["error"]
    assert f"3 hosts: 2 ok, 1 unreachable ({fleet[2].name})" in err
    for host in fleet[:2]:
        assert "# patch chat-a" in on_host(host, f"cat {TREE}/{CHAT}")


def test_racing_applies_one_waits_or_names_the_holder(one_host: TestHost, remote_env,
                                                      capsys) -> None:
    remote_env([one_host])
    clean_tree(one_host)
    assert cli(capsys, "apply", "--tier", "safe", one_host.name)[0] == 0
    holder = threading.Thread(target=run_ssh, args=(one_host, (
        f"python3 -c 'import fcntl, time; f = open(\"{TREE}/.patchset/lock\", \"a+\"); "
        "fcntl.flock(f, fcntl.LOCK_EX); time.sleep(4)'")))
    holder.start()
    time.sleep(1.5)
    code, _, err = cli(capsys, "apply", "--tier", "moderate", one_host.name)
    assert code == 4 and "is locked by patchset apply (pid" in err
    code, _, err = cli(capsys, "apply", "--tier", "moderate", "--lock-wait", "30", one_host.name)
    holder.join()
    assert code == 0, err

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-m", "patchset.cli", "apply", "--tier", tier,
                               "--lock-wait", "60", one_host.name], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tier in ("risky", "risky")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    [st] = json.loads(out)
    assert len(st["applied"]) == 5 and not st["drift"] and not st["dirty"]


def test_engine_killed_mid_apply_then_status_and_apply(one_host: TestHost, remote_env,
                                                       monkeypatch, capsys) -> None:
    remote_env([one_host])
    clean_tree(one_host)
    assert cli(capsys, "apply", "--tier", "safe", one_host.name)[0] == 0
    monkeypatch.setenv("PATCHSET_TEST_CRASH_AT", "file:1")
    code, _, err = cli(capsys, "apply", one_host.name)
    assert code == 4 and "killed by a signal" in err and "python3" not in err
    monkeypatch.delenv("PATCHSET_TEST_CRASH_AT")
    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    [st] = json.loads(out)
    assert code == 1 and st["interrupted"]["next"] == "the next apply or revert finishes it"
    code, out, _ = cli(capsys, "apply", one_host.name, "--json")
    [result] = json.loads(out)
    assert code == 0 and result["recovered"]["finished"] and len(result["after"]) == 5
    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    assert not json.loads(out)[0]["interrupted"] and not json.loads(out)[0]["dirty"]


def test_hand_edit_on_host_refused_and_kept(one_host: TestHost, remote_env, capsys) -> None:
    remote_env([one_host])
    clean_tree(one_host)
    assert cli(capsys, "apply", "--tier", "safe", one_host.name)[0] == 0
    on_host(one_host, f"echo '# operator hotfix' >> {TREE}/{CHAT}")
    code, _, err = cli(capsys, "apply", "--tier", "moderate", one_host.name)
    assert code == 4 and "uncommitted changes" in err and "+# operator hotfix" in err
    assert "# operator hotfix" in on_host(one_host, f"tail -1 {TREE}/{CHAT}")


def test_hostile_values_are_never_run(one_host: TestHost, remote_env, series_dir: Path,
                                      capsys) -> None:
    remote_env([one_host])
    on_host(one_host, "rm -f /tmp/pwned")
    hostile = "/tmp/x y;touch /tmp/pwned;$(touch /tmp/pwned)'\""
    code, _, err = cli(capsys, "apply", "--tier", "safe", "--target", hostile, one_host.name)
    assert code == 2 and "use an absolute path" in err
    assert on_host(one_host, "test -e /tmp/pwned && echo yes || echo no").strip() == "no"
    for spec in ("root@host;id", "a$(id)@h", "h:22;x", "bad host"):
        code, _, err = cli(capsys, "status", spec)
        assert code == 2 and f"host {spec!r}" in err


def test_plan_against_a_host_shows_what_apply_would_change(one_host: TestHost, remote_env,
                                                           capsys) -> None:
    remote_env([one_host])
    clean_tree(one_host)
    assert cli(capsys, "apply", "--tier", "moderate", one_host.name)[0] == 0
    code, out, _ = cli(capsys, "plan", "--only", "chat-a,chat-e",
                       one_host.name)
    assert code == 0
    assert f"{one_host.name}: +chat-e, -dsv4-b, -idx-c" in out
    head = on_host(one_host, f"git -C {TREE} rev-parse HEAD")
    code, out, _ = cli(capsys, "plan", "--json", one_host.name)
    assert json.loads(out)["hosts"][0]["after"] == ["chat-a", "dsv4-b", "idx-c", "idx-d",
                                                    "chat-e"]
    assert on_host(one_host, f"git -C {TREE} rev-parse HEAD") == head   # nothing changed


def test_ssh_config_alias_and_proxyjump_are_honoured(fleet: list[TestHost], remote_env,
                                                     series_dir: Path, tmp_path: Path,
                                                     monkeypatch, capsys) -> None:
    remote_env(fleet[:2])
    (series_dir / "hosts.yaml").unlink()     # only ~/.ssh/config says how to reach them
    jump, dest = fleet[:2]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host bastion\n  HostName {jump.ip}\n  Port {jump.port}\n  User root\n"
        f"  IdentityFile {jump.client_key}\n"
        f"Host gpu-behind\n  HostName {dest.ip}\n  Port {dest.port}\n  User root\n"
        f"  IdentityFile {dest.client_key}\n  ProxyJump bastion\n")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(config))
    clean_tree(dest)
    code, out, err = cli(capsys, "apply", "--tier", "safe", "--target", TREE, "gpu-behind",
                         "--json")
    assert code == 0, err
    assert "# patch chat-a" in on_host(dest, f"cat {TREE}/{CHAT}")
    # The jump host's key is checked too: forget it and the hop is refused.
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(tmp_path / "only_dest"))
    (tmp_path / "only_dest").write_text(dest.known_hosts_line() + "\n")
    code, out, err = cli(capsys, "status", "--target", TREE, "gpu-behind")
    assert code == 3 and "unknown host key" in err and out == ""   # host errors: stderr


def test_existing_plain_tree_on_host_is_accepted_when_it_is_the_pin(one_host: TestHost,
                                                                    remote_env,
                                                                    capsys) -> None:
    remote_env([one_host])
    clean_tree(one_host)
    assert cli(capsys, "apply", "--tier", "safe", one_host.name)[0] == 0   # provisions git tree
    on_host(one_host, f"rm -rf /opt/plain && mkdir /opt/plain && git -C {TREE} archive "
            "refs/patchset/base:python | tar -x -C /opt/plain")
    code, out, err = cli(capsys, "apply", "--tier", "moderate", "--target", "/opt/plain",
                         one_host.name, "--json")
    assert code == 0, err
    assert json.loads(out)[0]["provisioned"] is None
    assert "# patch dsv4-b" in on_host(one_host, "head -3 /opt/plain/sglang/srt/models/"
                                                 "deepseek_v4.py")
    on_host(one_host, "rm -rf /opt/other && mkdir /opt/other && git -C /opt/sglang archive "
            "refs/patchset/base:python | tar -x -C /opt/other && echo '# fork' >> "
            "/opt/other/sglang/srt/models/deepseek_v4.py")
    code, _, err = cli(capsys, "apply", "--tier", "moderate", "--target", "/opt/other",
                       one_host.name)
    assert code == 4 and "is not the pinned base" in err


def test_user_at_host_port_spec(one_host: TestHost, remote_env, series_dir: Path,
                                tmp_path: Path, monkeypatch, capsys) -> None:
    remote_env([one_host])
    (series_dir / "hosts.yaml").unlink()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {one_host.ip}\n  IdentityFile {one_host.client_key}\n")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(config))
    clean_tree(one_host)
    spec = f"root@{one_host.ip}:{one_host.port}"
    code, out, err = cli(capsys, "apply", "--tier", "safe", "--target", TREE, spec, "--json")
    assert code == 0, err
    assert json.loads(out)[0]["host"] == spec
    code, out, _ = cli(capsys, "status", "--target", TREE, spec, "--json")
    assert [a["name"] for a in json.loads(out)[0]["applied"]] == ["chat-a"]
