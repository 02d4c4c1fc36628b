"""The nspawn test-host infrastructure itself: real systemd, real sshd, isolation (the base
rootfs build with debootstrap faked: tests/unit/test_hosts_base.py).

These use plain OpenSSH with strict host-key checking (not the product's
fabric layer), so a failure here points at the hosts, not at patchset.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from tests.hosts import nspawn
from tests.hosts.fixtures import HostFactory
from tests.hosts.nspawn import (
    TestHost,
    base_is_current,
    build_base,
    host_cgroups,
    make_client_key,
    run_ssh,
)

pytestmark = pytest.mark.hosts

# Idempotent with a conftest that already lists it.
pytest_plugins = ["tests.hosts.fixtures"]


def _ssh(host: TestHost, command: str, **kw) -> subprocess.CompletedProcess[str]:
    return run_ssh(host, command, timeout=120, **kw)


def _ok(host: TestHost, command: str, **kw) -> str:
    res = _ssh(host, command, **kw)
    assert res.returncode == 0, f"{command!r} on {host.name}: rc={res.returncode}\n{res.stderr}"
    return res.stdout.strip()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- base rootfs


def test_base_is_cached_with_recipe_marker(host_base: Path) -> None:
    assert base_is_current(host_base)
    assert build_base(host_base) == host_base  # cached: no rebuild
    assert not list((host_base / "etc/ssh").glob("ssh_host_*")), "host keys must be per host"
    assert (host_base / "etc/machine-id").read_text() == "", "machine id must be per host"
    assert (host_base / "usr/bin/git").exists() and (host_base / "usr/bin/curl").exists()
    assert oct(host_base.stat().st_mode & 0o777) == "0o755"


# ---------------------------------------------------------------- one host


def test_systemd_is_pid1_and_system_running(one_host: TestHost) -> None:
    assert _ok(one_host, "cat /proc/1/comm") == "systemd"
    state = _ssh(one_host, "systemctl is-system-running --wait").stdout.strip()
    failed = _ssh(one_host, "systemctl --failed --no-legend --plain").stdout
    assert state == "running", f"state={state}; failed units:\n{failed}"
    assert _ok(one_host, "systemctl is-active ssh.service") == "active"


def test_sshd_accepts_client_key_and_refuses_others(one_host: TestHost, tmp_path: Path) -> None:
    assert _ok(one_host, "id -un") == "root"
    stranger = make_client_key(tmp_path / "stranger")
    res = _ssh(one_host, "true", identity=stranger.private)
    assert res.returncode == 255 and "Permission denied (publickey)" in res.stderr


def test_sshd_config_is_key_only_on_loopback(one_host: TestHost) -> None:
    effective = dict(
        line.split(" ", 1) for line in _ok(one_host, "sshd -T").splitlines() if " " in line
    )
    assert effective["port"] == str(one_host.port)
    assert effective["listenaddress"] == f"127.0.0.1:{one_host.port}"
    assert effective["permitrootlogin"] == "without-password"  # = prohibit-password
    assert effective["passwordauthentication"] == "no"
    assert effective["kbdinteractiveauthentication"] == "no"


def test_python_git_curl_venv_present(one_host: TestHost) -> None:
    assert _ok(one_host, "python3 -c 'import sys; print(sys.version_info >= (3, 10))'") == "True"
    assert _ok(one_host, "git --version").startswith("git version")
    assert _ok(one_host, "curl --version").startswith("curl ")
    venv = _ok(one_host, "python3 -m venv /tmp/v && /tmp/v/bin/python -c 'import sys; print(sys.prefix)'")
    assert venv == "/tmp/v"


def test_exec_without_ssh_sees_same_host(one_host: TestHost) -> None:
    res = one_host.exec(["hostname"], check=True)
    assert res.stdout.strip() == one_host.name


# ---------------------------------------------------------------- fleet


def test_fleet_has_distinct_identities(fleet: list[TestHost], known_hosts_file: Callable[..., Path]) -> None:
    known = known_hosts_file(fleet)
    seen = {}
    for host in fleet:
        out = _ok(host, "hostname; cat /etc/machine-id", known_hosts=known).split()
        assert out == [host.name, host.machine_id]
        seen[host.name] = out[1]
    assert len(set(seen.values())) == len(fleet) == 3
    assert len({h.port for h in fleet}) == 3
    assert len({h.host_key.split()[1] for h in fleet}) == 3


# ---------------------------------------------------------------- isolation


def test_writes_stay_in_overlay_and_vanish_on_restart(fresh_host: TestHost) -> None:
    base_motd = fresh_host.root / "etc/motd"
    before = _sha256(base_motd)
    _ok(fresh_host, "echo changed >> /etc/motd && echo x > /root/written-by-test")
    assert (fresh_host.live_root / "root/written-by-test").read_text() == "x\n"
    assert not (fresh_host.root / "root/written-by-test").exists()
    assert _sha256(base_motd) == before, "base rootfs must never be written"
    fresh_host.restart()
    assert _ok(fresh_host, "test -e /root/written-by-test && echo kept || echo gone") == "gone"


# ---------------------------------------------------------------- failure modes


def test_host_down_then_up(fresh_host: TestHost) -> None:
    fresh_host.stop()
    res = _ssh(fresh_host, "true")
    assert res.returncode == 255 and "Connection refused" in res.stderr
    fresh_host.start()
    assert _ok(fresh_host, "hostname") == fresh_host.name


def test_rotated_host_key_is_rejected_by_strict_known_hosts(
    fresh_host: TestHost, known_hosts_file: Callable[..., Path]
) -> None:
    old = known_hosts_file([fresh_host], "old_known_hosts")
    old_key = fresh_host.host_key
    fresh_host.rotate_host_key()
    assert fresh_host.host_key != old_key
    res = _ssh(fresh_host, "true", known_hosts=old)
    assert res.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr
    assert _ok(fresh_host, "echo ok", known_hosts=known_hosts_file([fresh_host], "new")) == "ok"


def test_host_that_cannot_serve_ssh_fails_fast_with_journal(
    host_base: Path, host_client_key: nspawn.ClientKey, tmp_path: Path
) -> None:
    host = TestHost.prepare("busy-port", host_base, host_client_key, tmp_path)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", host.port))
    squatter.listen()
    try:
        with pytest.raises(nspawn.HostError) as err:
            host.start(timeout=120)
    finally:
        host.stop()
        squatter.close()
    assert "ssh.service failed" in str(err.value)
    assert "Address already in use" in str(err.value), "journal must be in the error"


def test_stop_leaves_no_process_port_or_cgroup(host_factory: HostFactory) -> None:
    [host] = host_factory.start(1, prefix="stop")
    assert host._proc is not None
    nspawn_pid, leader = host._proc.pid, host.leader_pid
    host.stop()
    assert not host.is_running
    for pid in (nspawn_pid, leader):
        assert not os.path.exists(f"/proc/{pid}"), f"pid {pid} survived stop()"
    assert not nspawn._port_open(host.port)
    assert not any(d.exists() for d in host_cgroups(host.name))
