"""`patchset audit --probe` on a real nspawn host: a stand-in bound to the host's loopback
only, probed by `patchset probe HOST` and `patchset audit HOST --probe` through the host's
SSH connection (against stand-ins on this machine: tests/unit/test_audit_probe.py)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from patchset.auditor import report
from tests.hosts.nspawn import TestHost
from tests.hostutil import free_port, on_host
from tests.standin.install import install_standin
from tests.unit.test_audit_probe import cli, probe_findings
from tests.unit.test_probe import MODEL

pytestmark = pytest.mark.hosts


# ---------------------------------------------------------------- through a host's SSH

# The stand-in's address on the host. Test hosts share this machine's network namespace
# (tests/hosts/nspawn.py; test_tunnel.py says so too), and a host's SSH address is this
# machine's 127.0.0.1: a server on the host's 127.0.0.1 would be reachable from here as
# well, so it listens on 127.0.0.2 only. What the test shows: the probes go to the address
# as the host sees it, inside the host's SSH connection, while a direct connection to the
# host's address is refused.
BIND = "127.0.0.2"
STANDIN_UNIT = "probe-standin"


@pytest.fixture(scope="module")
def loopback_host(host_factory, pinned_base) -> Iterator[dict]:
    """One host for the module, running the stand-in on BIND:PORT (a transient unit); the
    pinned SGLang source copied in for the stand-in to read."""
    [host] = host_factory.start(1, prefix="probe")
    shutil.copytree(pinned_base.repo / "python", host.live_root / "opt/sglang/python",
                    ignore=shutil.ignore_patterns("__pycache__"))
    python = install_standin(host)
    port = free_port()
    on_host(host, f"systemd-run --unit={STANDIN_UNIT} -p Type=exec "
            f"-p Environment=STANDIN_STARTUP_DELAY=0.2 {python} -m sglang.launch_server "
            f"--model-path {MODEL} --host {BIND} --port {port} && for i in $(seq 200); do "
            f"curl -sf http://{BIND}:{port}/health && exit 0; sleep 0.1; done; exit 1")
    yield {"host": host, "port": port}
    host_factory.stop([host])


@pytest.fixture()
def ssh_env(loopback_host: dict, series, tmp_path: Path, monkeypatch,
            known_hosts_file) -> dict:
    """The host's key known, no user ssh config, cwd = the series; `write(roles)` writes
    hosts.yaml naming the host (with those roles) and returns its path."""
    host: TestHost = loopback_host["host"]
    (tmp_path / "ssh_config").write_text("")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(tmp_path / "ssh_config"))
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(known_hosts_file([host])))
    monkeypatch.setenv("PATCHSET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(Path(series.root))
    path = tmp_path / "hosts.yaml"

    def write(roles: dict | None) -> str:
        entry = {"address": host.ip, "port": host.port, "user": "root",
                 "identity_file": str(host.client_key), **({"roles": roles} if roles else {})}
        path.write_text(yaml.safe_dump({"version": 1, "hosts": {host.name: entry}}))
        return str(path)
    return {**loopback_host, "write": write,
            "via": f"{host.name} {BIND}:{loopback_host['port']} via ssh"}


def ssh_logins(host: TestHost) -> int:
    """SSH logins the host's sshd accepted so far (read inside the host, not over ssh)."""
    res = host.exec(["journalctl", "-o", "cat", "--no-pager", "_COMM=sshd"])
    return res.stdout.count("Accepted publickey for root")


def logins_during(host: TestHost, action) -> tuple[object, int]:
    """(what `action()` returned, the SSH logins it made)."""
    before = ssh_logins(host)
    out = action()
    time.sleep(0.5)                                 # journald has the sshd line by now
    return out, ssh_logins(host) - before


def test_probes_reach_a_loopback_server_through_ssh(ssh_env: dict, capsys) -> None:
    """`patchset probe HOST` and `patchset audit HOST --probe recall` (the inventory's
    decode role, else the facts' listening address) reach a server a direct connection
    cannot; the audit's probes share its one SSH connection (one login)."""
    host: TestHost = ssh_env["host"]
    direct = f"http://{host.ip}:{ssh_env['port']}"
    code, out, err = cli(capsys, "probe", "--url", direct, "--kind", "recall", "--json")
    assert code == 3 and json.loads(out)["results"][0]["error"] == \
        f"cannot reach {direct}: unreachable (Connection refused)"

    roles = ssh_env["write"]({"decode": {"port": ssh_env["port"], "host": BIND}})
    code, out, err = cli(capsys, "probe", host.name, "--inventory", roles, "--sizes", "1k",
                         "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["host"], result["url"]) == (host.name, ssh_env["via"])
    assert [(r["name"], r["ok"], r["url"]) for r in result["results"]] == [
        ("recall", True, ssh_env["via"]), ("needle@1k", True, ssh_env["via"])]

    for inventory in (roles, ssh_env["write"](None)):     # the role, then the facts
        (code, out, err), logins = logins_during(host, lambda: cli(
            capsys, "audit", host.name, "--inventory", inventory, "--probe", "recall",
            "--format", "json"))
        data = json.loads(out)
        assert report.validate(data) == [] and code != 3, err
        assert data["summary"]["unreachable"] == []
        [record] = data["hosts"][0]["probes"]
        assert (record["name"], record["ok"], record["url"]) == ("recall", True,
                                                                 ssh_env["via"])
        assert record["answer"] == record["expected"]
        assert probe_findings(data) == [("probe[recall]", f"recall {ssh_env['via']}", "pass")]
        evidence = next(f for f in data["findings"] if f["id"] == "probe[recall]")["evidence"]
        assert evidence[0]["command"] == f"POST /v1/chat/completions to {ssh_env['via']}"
        assert logins == 1                          # facts and probes: one connection
