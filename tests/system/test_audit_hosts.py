"""`patchset audit` on a real nspawn host (real systemd, real sshd) running the SGLang
stand-in under units that `patchset deploy` rendered, with the project's real series
applied: each scenario asserts exact patch states and check results.

The host gets a fake `nvidia-smi` (four sm_120 GPUs) and a checkpoint of config.json +
a sparse safetensors shard (hyper-connection tensors F32, NVFP4 expert tensors).
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path

import pytest
import yaml
from tests.audit_facts import synth

from tests.hosts.hostsetup import ARGS, MODEL, TREE, VENV, checkpoint
from tests.hosts.nspawn import TestHost
from tests.standin.install import install_standin
from tests.hostutil import cli, free_ports, on_host

pytestmark = pytest.mark.hosts

P, D = "sglang-prefill.service", "sglang-decode.service"
SECRET, TOKEN = "sk-audit-host-0123456789abcdef", "hf_AuditHostTokenABCDEFGH"
# (server, patch) -> state of the seed layout: this host as prepared, and the seed's facts
# (tests/audit_facts/seed.yaml; tests/unit/test_metrics.py, tests/system/test_prometheus.py)
SEED_STATES = {
    (P, "default-thinking-reasoning"): "active", (D, "default-thinking-reasoning"): "active",
    (P, "nvfp4-cutlass-swiglu-clamp"): "not-applied",
    (D, "nvfp4-cutlass-swiglu-clamp"): "not-applied",
    (P, "triton-dsa-indexer"): "gated-off", (D, "triton-dsa-indexer"): "active",
    (P, "indexer-bf16-gemm"): "active", (D, "indexer-bf16-gemm"): "inert",
    (P, "mma-splitk-decode"): "gated-off", (D, "mma-splitk-decode"): "active",
    (P, "mhc-bf16"): "active", (D, "mhc-bf16"): "active"}


def write_series(dest: Path, **changes: dict) -> Path:
    """A copy of the project's series, with some patches' fields changed."""
    root = Path(__file__).resolve().parents[2]
    series = synth.real_series(dest / "compose")
    src = Path(series.manifest)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src.parent / "patches", dest / "patches", dirs_exist_ok=True)
    doc = yaml.safe_load(src.read_text())
    for entry in doc["series"]:
        entry.update(changes.get(entry["name"], {}))
    (dest / "patches.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert root
    return dest / "patches.yaml"


@pytest.fixture(scope="module")
def env(host_factory, tmp_path_factory, host_client_key) -> dict:
    """One host for the module: the real series applied (all but the clamp patch), the
    stand-in venv, the checkpoint, hosts.yaml; `deploy(...)` rewrites hosts.yaml and deploys."""
    from tests.hosts.nspawn import write_known_hosts
    [host] = host_factory.start(1, prefix="audit")
    work = tmp_path_factory.mktemp("audit-hosts")
    known = write_known_hosts([host], work / "known_hosts")
    (work / "ssh_config").write_text("")
    series = write_series(work / "series")
    prefill, decode, bootstrap = free_ports(3)
    yield {"host": host, "work": work, "known": known, "series": series,
           "ports": {"prefill": prefill, "decode": decode, "bootstrap": bootstrap}}
    host_factory.stop([host])


@pytest.fixture()
def audit_env(env, monkeypatch, capsys):
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(env["known"]))
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(env["work"] / "ssh_config"))
    monkeypatch.setenv("PATCHSET_HOME", str(env["work"] / "home"))
    monkeypatch.chdir(env["work"])
    return env


def inventory(env: dict, roles: dict | None = None, serving: dict | None = None,
              args: list[str] | None = None) -> Path:
    host: TestHost = env["host"]
    ports = env["ports"]
    extra = list(args or ARGS)
    base = {"prefill": {"gpus": "0,1", "port": ports["prefill"],
                        "bootstrap_port": ports["bootstrap"], "extra_args": extra,
                        "env": {"TRITON_INDEXER": "0", "MMA_FLASHMLA": "0"}},
            "decode": {"gpus": "2,3", "port": ports["decode"], "extra_args": extra}}
    for role, settings in (roles or {}).items():
        base[role] = None if settings is None else {**base.get(role, {}), **settings}
    spec = {"address": host.ip, "port": host.port, "user": "root",
            "identity_file": str(host.client_key), "tree": TREE, "python": f"{VENV}/bin/python",
            "serving": {"model_path": MODEL, "transfer_backend": "fake",
                        "env": {"STANDIN_STARTUP_DELAY": "0.2"},
                        **(serving or {})},
            "roles": {r: s for r, s in base.items() if s is not None}}
    path = env["work"] / "hosts.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "default": host.name,
                                    "hosts": {host.name: spec}}, sort_keys=False))
    return path


def deploy(env: dict, capsys, **kw) -> None:
    inventory(env, **kw)
    code, _, err = cli(capsys, "deploy", env["host"].name, "--series", str(env["series"]))
    assert code == 0, err


def audit(env: dict, capsys, *extra: str, series: Path | None = None) -> tuple[int, dict]:
    code, out, err = cli(capsys, "audit", env["host"].name, "--format", "json",
                         "--series", str(series or env["series"]), *extra)
    assert out, err
    return code, json.loads(out)


def states(data: dict) -> dict[tuple[str, str], str]:
    return {(s["server"], s["patch"]): s["state"] for s in data["hosts"][0]["states"]}


def reason(data: dict, server: str, patch: str) -> str:
    return next(s["reason"] for s in data["hosts"][0]["states"]
                if s["server"] == server and s["patch"] == patch)


def finding(data: dict, check_id: str, subject: str = "") -> dict:
    hits = [f for f in data["findings"] if f["id"] == check_id and f["subject"].startswith(subject)]
    assert hits, f"no {check_id} on {subject!r}: " + ", ".join(
        sorted({f["id"] for f in data["findings"]}))
    return hits[0]


def not_passing(data: dict) -> set[tuple[str, str]]:
    return {(f["id"], f["status"]) for f in data["findings"]
            if f["status"] != "pass" and f["severity"] != "info"}


def prepare_host(env: dict, capsys) -> None:
    """A fresh tree with the real series (all but the clamp patch), the stand-in venv and
    the checkpoint; no units yet."""
    host = env["host"]
    on_host(host, f"rm -rf {TREE}")
    inventory(env)
    code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp", host.name,
                       "--series", str(env["series"]))
    assert code == 0, err
    install_standin(host, venv=VENV, tree=TREE)
    checkpoint(host)


def test_prepare(audit_env, capsys) -> None:
    prepare_host(audit_env, capsys)
    deploy(audit_env, capsys)


def test_seed_layout_states_checks_and_suspects(audit_env, capsys) -> None:
    code, data = audit(audit_env, capsys, "--symptom", "context-loss")
    assert code == 1
    assert {k: v for k, v in states(data).items()} == SEED_STATES
    assert reason(data, P, "mma-splitk-decode").startswith(f"gate MMA_FLASHMLA=0 in {P}")
    assert not_passing(data) == {("hazard[nvfp4-cutlass-no-swiglu-clamp]", "fail"),
                                 ("checkpoint-dtypes[narrowed]", "warn")}
    narrowed = finding(data, "checkpoint-dtypes[narrowed]")
    assert narrowed["found"] == "4 tensor(s) F32"
    reads = data["hosts"][0]["facts"]["checkpoints"][MODEL]["header_reads"]
    assert reads[0]["file_size"] == 20 * 2**30 and reads[0]["bytes_read"] == \
        8 + reads[0]["header_len"]
    assert finding(data, "imported-tree", P)["found"] == f"{TREE}/python/sglang"
    suspects = [s["name"] for s in data["symptom"]["suspects"]]
    assert suspects[:2] == ["mhc-bf16", "nvfp4-cutlass-no-swiglu-clamp"]
    assert suspects[-2:] == ["mma-splitk-decode", "triton-dsa-indexer"]
    assert data["symptom"]["next_steps"][0]["command"].startswith(
        f"patchset revert mhc-bf16 --host {audit_env['host'].name} --series "
        f"{shlex.quote(str(audit_env['series']))} && ssh -p "   # the audit was given --series
        f"{audit_env['host'].port} root@{audit_env['host'].ip} 'systemctl restart ")


def test_toggle_command_from_the_report_gates_the_patch_off(audit_env, capsys) -> None:
    _, data = audit(audit_env, capsys, "--symptom", "decode-quality")
    mma = next(s for s in data["symptom"]["suspects"] if s["name"] == "mma-splitk-decode")
    toggle = mma["steps"][0]
    assert toggle["kind"] == "toggle-gate"
    argv = shlex.split(toggle["command"])
    assert argv[:4] == ["ssh", "-p", str(audit_env["host"].port),
                        f"root@{audit_env['host'].ip}"]
    on_host(audit_env["host"], argv[4])                     # exactly what the report says
    deadline = time.monotonic() + 30
    while True:
        _, data = audit(audit_env, capsys)
        if finding(data, "server-health[health]", D)["status"] == "pass" or \
                time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert states(data)[(D, "mma-splitk-decode")] == "gated-off"
    assert reason(data, D, "mma-splitk-decode").startswith(f"gate MMA_FLASHMLA unset in {D}")
    assert finding(data, "gate-env", f"{D} MMA_FLASHMLA")["status"] == "pass"
    deploy(audit_env, capsys)                               # deploy puts the gate back
    assert states(audit(audit_env, capsys)[1])[(D, "mma-splitk-decode")] == "active"


def test_backend_flashinfer_clears_the_hazard(audit_env, capsys) -> None:
    deploy(audit_env, capsys, args=["--moe-runner-backend", "flashinfer_trtllm",
                                    "--attention-backend", "dsv4",
                                    "--reasoning-parser", "deepseek-v4"])
    try:
        _, data = audit(audit_env, capsys)
        f = finding(data, "hazard[nvfp4-cutlass-no-swiglu-clamp]", P)
        assert (f["status"], f["found"]) == ("pass", "server.moe_runner_backend=flashinfer_trtllm")
        assert ("hazard[nvfp4-cutlass-no-swiglu-clamp]", "fail") not in not_passing(data)
    finally:
        deploy(audit_env, capsys)


def test_decode_path_patch_in_a_prefill_unit_is_inert(audit_env, capsys) -> None:
    series = write_series(audit_env["work"] / "series-decode-path",
                          **{"mma-splitk-decode": {"path": "decode"}})
    deploy(audit_env, capsys, roles={"prefill": {"env": {"MMA_FLASHMLA": "1",
                                                         "TRITON_INDEXER": "0"}}})
    try:
        _, data = audit(audit_env, capsys, series=series)
        assert states(data)[(P, "mma-splitk-decode")] == "inert"
        assert reason(data, P, "mma-splitk-decode").startswith(
            f"path decode: {P} serves prefill only (server.disaggregation_mode (server_info): "
            "prefill)")
        assert states(data)[(D, "mma-splitk-decode")] == "active"
    finally:
        deploy(audit_env, capsys)


def test_stale_process_after_an_apply_without_restart(audit_env, capsys) -> None:
    """A process started before a revert is judged by what it loaded (its
    PATCHSET_PATCHES), not by the tree on disk: the reverted mhc-bf16 stays live and a
    suspect, every other patch keeps the state it had; the process is still stale."""
    host = audit_env["host"]
    _, before = audit(audit_env, capsys)
    time.sleep(1.1)                         # state.json's time has one-second resolution
    code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp,mhc-bf16",
                       host.name, "--series", str(audit_env["series"]))
    assert code == 0, err
    try:
        _, data = audit(audit_env, capsys)
        st = states(data)
        assert st[(P, "mhc-bf16")] == states(before)[(P, "mhc-bf16")] == "active"
        assert reason(data, P, "mhc-bf16").startswith("loaded by pid ")
        assert "mhc-bf16:" in reason(data, P, "mhc-bf16") and \
            "no longer on disk: restart to unload" in reason(data, P, "mhc-bf16")
        assert st == states(before)             # judged by what the processes loaded
        assert finding(data, "stale-process[apply]", P)["status"] == "fail"
        assert finding(data, "stale-process[apply]", P)["message"].startswith(
            f"started with mhc-bf16 no longer applied (PATCHSET_PATCHES of pid ")
        assert finding(data, "stale-process[apply]", D)["status"] == "fail"
    finally:
        code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp",
                           host.name, "--series", str(audit_env["series"]), "--restart")
        assert code == 0, err
    _, data = audit(audit_env, capsys)
    stale = [(f["id"], f["subject"], f["message"]) for f in data["findings"]
             if f["status"] != "pass" and f["id"] in ("stale-process[apply]",
                                                      "stale-process[changed]")]
    assert stale == []


def test_hand_edit_and_foreign_commit(audit_env, capsys) -> None:
    host = audit_env["host"]
    series = synth.real_series(audit_env["work"] / "compose2")
    path = series.by_name()["mhc-bf16"].files[0].path
    on_host(host, f"echo '# hand edit' >> {TREE}/{path}")
    try:
        _, data = audit(audit_env, capsys)
        assert states(data)[(P, "mhc-bf16")] == "drifted"
        edit = finding(data, "tree-drift[hand-edit]")
        assert edit["status"] == "fail" and edit["patches"] == ["mhc-bf16"]
    finally:
        on_host(host, f"git -C {TREE} checkout -- {path}")
    on_host(host, f"cd {TREE} && echo x > LOCAL_NOTES && git add LOCAL_NOTES && "
                  "git -c user.name=op -c user.email=op@x commit -qm 'local hack'")
    try:
        _, data = audit(audit_env, capsys)
        f = finding(data, "foreign-commits[commit]")
        assert f["status"] == "fail" and f["found"].endswith("local hack")
        assert states(data)[(P, "mhc-bf16")] == "active"      # its files are intact
    finally:
        on_host(host, f"cd {TREE} && git reset -q --hard HEAD~1")


def test_secrets_in_env_and_server_args_are_never_shown(audit_env, capsys, tmp_path) -> None:
    deploy(audit_env, capsys, args=ARGS + ["--api-key", SECRET], serving={
        "env": {"STANDIN_STARTUP_DELAY": "0.2", "HF_TOKEN": TOKEN}})
    try:
        _, data = audit(audit_env, capsys)
        # deploy moved `--api-key` of extra_args into the root-only --config file: the
        # command line is clean; the gatherer reads the key there (on the host) to get
        # /server_info, which still serves it (upstream behaviour)
        assert finding(data, "secrets[cmdline]", P)["status"] == "pass"
        config = finding(data, "secrets[config-file]", P)
        assert (config["status"], config["found"]) == ("pass", "mode 0600 holding api-key")
        assert finding(data, "secrets[server-info]", P)["found"] == "api_key"
        assert finding(data, "server-health[health]", P)["status"] == "pass"   # key used
        environ = data["hosts"][0]["facts"]["servers"][0]["environ"]["value"]
        assert environ["HF_TOKEN"].startswith("<redacted:")
        for fmt in ("terminal", "md", "html", "json", "junit"):
            out = tmp_path / f"report.{fmt}"
            code, _, err = cli(capsys, "audit", audit_env["host"].name, "--format", fmt,
                               "-o", str(out), "--series", str(audit_env["series"]),
                               "--symptom", "context-loss")
            text = out.read_text()
            assert code == 1 and text, err
            assert SECRET not in text and TOKEN not in text, fmt
    finally:
        deploy(audit_env, capsys)


# ------------------------------------------------- issue 23: evidence that holds after traffic

def _post(url: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def _verdicts(data: dict) -> tuple[dict, set, list]:
    """Every state (with its contradiction), every hazard finding and the ranking."""
    st = {(s["server"], s["patch"]): (s["state"], s["contradiction"])
          for s in data["hosts"][0]["states"]}
    hazards = {(f["id"], f["subject"], f["status"]) for f in data["findings"]
               if f["id"].startswith("hazard")}
    return st, hazards, [s["name"] for s in data["symptom"]["suspects"]]


def _forwards(env: dict, capsys, server: str) -> dict[str, int]:
    """Forward passes per mode the tracer counted in `server`'s processes (`patchset
    trace`): that traffic really ran the stand-in's forwards, in its scheduler."""
    code, out, err = cli(capsys, "trace", env["host"].name, "--json", "--series",
                         str(env["series"]))
    assert code in (0, 1), err
    view = next(v for v in json.loads(out) if v["server"] == server)
    total: dict[str, int] = {}
    for proc in view["processes"]:
        for mode, n in proc["forwards"].items():
            total[mode] = total.get(mode, 0) + n
    return total


def test_traffic_through_the_router_changes_no_state_hazard_or_ranking(audit_env,
                                                                       capsys) -> None:
    """The full seed layout, traced, with prefill/decode/router: right after deploy and
    after chat requests through the router, a request rejected with 400, health checks,
    the states, hazards and ranking are the same; the kernel patches (whose modules the
    stand-in never imports) stay declared with no evidence; the forwards did run, in the
    schedulers only."""
    [router] = free_ports(1)
    prepare_host(audit_env, capsys)
    deploy(audit_env, capsys, roles={"router": {"port": router, "host": "127.0.0.1"}})
    try:
        _, before = audit(audit_env, capsys, "--symptom", "context-loss")
        assert states(before) == SEED_STATES
        decode_url = f"http://127.0.0.1:{audit_env['ports']['decode']}"
        warmup = _forwards(audit_env, capsys, D)      # SGLang's startup warmup request
        status, _ = _post(f"{decode_url}/generate",
                          {"text": "a b", "sampling_params": {"top_p": 1.5}})
        assert status == 400                          # rejected: runs no forward
        assert _forwards(audit_env, capsys, D) == warmup
        _, rejected = audit(audit_env, capsys, "--symptom", "context-loss")
        assert _verdicts(rejected) == _verdicts(before)
        for _ in range(3):
            status, answer = _post(f"http://127.0.0.1:{router}/v1/chat/completions", {
                "messages": [{"role": "user", "content": "the token is X. which token?"}],
                "max_tokens": 6, "temperature": 0})
            assert status == 200 and answer["object"] == "chat.completion"
        assert _forwards(audit_env, capsys, D).get("decode", 0) > warmup.get("decode", 0)
        assert _forwards(audit_env, capsys, P).get("extend", 0) >= 1
        _, after = audit(audit_env, capsys, "--symptom", "context-loss")
        assert _verdicts(after) == _verdicts(before)
        kernels = ("mhc-bf16", "mma-splitk-decode", "triton-dsa-indexer")
        for st in after["hosts"][0]["states"]:
            if st["patch"] in kernels and st["state"] == "active":
                assert st["evidence"] == "declared", st
                assert st["observation"].startswith("no evidence yet:"), st
        assert not [f for f in after["findings"] if f["id"].startswith("trace[") and
                    f["status"] == "fail"]
    finally:
        deploy(audit_env, capsys)


def test_a_stale_process_keeps_its_loaded_fix_and_suspect_after_traffic(audit_env,
                                                                        capsys) -> None:
    """The clamp patch and mhc-bf16 loaded at start, then reverted on disk without a
    restart: after traffic the hazard the loaded clamp fixes stays cleared, mhc-bf16 stays
    a suspect."""
    host = audit_env["host"]
    [router] = free_ports(1)
    deploy(audit_env, capsys, roles={"router": {"port": router, "host": "127.0.0.1"}})
    code, _, err = cli(capsys, "apply", host.name, "--series", str(audit_env["series"]),
                       "--restart")
    assert code == 0, err
    try:
        time.sleep(1.1)                       # state.json's time has one-second resolution
        code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp,mhc-bf16",
                           host.name, "--series", str(audit_env["series"]))
        assert code == 0, err
        for _ in range(2):
            status, _ = _post(f"http://127.0.0.1:{router}/v1/chat/completions", {
                "messages": [{"role": "user", "content": "one two three"}],
                "max_tokens": 4, "temperature": 0})
            assert status == 200
        assert _forwards(audit_env, capsys, D).get("decode", 0) >= 1
        _, data = audit(audit_env, capsys, "--symptom", "context-loss")
        hazards = {f["subject"].split(":")[0]: f["status"] for f in data["findings"]
                   if f["id"] == "hazard[nvfp4-cutlass-no-swiglu-clamp]"}
        assert "fail" not in hazards.values(), hazards
        assert states(data)[(P, "nvfp4-cutlass-swiglu-clamp")] != "not-applied"
        assert states(data)[(P, "mhc-bf16")] == "active"
        assert "no longer on disk: restart to unload" in reason(data, P, "mhc-bf16")
        assert "mhc-bf16" in [s["name"] for s in data["symptom"]["suspects"]]
    finally:
        code, _, err = cli(capsys, "apply", "--exclude", "nvfp4-cutlass-swiglu-clamp",
                           host.name, "--series", str(audit_env["series"]), "--restart")
        assert code == 0, err
        deploy(audit_env, capsys)


def test_an_undeclared_guard_off_its_default_makes_the_patch_unknown_in_that_role_only(
        audit_env, capsys) -> None:
    """Call-path guards no `requires` declares (patchset/analysis/guards.py), read live: the decode
    server runs with SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=1 (deepseek_v4_backend.py:1402
    sends extend batches past mma-splitk-decode's entry): the patch is unknown there, the
    prefill server (same patch, no such setting) keeps its state, every other state is the
    seed's. (The ServerArgs guard --enable-deepseek-v4-fp4-indexer is not used here: the
    pinned server refuses it on anything but SM100, server_args.py:5921.)"""
    deploy(audit_env, capsys, roles={
        "decode": {"env": {"SGLANG_OPT_FLASHMLA_SPARSE_PREFILL": "1"}},
        "prefill": {"env": {"TRITON_INDEXER": "0", "MMA_FLASHMLA": "1"}}})
    try:
        _, data = audit(audit_env, capsys)
        got = states(data)
        assert got[(D, "mma-splitk-decode")] == "unknown"
        assert reason(data, D, "mma-splitk-decode") == (
            "undeclared guard SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=1 (python/sglang/srt/layers/"
            "attention/deepseek_v4_backend.py:1402)")
        assert got[(P, "mma-splitk-decode")] == "active"         # gate on, no such setting
        changed = {k for k, v in got.items() if SEED_STATES.get(k) != v}
        assert changed == {(P, "mma-splitk-decode"), (D, "mma-splitk-decode")}, changed
    finally:
        deploy(audit_env, capsys)
