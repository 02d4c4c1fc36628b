"""`patchset status` and `patchset audit` agree on the same host state (issue 13, point 2).

Both judge a server by the one staleness rule (patchset/agent/lib/staleness.py) and read the
host through the one runner, but they reach it by different roads: status judges each
unit that `patchset deploy` marked (its role from X-Patchset-Role, its start from
systemd), the audit judges each process it finds (its role from /server_info, its start
from /proc/PID/stat) and folds the verdict into the patch states. Here the two run back to
back on one real nspawn host, with the stand-in server under the units deploy rendered,
and every comparison is status's value against the audit's: the same units, pids and
start times, the same stale verdict and reason per unit, the same applied patches, the
same imported tree.

The series is the project's, with `mma-splitk-decode` tagged `path: decode`: taking it out
or putting it back makes the decode unit stale and leaves prefill fresh, so a verdict
given to the wrong unit (or to both) cannot pass.
"""

from __future__ import annotations

import calendar
import json
import os
import time

import pytest

from tests.hostutil import cli
from tests.system.test_audit_hosts import (  # noqa: F401 - env and audit_env are the fixtures used here
    D,
    P,
    audit,
    audit_env,
    deploy,
    env,
    finding,
    prepare_host,
    states,
    write_series,
)

pytestmark = pytest.mark.hosts

CLAMP, MMA, MHC = "nvfp4-cutlass-swiglu-clamp", "mma-splitk-decode", "mhc-bf16"
PATCHES_VAR = "PATCHSET_PATCHES"


@pytest.fixture()
def host_env(audit_env: dict, capsys) -> dict:
    """The module's host at the baseline: every patch but the clamp applied, the units
    deployed and fresh. Prepared by the first test that asks; later ones only make sure."""
    if not audit_env.get("agreement"):
        audit_env["series"] = write_series(audit_env["work"] / "series-agreement",
                                           **{MMA: {"path": "decode"}})
        prepare_host(audit_env, capsys)
        audit_env["agreement"] = True
    apply(audit_env, capsys, "--exclude", CLAMP)
    deploy(audit_env, capsys)
    return audit_env


def apply(env: dict, capsys, *argv: str) -> None:
    code, _, err = cli(capsys, "apply", *argv, env["host"].name, "--series", str(env["series"]))
    assert code == 0, err


def status(env: dict, capsys) -> dict:
    code, out, err = cli(capsys, "status", env["host"].name, "--json",
                         "--series", str(env["series"]))
    [st] = json.loads(out)
    assert code == (1 if any(u["stale"] for u in st["units"]) else 0), err
    return st


