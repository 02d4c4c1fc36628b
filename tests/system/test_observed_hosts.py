"""Observed execution end to end (issues 14 and 23): on a real nspawn host, server
processes under the units `patchset deploy` rendered execute real patched functions of
the served tree, in the process SGLang would run them, and the audit, `patchset trace`
and `status` say what ran, what did not, and where there is no evidence.

The stand-in cannot run torch code, so the series here patches code it does run:
* per chat request, in the server's MAIN process, `TokenizerManager.generate_request`
  checks the request with the served tree's real `SamplingParams`
  (`srt/sampling/sampling_params.py`, standard library only);
* per forward pass, in the SCHEDULER process, the stand-in's `ModelRunner.forward` calls
  the served-tree functions its STANDIN_FORWARD_HOOKS name for that mode: here
  `default_cuda_graph_config` (srt/model_executor/cuda_graph_config.py, standard library
  only) in decode forwards. The scheduler imports that module, so every function of it is
  watched there.

The patches (in series order; `sp-verify` last, so it can be reverted alone):

* `shm-sweep` edits `cleanup_stale_shm`, which no process of the stand-in imports: after
  any traffic, no evidence (declared active, `observation` says why);
* `cg-parse` edits `parse_cuda_graph_config_arg`, in the module the scheduler imported,
  never called in a forward: after decode forwards, observed not to run
  (`trace[declared-active-not-run]`, inert);
* `cg-default` edits `default_cuda_graph_config`, tagged `prefill`: it runs in decode
  forwards -> observed, `trace[path-disagrees]` and, in the decode unit where its path
  makes it inert, `trace[inert-but-ran]`;
* `sp-normalize` edits `SamplingParams.normalize`, `requires` env E2E_NORMALIZE=1, which
  the units do not set: declared inert, yet it runs -> `trace[inert-but-ran]` (high);
* `sp-verify` edits `SamplingParams.verify`, no `requires`: observed active (main process).

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

from tests.hosts.hostsetup import ARGS, MODEL, TREE, VENV, checkpoint
from tests.hostutil import cli, free_ports, on_host
from tests.seriesfactory import PatchDef, build_series
from tests.standin.install import install_standin
from tests.system.test_audit_hosts import inventory

pytestmark = pytest.mark.hosts

P, D = "sglang-prefill.service", "sglang-decode.service"
SAMPLING = "python/sglang/srt/sampling/sampling_params.py"
SHM = "python/sglang/srt/utils/stale_shm_cleanup.py"
CG = "python/sglang/srt/model_executor/cuda_graph_config.py"
VERIFY_T = "sglang.srt.sampling.sampling_params:SamplingParams.verify"
NORMALIZE_T = "sglang.srt.sampling.sampling_params:SamplingParams.normalize"
SHM_T = "sglang.srt.utils.stale_shm_cleanup:cleanup_stale_shm"
CG_DEFAULT_T = "sglang.srt.model_executor.cuda_graph_config:default_cuda_graph_config"
CG_PARSE_T = "sglang.srt.model_executor.cuda_graph_config:parse_cuda_graph_config_arg"
HOOKS = "/etc/sglang/forward-hooks.json"


def insert_after(line: str, new: str):
    def edit(source: str) -> str:
        assert source.count(line + "\n") == 1, line
        return source.replace(line + "\n", line + "\n" + new + "\n")
    return edit


SERIES = [
    PatchDef("shm-sweep", {SHM: insert_after(
        "def cleanup_stale_shm() -> None:", '    logger.debug("stale shm sweep")')}),
    PatchDef("cg-parse", {CG: insert_after(
        "def parse_cuda_graph_config_arg(raw: str) -> Dict[str, Dict[str, Any]]:",
        "    raw = str(raw)")}),
    PatchDef("cg-default", {CG: insert_after(
        "def default_cuda_graph_config() -> CudaGraphConfig:", "    _ = Phase.ALL")},
        path="prefill"),
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
    on_host(host, f"mkdir -p /etc/sglang && echo '{json.dumps([{'mode': 'decode', 'call': CG_DEFAULT_T}])}' > {HOOKS}")
    # no startup warmup (SGLang's _execute_server_warmup runs forwards): the first audit
    # sees the servers before any forward pass
    inventory(obs_env, roles={"prefill": {"trace": False},
                              "decode": {"env": {"STANDIN_FORWARD_HOOKS": HOOKS}}},
              args=ARGS + ["--skip-server-warmup"])
    run(obs_env, capsys, "apply")
    install_standin(host, venv=VENV, tree=TREE)
    checkpoint(host)
    run(obs_env, capsys, "deploy")

    # Started, no request yet (the audit's own /health check goes through the main
    # process's request handling, as in SGLang, and runs no forward in a P/D decode):
    # nothing is observed not to run, no path is contradicted, no evidence for cg-parse.
    before = audit(obs_env, capsys)
    early = {f["id"] for f in before["findings"] if f["id"].startswith("trace[")}
    assert not early & {"trace[declared-active-not-run]", "trace[path-disagrees]"}, early
    st = states(before)
    assert st[(D, "shm-sweep")]["state"] == st[(D, "cg-parse")]["state"] == "active"
    assert st[(D, "cg-parse")]["evidence"] == "declared"
    assert "no decode forward pass after its code was watched" in \
        st[(D, "cg-parse")]["observation"]
    assert st[(D, "sp-normalize")]["declared"] in (None, "inert")  # /health may have run it

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
    [ran] = findings(data, "trace[inert-but-ran]")[:1]
    assert ran["severity"] == "high" and ran["status"] == "fail"
    assert {f["subject"] for f in findings(data, "trace[inert-but-ran]")} == {
        f"{D} sp-normalize", f"{D} cg-default"}

    # cg-parse: watched in the scheduler, decode forwards returned there, never called
    parse = st[(D, "cg-parse")]
    assert (parse["state"], parse["declared"], parse["contradiction"]) == (
        "inert", "active", "declared-active-not-run")
    [not_run] = findings(data, "trace[declared-active-not-run]")
    assert not_run["subject"] == f"{D} cg-parse" and not_run["patches"] == ["cg-parse"]
    assert "sglang::scheduler" in parse["reason"] and "decode forward pass" in parse["reason"]
    # cg-default: tagged prefill, ran in decode forwards of the decode scheduler
    default = st[(D, "cg-default")]
    assert default["modes"] == ["decode"] and default["evidence"] == "observed"
    [wrong] = findings(data, "trace[path-disagrees]")
    assert wrong["subject"] == f"{D} cg-default" and "decode forward passes" in wrong["found"]
    # shm-sweep: no process imports its module: no evidence after traffic either
    sweep = st[(D, "shm-sweep")]
    assert (sweep["state"], sweep["evidence"], sweep["contradiction"]) == (
        "active", "declared", None)
    assert sweep["observation"].startswith("no evidence yet:") and \
        "not watched (not imported in this process)" in sweep["observation"]

    # tracing off in prefill: every state declared, no trace finding about it
    for patch in ("sp-verify", "shm-sweep", "sp-normalize", "cg-parse"):
        assert st[(P, patch)]["evidence"] == "declared" and not st[(P, patch)]["ran"]
        assert st[(P, patch)]["observation"] is None
    assert all(not f["subject"].startswith(P) for f in data["findings"]
               if f["id"].startswith("trace"))

    # the ranking: observed above declared; a patch seen not to run in decode is a suspect
    # only through prefill (untraced, declared active), and its finding does not implicate it
    _, out, _ = run(obs_env, capsys, "audit", "--format", "json", "--symptom",
                    "decode-quality", want=None)
    suspects = {s["name"]: s for s in json.loads(out)["symptom"]["suspects"]}
    assert "(observed: it ran)" in suspects["sp-verify"]["reasons"][1]
    assert f"in {host.name}/{D}" in suspects["sp-verify"]["reasons"][1]
    assert suspects["sp-verify"]["score"] > suspects["cg-parse"]["score"]
    assert f"in {host.name}/{P}" in suspects["cg-parse"]["reasons"][1]
    assert not any("trace[declared-active-not-run]" in r for r in suspects["cg-parse"]["reasons"])

    # `patchset trace`: per process, per target, forwards per mode; exit 1 (contradictions)
    code, out, _ = run(obs_env, capsys, "trace", "--json", want=1)
    views = {v["server"]: v for v in json.loads(out)}
    assert views[P]["traced"] is False and views[D]["traced"] is True
    assert sorted(views[D]["contradictions"]) == ["cg-default", "cg-parse", "sp-normalize"]
    [main] = [p for p in views[D]["processes"] if p["pid"] == decode]
    rows = {t["target"]: t for t in main["targets"]}
    assert rows[VERIFY_T]["ran"] and rows[NORMALIZE_T]["ran"] and not rows[SHM_T]["ran"]
    assert main["forwards"] == {}                 # request handling only in the main process
    schedulers = [p for p in views[D]["processes"]
                  if (p["title"] or "").startswith("sglang::scheduler")]
    assert schedulers and schedulers[0]["forwards"].get("decode", 0) >= 1
    rows = {t["target"]: t for t in schedulers[0]["targets"]}
    assert rows[CG_DEFAULT_T]["ran"] and rows[CG_DEFAULT_T]["modes"] == ["decode"]
    assert not rows[CG_PARSE_T]["ran"] and rows[CG_PARSE_T]["watched"]
    assert not rows[VERIFY_T]["ran"]

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
    # (its derived guards, by name, include a scheduler.py test of tp_size, which this
    # unit runs at 2: declared unknown; the returned call makes it active, observed)
    assert f"loaded by pid {decode} (sp-verify:" in verify["reason"] and \
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
