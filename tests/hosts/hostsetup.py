"""The audit host as both tests/system/test_audit_hosts.py and bench/audit_bench.py set it
up (the tree, the stand-in venv, the checkpoint, a fake nvidia-smi, the units' extra args),
and free loopback ports for its units. Part of the test-host harness (tests.hosts), which
bench may import: it imports no test module.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from tests.hosts.ports import reserve_port

TREE, VENV = "/opt/sglang", "/opt/venv"
MODEL = "/models/DeepSeek-V4-Flash-NVFP4"

FAKE_SMI = """#!/bin/sh
# test double: four sm_120 GPUs, as `nvidia-smi --query-gpu=... --format=csv,noheader`
for i in 0 1 2 3; do
  echo "$i, GPU-0000000$i-aaaa-bbbb-cccc-000000000000, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 580.95.05"
done
"""

ARGS = ["--moe-runner-backend", "triton", "--attention-backend", "dsv4",
        "--reasoning-parser", "deepseek-v4"]


def checkpoint(host: Any) -> None:
    """The checkpoint (config.json, a sparse 20 GB safetensors shard and its index) and a
    fake nvidia-smi, written into a test host's live root (`host.live_root`)."""
    root = host.live_root / MODEL.lstrip("/")
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "num_hidden_layers": 43, "hc_mult": 4, "swiglu_limit": 10.0,
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}))
    tensors = {f"layers.{i}.{n}": {"dtype": "F32", "shape": [24, 16384], "data_offsets": [0, 4]}
               for i in (0, 42) for n in ("hc_attn_fn", "hc_ffn_fn")}
    tensors.update({"layers.3.ffn.experts.0.w1.weight": {"dtype": "U8", "shape": [8, 8],
                                                         "data_offsets": [0, 64]},
                    "layers.3.ffn.experts.0.w1.weight_scale": {"dtype": "F8_E4M3",
                                                               "shape": [8, 1],
                                                               "data_offsets": [0, 8]},
                    "layers.3.ffn.experts.0.w1.weight_scale_2": {"dtype": "F32", "shape": [],
                                                                 "data_offsets": [0, 4]}})
    header = json.dumps(tensors).encode()
    shard = root / "model-00001-of-00001.safetensors"
    with open(shard, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        handle.truncate(20 * 2**30)                       # sparse: 20 GB on paper
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: shard.name for name in tensors}}))
    smi = host.live_root / "usr/local/bin/nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)


def free_ports(n: int) -> list[int]:
    """Loopback ports free on the machine (the hosts share its network namespace) and
    reserved machine-wide for this process (tests.hosts.ports: parallel test workers never
    get the same one), in 30100-30999: above SGLang's default 30000-30099 and below the
    kernel's ephemeral range, so no outgoing connection squats one before its server binds."""
    return [reserve_port(30100, 31000) for _ in range(n)]