def epoch_ms(stamp: str) -> float:
    """status's `2026-12-01T14:00:00.123Z` as epoch seconds."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{frac or 0}")


def agree(env: dict, capsys) -> tuple[dict, dict]:
    """Run status, then the audit, on the same host state; assert they agree field by
    field; (status's tree, the audit's report) for what a scenario asserts on top."""
    st = status(env, capsys)
    _, data = audit(env, capsys)
    [host] = data["hosts"]
    assert host["reachable"] and not host["error"]
    units = {u["unit"]: u for u in st["units"]}
    servers = {s["unit"]: s for s in host["facts"]["servers"] if s["kind"] == "server"}
    patch_states = states(data)

    # the same servers: the units status judges are the processes the audit judges
    assert set(units) == set(servers) == {P, D}
    for unit, u in units.items():
        srv = servers[unit]
        assert u["active"] == "active"
        assert u["main_pid"] == srv["pid"]
        # two clocks for one start: systemd's monotonic stamp, /proc/PID/stat's ticks
        # after the whole-second btime (so up to a second apart, never more than two)
        assert abs(epoch_ms(u["started"]) - srv["started"]) < 2.0, (u["started"], srv["started"])
        assert u["running_patches"] == srv["environ"]["value"][PATCHES_VAR]

        # staleness: the same verdict and the same reason, for the same process
        apply_findings = [f for f in data["findings"] if f["id"] == "stale-process[apply]"
                          and f["subject"].startswith(unit + " ")]
        assert [f["subject"] for f in apply_findings] == (
            [f"{unit} (pid {u['main_pid']})"] if u["stale"] else [])
        assert bool(apply_findings) == u["stale"], (unit, u["stale_reason"], apply_findings)
        if u["stale"]:
            [f] = apply_findings
            assert f["status"] == "fail" and f["message"] == u["stale_reason"]
        else:
            fresh = finding(data, "stale-process", f"{unit} (pid {u['main_pid']})")
            assert fresh["id"] == "stale-process" and fresh["status"] == "pass", fresh
            assert u["stale_reason"].startswith("runs the patches the tree has")

        # applied patches: a fresh server runs what status lists as applied; a stale one
        # is judged by what it loaded (status's running_patches: its PATCHSET_PATCHES),
        # not by the tree on disk (status's applied)
        applied = [a["name"] for a in st["applied"]]
        audited = [p for (server, p), state in patch_states.items()
                   if server == unit and state != "not-applied"]
        reasons = {p: s["reason"] for s in host["states"] if s["server"] == unit
                   for p in [s["patch"]]}
        live = {patch_states[(unit, p)] for p in applied}
        assert "unknown" not in live, (unit, live)
        if not u["stale"]:
            assert audited == applied, (unit, audited, applied)
        else:
            loaded = [w.split(":")[0] for w in (u["running_patches"] or "").split()]
            role_now = [w.split(":")[0] for w in u["patches"].split()]
            for name in loaded:                      # loaded: live for the audit
                assert patch_states[(unit, name)] != "not-applied", (unit, name)
                if name not in applied:
                    assert reasons[name].startswith(f"loaded by pid {u['main_pid']} (")
                    assert "no longer on disk: restart to unload" in reasons[name]
            for name in role_now:                    # on disk for its role, not loaded
                if name not in loaded:
                    assert patch_states[(unit, name)] == "not-applied"
                    assert "not loaded by it (restart to load)" in reasons[name]
            assert set(audited) == (set(applied) - set(role_now)) | set(loaded), unit

        # the imported tree: the unit's running process, asked the same way by both (its
        # interpreter, cwd and PYTHONPATH: runner.process_import), and the inventory's
        # interpreter (status) name the same package as the audit's server check
        interp = st["interpreter"]
        imported = finding(data, "imported-tree", f"{unit} imports")
        assert (imported["status"] == "pass") is u["managed"], (imported, u)
        assert imported["found"] == os.path.dirname(u["imports"])
        assert (imported["status"] == "pass") is interp["managed"], (imported, interp)
        assert imported["found"] == os.path.dirname(interp["imports"])
        assert imported["expected"] == os.path.dirname(interp["expected"])

    # the whole picture once more, as one comparison each
    assert {u: x["stale"] for u, x in units.items()} == {
        s: any(f["id"] == "stale-process[apply]" and f["status"] == "fail"
               and f["subject"].startswith(s + " ") for f in data["findings"])
        for s in servers}
    assert st["applied"] == host["facts"]["tree"]["value"]["applied"]
    assert st["updated"] == host["facts"]["tree"]["value"]["updated"]
    inventory_python = [f for f in data["findings"] if f["id"] == "imported-tree[inventory-python]"]
    assert bool(inventory_python) is (st["interpreter"]["managed"] is False)
    return st, data


def test_fresh_after_apply_and_deploy(host_env, capsys) -> None:
    st, data = agree(host_env, capsys)
    assert not any(u["stale"] for u in st["units"])
    assert [a["name"] for a in st["applied"]] == [
        "default-thinking-reasoning", "triton-dsa-indexer", "indexer-bf16-gemm", MMA, MHC]
    assert st["interpreter"]["managed"] is True
    assert not [f for f in data["findings"] if f["id"].startswith("stale-process")
                and f["status"] != "pass"]
    # mma-splitk-decode runs in decode only: prefill never started with it
    units = {u["unit"]: u for u in st["units"]}
    assert f"{MMA}:" in units[D]["running_patches"]
    assert f"{MMA}:" not in units[P]["running_patches"]


def test_revert_and_apply_without_restart_are_stale_until_redeploy_or_restart(
        host_env, capsys) -> None:
    host = host_env["host"].name
    series = str(host_env["series"])

    # (b) revert two patches, no restart: both units stale, each for its own patches
    code, _, err = cli(capsys, "revert", MMA, MHC, "--host", host, "--series", series)
    assert code == 0, err
    st, data = agree(host_env, capsys)
    units = {u["unit"]: u for u in st["units"]}
    assert units[D]["stale"] and units[P]["stale"]
    assert units[D]["stale_reason"].startswith(f"started with {MMA}, {MHC} no longer applied")
    assert units[P]["stale_reason"].startswith(f"started with {MHC} no longer applied")
    assert [a["name"] for a in st["applied"]] == [
        "default-thinking-reasoning", "triton-dsa-indexer", "indexer-bf16-gemm"]

    # (c) redeploy: both restarted with the tree's patches, both fresh
    deploy(host_env, capsys)
    st, _ = agree(host_env, capsys)
    assert not any(u["stale"] for u in st["units"])
    assert {u["unit"]: u["main_pid"] for u in st["units"]} != {
        u: x["main_pid"] for u, x in units.items()}

    # (b) put the decode-only patch back, no restart: decode stale, prefill fresh
    time.sleep(1.1)                        # state.json's time has one-second resolution
    apply(host_env, capsys, "--exclude", f"{CLAMP},{MHC}")
    st, _ = agree(host_env, capsys)
    units = {u["unit"]: u for u in st["units"]}
    assert units[D]["stale"] and not units[P]["stale"]
    assert units[D]["stale_reason"].startswith(f"started without {MMA} (")

    # (c) the baseline with --restart: every unit restarted where needed, fresh
    apply(host_env, capsys, "--exclude", CLAMP, "--restart")
    st, _ = agree(host_env, capsys)
    assert not any(u["stale"] for u in st["units"])
    assert [a["name"] for a in st["applied"]][-2:] == [MMA, MHC]
