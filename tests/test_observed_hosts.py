"""Observed execution end to end (issue 14, point 8): on a real nspawn host, server
processes under the units `patchset deploy` rendered execute real patched functions of
the served tree per request, and the audit, `patchset trace` and `status` say what ran.

The stand-in cannot run torch code, so the series here patches code it does run: each
chat request goes through `TokenizerManager.generate_request` (module and qualname as in
0.5.14: the tracer's marker of served work), which checks the request with the served
tree's real `SamplingParams` (`srt/sampling/sampling_params.py`, standard library only;
tests/standin/payload/sglang_standin/tokenizer_manager.py). The three patches are real
diffs of that file and of one the stand-in never runs (in series order; `sp-verify`
last, so it can be reverted alone):

* `sp-verify` edits `SamplingParams.verify`, no `requires`: declared active, runs per
  request -> observed active (pid, first call);
* `shm-sweep` edits `cleanup_stale_shm` (srt/utils/stale_shm_cleanup.py), no `requires`:
  declared active, never runs -> after work, `trace[declared-active-not-run]`, inert;
* `sp-normalize` edits `SamplingParams.normalize`, `requires` env E2E_NORMALIZE=1, which
  the units do not set: declared inert, yet it runs -> `trace[inert-but-ran]` (high).

The prefill role runs with `trace: false` (its states say `evidence: declared`); the
decode role is traced. Reverting `sp-verify` without a restart leaves the decode process
running it: it stays a suspect, "loaded by pid N ... no longer on disk".
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from bench.hostsetup import MODEL, TREE, VENV, checkpoint
from hostutil import cli, free_ports, on_host
from seriesfactory import PatchDef, build_series
from tests.standin.install import install_standin
from test_audit_hosts import inventory

P, D = "sglang-prefill.service", "sglang-decode.service"
SAMPLING = "python/sglang/srt/sampling/sampling_params.py"
SHM = "python/sglang/srt/utils/stale_shm_cleanup.py"
VERIFY_T = "sglang.srt.sampling.sampling_params:SamplingParams.verify"
NORMALIZE_T = "sglang.srt.sampling.sampling_params:SamplingParams.normalize"
SHM_T = "sglang.srt.utils.stale_shm_cleanup:cleanup_stale_shm"


def insert_after(line: str, new: str):
    def edit(source: str) -> str:
        assert source.count(line + "\n") == 1, line
        return source.replace(line + "\n", line + "\n" + new + "\n")
    return edit


SERIES = [
    PatchDef("shm-sweep", {SHM: insert_after(
        "def cleanup_stale_shm() -> None:", '    logger.debug("stale shm sweep")')}),
    PatchDef("sp-normalize", {SAMPLING: insert_after(
        "    def normalize(self, tokenizer):", "        tokenizer = tokenizer")},
        requires=[{"fact": "env.E2E_NORMALIZE", "op": "eq", "value": "1",
                   "why": "the e2e claim under test: normalize runs only with this set"}]),
    PatchDef("sp-verify", {SAMPLING: insert_after(
        "    def verify(self, vocab_size):", "        vocab_size = int(vocab_size)")}),
]


@pytest.fixture(scope="module")
def env(host_factory, tmp_path_factory, host_client_key, pinned_base) -> dict:
    from tests.hosts.nspawn import write_known_hosts
    [host] = host_factory.start(1, prefix="observed")
    work = tmp_path_factory.mktemp("observed-hosts")
    known = write_known_hosts([host], work / "known_hosts")
    (work / "ssh_config").write_text("")
    series = build_series(pinned_base, work / "series", SERIES)
    prefill, decode, bootstrap = free_ports(3)
    yield {"host": host, "work": work, "known": known, "series": series,
           "ports": {"prefill": prefill, "decode": decode, "bootstrap": bootstrap}}
    host_factory.stop([host])


@pytest.fixture()
def obs_env(env, monkeypatch):
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(env["known"]))
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(env["work"] / "ssh_config"))
    monkeypatch.setenv("PATCHSET_HOME", str(env["work"] / "home"))
    monkeypatch.chdir(env["work"])
    return env


def run(env: dict, capsys, *argv: str, want: int | None = 0) -> tuple[int, str, str]:
    code, out, err = cli(capsys, *argv, env["host"].name, "--series", str(env["series"]))
    assert want is None or code == want, (argv, code, err)
    return code, out, err


def audit(env: dict, capsys) -> dict:
    _, out, _ = run(env, capsys, "audit", "--format", "json", want=None)
    return json.loads(out)


def states(data: dict) -> dict[tuple[str, str], dict]:
    return {(s["server"], s["patch"]): s for s in data["hosts"][0]["states"]}


def findings(data: dict, check: str) -> list[dict]:
    return [f for f in data["findings"] if f["id"] == check]


def main_pid(env: dict, unit: str) -> int:
    return int(on_host(env["host"], f"systemctl show -p MainPID --value {unit}").strip())


def chat(env: dict, role: str) -> dict:
    """One chat request, straight to a server (the stand-in answers it in every mode)."""
    url = f"http://{env['host'].ip}:{env['ports'][role]}/v1/chat/completions"
    body = json.dumps({"messages": [{"role": "user", "content": "token is X; which token?"}],
                       "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return json.loads(resp.read())


def test_what_ran_per_process(obs_env, capsys) -> None:
    host = obs_env["host"]
    on_host(host, f"rm -rf {TREE}")
    inventory(obs_env, roles={"prefill": {"trace": False}})
    run(obs_env, capsys, "apply")
    install_standin(host, venv=VENV, tree=TREE)
    checkpoint(host)
    run(obs_env, capsys, "deploy")

    # Started, no request yet: records exist, nothing contradicts (no work was served).
    before = audit(obs_env, capsys)
    assert [f["subject"] for f in findings(before, "trace") if f["status"] == "pass"] == [
        f"{D} (pid {main_pid(obs_env, D)})"]
    assert all(not f["id"].startswith("trace[") for f in before["findings"]), [
        f["id"] for f in before["findings"] if f["id"].startswith("trace[")]
    st = states(before)
    assert st[(D, "shm-sweep")]["state"] == "active"
    assert st[(D, "sp-normalize")]["state"] == "inert"

    for role in ("decode", "decode", "prefill"):
        assert chat(obs_env, role)["object"] == "chat.completion"

    data = audit(obs_env, capsys)
    st = states(data)
    decode = main_pid(obs_env, D)
    verify = st[(D, "sp-verify")]
    assert (verify["state"], verify["evidence"], verify["contradiction"]) == (
        "active", "observed", None)
    assert [(r["pid"], r["target"]) for r in verify["ran"]] == [(decode, VERIFY_T)]
    assert verify["ran"][0]["first"] <= time.time()

    normalize = st[(D, "sp-normalize")]
    assert (normalize["state"], normalize["declared"], normalize["contradiction"]) == (
        "active", "inert", "inert-but-ran")
    [ran] = findings(data, "trace[inert-but-ran]")
    assert ran["subject"] == f"{D} sp-normalize" and ran["severity"] == "high"
    assert ran["status"] == "fail" and ran["patches"] == ["sp-normalize"]

    sweep = st[(D, "shm-sweep")]
    assert (sweep["state"], sweep["declared"], sweep["contradiction"]) == (
        "inert", "active", "declared-active-not-run")
    [not_run] = findings(data, "trace[declared-active-not-run]")
    assert not_run["subject"] == f"{D} shm-sweep" and not_run["patches"] == ["shm-sweep"]
    assert "none of its code ran" in sweep["reason"]

    # tracing off in prefill: every state declared, no trace finding about it
    for patch in ("sp-verify", "shm-sweep", "sp-normalize"):
        assert st[(P, patch)]["evidence"] == "declared" and not st[(P, patch)]["ran"]
    assert all(not f["subject"].startswith(P) for f in data["findings"]
               if f["id"].startswith("trace"))

    # the ranking: observed above declared; a patch seen not to run in decode is a suspect
    # only through prefill (untraced, declared active), and its finding does not implicate it
    _, out, _ = run(obs_env, capsys, "audit", "--format", "json", "--symptom",
                    "decode-quality", want=None)
    suspects = {s["name"]: s for s in json.loads(out)["symptom"]["suspects"]}
    assert "(observed: it ran)" in suspects["sp-verify"]["reasons"][1]
    assert f"in {host.name}/{D}" in suspects["sp-verify"]["reasons"][1]
    assert suspects["sp-verify"]["score"] > suspects["shm-sweep"]["score"]
    assert f"in {host.name}/{P}" in suspects["shm-sweep"]["reasons"][1]
    assert not any("trace[declared-active-not-run]" in r for r in suspects["shm-sweep"]["reasons"])

    # `patchset trace`: per process, per target; exit 1 for the contradictions
    code, out, _ = run(obs_env, capsys, "trace", "--json", want=1)
    views = {v["server"]: v for v in json.loads(out)}
    assert views[P]["traced"] is False and views[D]["traced"] is True
    assert sorted(views[D]["contradictions"]) == ["shm-sweep", "sp-normalize"]
    [main] = [p for p in views[D]["processes"] if p["pid"] == decode]
    rows = {t["target"]: t for t in main["targets"]}
    assert rows[VERIFY_T]["ran"] and rows[NORMALIZE_T]["ran"] and not rows[SHM_T]["ran"]
    assert any(t["ran"] and t["patches"] == ["~work"] for t in main["targets"])
    children = [p for p in views[D]["processes"] if p["pid"] != decode]
    assert children and all(not t["ran"] for p in children for t in p["targets"]
                            if t["patches"] != ["~work"])

    # stale but loaded: sp-verify reverted on disk, the decode process still runs it
    time.sleep(1.1)                         # state.json's time has one-second resolution
    code, _, err = cli(capsys, "revert", "sp-verify", "--host", host.name, "--series",
                       str(obs_env["series"]))
    assert code == 0, err
    assert "sp-verify" not in on_host(host, f"cat {TREE}/.patchset/state.json")
    chat(obs_env, "decode")
    data = audit(obs_env, capsys)
    verify = states(data)[(D, "sp-verify")]
    assert verify["state"] == "active" and verify["evidence"] == "observed"
    assert verify["reason"].startswith(f"loaded by pid {decode}") and \
        "no longer on disk: restart to unload" in verify["reason"]
    assert any(f["subject"].startswith(D) and f["status"] == "fail"
               for f in findings(data, "stale-process[apply]"))
    _, out, _ = run(obs_env, capsys, "status", "--json", want=1)
    units = {u["unit"]: u for u in json.loads(out)[0]["units"]}
    assert units[D]["stale"] and "sp-verify" in units[D]["stale_reason"]

    # restarted on the reverted tree: the process runs what is on disk, evidence again
    run(obs_env, capsys, "apply", "--exclude", "sp-verify", "--restart")
    chat(obs_env, "decode")
    data = audit(obs_env, capsys)
    st = states(data)
    assert st[(D, "sp-verify")]["state"] == "not-applied"
    assert st[(D, "sp-normalize")]["contradiction"] == "inert-but-ran"
    assert main_pid(obs_env, D) != decode
