"""The gatherer on this machine against a running SGLang stand-in (tests/standin): real
/proc, real HTTP, real safetensors files, the real pinned tree, secrets redacted on the
"host" before anything is returned."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from patchset.agent.lib.records import TensorPattern
from patchset.auditor import api, hostfacts, report
from patchset.agent import gather
from patchset.agent.lib import wire
from patchset.transport import AGENT_NAME, agent_files, bundle
from tests.hosts.ports import reserve_port
from tests.standin.install import install_standin_local

SECRET, TOKEN = "sk-gather-0123456789abcdef", "hf_GatherTokenABCDEFGHIJ"


def free_port() -> int:
    return reserve_port(32000, 33000)


def shard(path: Path, tensors: dict) -> int:
    header = json.dumps(tensors).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    os.truncate(path, 64 * 2**30)
    return len(header)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("model")
    (root / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v4", "swiglu_limit": 10.0,
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}))
    shard(root / "model-00001-of-00001.safetensors", {
        "layers.0.hc_attn_fn": {"dtype": "F32", "shape": [24, 16384], "data_offsets": [0, 8]}})
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "layers.0.hc_attn_fn": "model-00001-of-00001.safetensors"}}))
    return root


@pytest.fixture(scope="module")
def server(pinned_base, model: Path, tmp_path_factory) -> Iterator[dict]:
    venv = tmp_path_factory.mktemp("standin") / "venv"
    python = install_standin_local(venv, pinned_base.repo)
    port = free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8",
           "STANDIN_STARTUP_DELAY": "0.1", "SPT_NOENV": "1", "CUDA_VISIBLE_DEVICES": "0,1",
           "MMA_FLASHMLA": "1", "HF_TOKEN": TOKEN}
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--tp-size", "2",
            "--port", str(port), "--host", "127.0.0.1", "--moe-runner-backend", "triton",
            "--api-key", SECRET]
    log = open(tmp_path_factory.mktemp("log") / "server.log", "wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/health",
                                         headers={"Authorization": f"Bearer {SECRET}"})
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "stand-in did not start"
        time.sleep(0.2)
    yield {"pid": proc.pid, "port": port, "tree": pinned_base.repo, "python": python}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def gathered(server) -> dict:
    return wire.encode_result(gather.serve(wire.AuditRequest(
        tree=str(server["tree"]), package="sglang", tensors=[TensorPattern(pattern="*hc_attn_fn")])))


def test_gather_finds_the_server_its_children_and_its_facts(server, gathered, model) -> None:
    assert gathered["ok"], gathered
    raw = gathered["raw"]
    mine = [s for s in raw["servers"] if s["pid"] == server["pid"]]
    assert len(mine) == 1
    srv = mine[0]
    assert sorted(c["title"] for c in srv["children"]) == [
        "sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    facts = hostfacts.build("localhost", wire.decode_result("audit", gathered))
    found = next(s for s in facts.servers if s.main.pid == server["pid"])
    assert found.server_info.known, found.server_info.reason      # authenticated with the key
    assert found.server_info.value["moe_runner_backend"] == "triton"
    assert found.server_info.value["tp_size"] == 2
    assert found.imports.known, found.imports.reason
    assert found.imports.value["origin"] == str(server["tree"] / "python/sglang/__init__.py")
    assert found.health.value == {"status": 200, "ok": True, "error": None}
    sched = found.schedulers[0].environ.value
    assert sched["MMA_FLASHMLA"] == "1" and sched["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert sched["NCCL_CUMEM_ENABLE"] == "0"      # the engine's own edit, only in children
    ckpt = facts.checkpoints[str(model)]
    assert ckpt.tensors.value["layers.0.hc_attn_fn"]["dtype"] == "F32"
    assert ckpt.header_reads[0]["bytes_read"] == 8 + ckpt.header_reads[0]["header_len"]
    assert found.main.started is not None and abs(found.main.started - time.time()) < 600


def test_secrets_are_redacted_on_the_host_with_comparable_tags(gathered, server) -> None:
    text = json.dumps(gathered)
    assert SECRET not in text and TOKEN not in text
    facts = hostfacts.build("localhost", wire.decode_result("audit", gathered))
    found = next(s for s in facts.servers if s.main.pid == server["pid"])
    key_arg = found.argv[found.argv.index("--api-key") + 1]
    assert key_arg.startswith("<redacted:") and found.server_info.value["api_key"] == key_arg
    assert found.main.environ.value["HF_TOKEN"].startswith("<redacted:")


def test_audit_on_localhost_end_to_end(server, model) -> None:
    from tests.audit_facts import synth

    from patchset.connect.local import LocalTransport
    series = synth.real_series(model.parent / "series")
    rep = api.audit(series, [LocalTransport(server["tree"])], "context-loss")
    data = report.to_dict(rep)
    assert report.validate(data) == []
    states = {s["patch"]: s for s in data["hosts"][0]["states"]
              if s["server"] == f"pid {server['pid']}"}
    assert states["mhc-bf16"]["state"] == "not-applied"        # the cache tree is pristine
    assert SECRET not in json.dumps(data)


def test_bundle_holds_only_stdlib_modules() -> None:
    files = agent_files()
    assert f"{AGENT_NAME}/gather.py" in files and f"{AGENT_NAME}/engine.py" in files
    assert f"{AGENT_NAME}/lib/facts/gpu.py" in files and f"{AGENT_NAME}/lib/redact.py" in files
    for name, data in files.items():
        text = data.decode()
        for heavy in ("import yaml", "import jinja2", "import rich", "import typer",
                      "import fabric", "import paramiko", "from patchset.series.model", "from ..model"):
            assert heavy not in text, f"{name} imports {heavy}"
    assert len(bundle(wire.AuditRequest())) < 200_000


def test_probes_against_the_stand_in(server) -> None:
    from patchset.isolate.measure import probe
    url = f"http://127.0.0.1:{server['port']}"
    result = probe.needle(url, 3000, SECRET)
    assert result["ok"] and result["answer"] == result["token"], result
    assert result["usage"]["prompt_tokens"] > 3000
    assert probe.throughput(url, 4, SECRET)["ok"]
    assert probe.main(["needle", "--url", "http://127.0.0.1:1", "--tokens", "100"]) == 3
