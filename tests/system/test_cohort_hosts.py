"""Cohort parity on two real nspawn hosts (systemd, sshd), each serving prefill + decode
under units `patchset deploy` rendered: a patch applied on one host of the cohort and
not on the other is found by `patchset audit` and named, with its servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.hosts.hostsetup import ARGS, MODEL, TREE, VENV, checkpoint
from tests.standin.install import install_standin
from tests.hostutil import cli, free_ports, on_host
from tests.system.test_audit_hosts import write_series

pytestmark = pytest.mark.hosts

EXCLUDED = "nvfp4-cutlass-swiglu-clamp"
ONE_SIDED = "mhc-bf16"


@pytest.fixture(scope="module")
def pair(host_factory, tmp_path_factory, host_client_key) -> dict:
    from tests.hosts.nspawn import write_known_hosts
    hosts = host_factory.start(2, prefix="cohort")
    work = tmp_path_factory.mktemp("cohort-hosts")
    known = write_known_hosts(hosts, work / "known_hosts")
    (work / "ssh_config").write_text("")
    yield {"hosts": hosts, "work": work, "known": known,
           "series": write_series(work / "series"), "ports": free_ports(3)}
    host_factory.stop(hosts)


@pytest.fixture()
def cohort_env(pair, monkeypatch):
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(pair["known"]))
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(pair["work"] / "ssh_config"))
    monkeypatch.setenv("PATCHSET_HOME", str(pair["work"] / "home"))
    monkeypatch.chdir(pair["work"])
    return pair


def inventory(env: dict) -> Path:
    """Both hosts in cohort `flash`, prefill + decode each (the layout of test_audit_hosts)."""
    prefill, decode, bootstrap = env["ports"]
    hosts = {}
    for host in env["hosts"]:
        hosts[host.name] = {
            "address": host.ip, "port": host.port, "user": "root",
            "identity_file": str(host.client_key), "tree": TREE,
            "python": f"{VENV}/bin/python", "cohort": "flash",
            "serving": {"model_path": MODEL, "transfer_backend": "fake",
                        "env": {"STANDIN_STARTUP_DELAY": "0.2"}},
            "roles": {"prefill": {"gpus": "0,1", "port": prefill, "bootstrap_port": bootstrap,
                                  "extra_args": list(ARGS),
                                  "env": {"TRITON_INDEXER": "0", "MMA_FLASHMLA": "0"}},
                      "decode": {"gpus": "2,3", "port": decode, "extra_args": list(ARGS)}}}
    path = env["work"] / "hosts.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "hosts": hosts}, sort_keys=False))
    return path


def test_a_patch_on_one_host_of_the_cohort_is_found_and_named(cohort_env, capsys) -> None:
    env, series = cohort_env, str(cohort_env["series"])
    inventory(env)
    names = [h.name for h in env["hosts"]]
    for host in env["hosts"]:
        on_host(host, f"rm -rf {TREE}")
    code, _, err = cli(capsys, "apply", "--exclude", EXCLUDED, *names, "--series", series,
                       "--forks", "2")
    assert code == 0, err
    for host in env["hosts"]:
        install_standin(host, venv=VENV, tree=TREE)
        checkpoint(host)
    for name in names:
        code, _, err = cli(capsys, "deploy", name, "--series", series)
        assert code == 0, err

    code, out, err = cli(capsys, "audit", *names, "--format", "json", "--series", series)
    data = json.loads(out)
    parity = [f for f in data["findings"] if f["id"].startswith("cohort-parity")]
    assert parity and {f["status"] for f in parity} == {"pass"}, \
        [(f["id"], f["status"], f["message"]) for f in parity if f["status"] != "pass"]
    hashes = {(c["host"], c["role"]): c["hash"] for c in data["cohorts"]}
    assert hashes[(names[0], "decode")] == hashes[(names[1], "decode")] != "unknown"

    # the second host takes mhc-bf16 out and restarts: the cohort now serves two builds
    code, _, err = cli(capsys, "apply", "--exclude", f"{EXCLUDED},{ONE_SIDED}", names[1],
                       "--series", series, "--restart")
    assert code == 0, err
    code, out, err = cli(capsys, "audit", *names, "--format", "json", "--series", series)
    data = json.loads(out)
    assert code == 1, err
    f = next(f for f in data["findings"] if f["id"] == f"cohort-parity[{ONE_SIDED}]")
    assert (f["status"], f["severity"], f["patches"]) == ("fail", "medium", [ONE_SIDED])
    for server in (f"{names[0]}/sglang-decode.service applied",
                   f"{names[1]}/sglang-decode.service applied absent",
                   f"{names[1]}/sglang-prefill.service loaded absent"):
        assert server in f["message"], f["message"]
    others = [g for g in data["findings"] if g["id"].startswith("cohort-parity[")
              and g["id"] not in (f["id"], "cohort-parity[tree]")]
    assert {g["status"] for g in others} == {"pass"}
    hashes = {(c["host"], c["role"]): c["hash"] for c in data["cohorts"]}
    assert hashes[(names[0], "decode")] != hashes[(names[1], "decode")]
