"""The series' real patched kernels with patchset's tracer on and off (GPU).

Runs a child process twice, once without and once with the tracer installed exactly as
deploy installs it (sitecustomize.py + patchset_tracer.py first on PYTHONPATH,
PATCHSET_TRACE naming the derived targets, PATCHSET_TRACE_DIR for the records). The child
imports the patched sources of prepare_src.py through the import system (so the tracer's
finder sees them, as in a server), runs each patched op eagerly, then captures the same
calls in a CUDA graph and replays it, and hashes every output tensor's bytes. The parent
asserts the hashes are bitwise identical with the tracer on and off, lists the targets
the tracer recorded (and that nothing but the first call was recorded: graph replays run
no Python), and writes the result JSON.

Targets are the derived ones (README, "Observed execution"): split-K decode
(`flash_mla_with_kvcache_sm120`, `flash_mla_sparse_decode_triton`,
`_run_splitk_mma_sparse_decode` under their real module names), the Triton and bf16 torch
indexers and hc_pre_torch_impl. prepare_src.py cuts the indexer and mhc functions out of
their 600-line modules (which import half of SGLang) into dsv4_indexer_fns.py and
mhc_fns.py: there the same functions have those module names, and hc_pre_torch_impl is a
top-level function (in deepseek_v4.py it is DeepseekV4DecoderLayer.hc_pre.<locals>.
hc_pre_torch_impl).

    python bench/kernels/prepare_src.py --wheel sglang-0.5.14-...whl    # CPU, once
    python bench/kernels/trace_gpu.py --json bench/kernels/results/trace-h200-DATE.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
AGENT = ROOT / "patchset" / "agent"
FLASH = "sglang.srt.layers.attention.flash_mla_sm120"
TARGETS = {
    "mma-splitk-decode": [f"{FLASH}:flash_mla_with_kvcache_sm120",
                          f"{FLASH}_triton:flash_mla_sparse_decode_triton",
                          f"{FLASH}_triton:_run_splitk_mma_sparse_decode",
                          f"{FLASH}_triton:<module>"],
    "triton-dsa-indexer": ["dsv4_indexer_fns:fp8_paged_mqa_logits_triton_sm120"],
    "indexer-bf16-gemm": ["dsv4_indexer_fns:fp8_paged_mqa_logits_torch_sm120"],
    "mhc-bf16": ["mhc_fns:hc_pre_torch_impl"],
}


# ---------------------------------------------------------------- the child (GPU work)

def child(src: Path) -> dict:
    import importlib

    import torch
    sys.path.insert(0, str(HERE))
    import numerics as nx
    torch.manual_seed(0)
    out: dict[str, str] = {}
    patched = src / "patched"
    sys.path.insert(0, str(patched))
    os.environ["MMA_FLASHMLA"] = "1"
    entry = importlib.import_module(FLASH)
    importlib.import_module(f"{FLASH}_triton")
    ix = importlib.import_module("dsv4_indexer_fns")
    mhc = importlib.import_module("mhc_fns")
    dev, D = "cuda", nx.D
    B, H = 16, 64
    swa_cache, swa64 = nx.make_mla_cache(64, 128)
    c4_cache, c464 = nx.make_mla_cache(256, 64)
    q = torch.randn(B, 1, H, D, device=dev).to(torch.bfloat16)
    kw = dict(q=q, k_cache=swa_cache, head_dim_v=D, softmax_scale=D ** -0.5,
              indices=nx.make_indices(B, 128, swa64.shape[0]),
              topk_length=torch.randint(1, 129, (B,), device=dev, dtype=torch.int32),
              attn_sink=torch.randn(H, device=dev, dtype=torch.float32),
              extra_k_cache=c4_cache, extra_indices_in_kvcache=nx.make_indices(
                  B, 512, c464.shape[0]),
              extra_topk_length=torch.randint(1, 513, (B,), device=dev, dtype=torch.int32))
    width, pages = 16384, 16384 // nx.BS
    cache, _, _ = nx.make_index_cache(B * pages + 1)
    table = torch.randperm(B * pages + 1, device=dev)[: B * pages].int().view(B, pages)
    iq = torch.randn(B, 1, nx.NH, nx.HD, device=dev).to(torch.float8_e4m3fn)
    iw = torch.randn(B, nx.NH, device=dev) * 0.1
    sl = torch.full((B, 1), 1024, device=dev, dtype=torch.int32)
    x = torch.randn(128, 4, 4096, device=dev).to(torch.bfloat16)
    hc_fn = torch.randn(24, 16384, device=dev) * 16384 ** -0.5
    calls = {
        "decode": lambda: entry.flash_mla_with_kvcache_sm120(**kw)[0],
        "indexer_triton": lambda: ix.fp8_paged_mqa_logits_triton_sm120(
            iq, cache, iw, sl, table, None, width, False),
        "indexer_bf16": lambda: ix.fp8_paged_mqa_logits_torch_sm120(
            iq, cache, iw, sl, table, None, width, False),
        "mhc_bf16": lambda: mhc.hc_pre_torch_impl(x, hc_fn)[1],
    }
    for name, call in calls.items():
        out[f"{name}/eager"] = digest(call())
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):                # warm-up off the default stream
        for call in calls.values():
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = {name: call() for name, call in calls.items()}
    for replay in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for name, tensor in results.items():
            out[f"{name}/graph-replay-{replay}"] = digest(tensor)
    return {"digests": out, "device": torch.cuda.get_device_name(0),
            "python": sys.version.split()[0], "torch": torch.__version__}


def digest(tensor) -> str:
    data = tensor.detach().contiguous().cpu().view(-1).view(__import__("torch").uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


# ---------------------------------------------------------------- the parent

def run(site: Path, src: Path, traced: bool) -> tuple[dict, list[dict], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHSET_TRACE")}
    env["PYTHONPATH"] = os.pathsep.join([str(site / "trace"), env.get("PYTHONPATH", "")])
    records = site / ("records-on" if traced else "records-off")
    records.mkdir(mode=0o700)
    if traced:
        env["PATCHSET_TRACE"] = " ".join(f"{p}:{'0' * 12}=" + ",".join(t)
                                         for p, t in TARGETS.items())
        env["PATCHSET_TRACE_DIR"] = str(records)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--child", "--src", str(src)], env=env,
                          capture_output=True, text=True)
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({'traced' if traced else 'plain'}):\n{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    return result, recs, took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=HERE / "_src")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.src)))
        return 0
    with tempfile.TemporaryDirectory(prefix="trace-gpu-") as tmp:
        site = Path(tmp)
        (site / "trace").mkdir()
        shutil.copy(AGENT / "lib" / "tracer.py", site / "trace" / "patchset_tracer.py")
        shutil.copy(AGENT / "sitecustomize.py", site / "trace" / "sitecustomize.py")
        plain, none, t_off = run(site, args.src, False)
        traced, recs, t_on = run(site, args.src, True)
    same = plain["digests"] == traced["digests"]
    [rec] = [r for r in recs if r.get("hits")] or [{}]
    expected = {t for ts in TARGETS.values() for t in ts}
    recorded = sorted(rec.get("hits", {}))
    result = {
        "device": plain["device"], "python": plain["python"], "torch": plain["torch"],
        "date": time.strftime("%Y-%m-%d"), "mode": rec.get("mode"),
        "bitwise_identical": same, "outputs": len(plain["digests"]),
        "digests": plain["digests"], "recorded": recorded,
        "not_recorded": sorted(expected - set(recorded)),
        "unavailable": rec.get("unavailable", []), "records_without_tracer": len(none),
        "seconds_plain": round(t_off, 2), "seconds_traced": round(t_on, 2),
        "hits": rec.get("hits", {}),
    }
    print(f"{result['device']}, Python {result['python']}, torch {result['torch']}, "
          f"tracer mode {result['mode']}")
    print(f"{'output':40} {'tracer off == on'}")
    for key in plain["digests"]:
        print(f"{key:40} {plain['digests'][key] == traced['digests'].get(key)}")
    print(f"recorded targets ({len(recorded)} of {len(expected)}):")
    for target in recorded:
        via = rec["hits"][target].get("via")
        print(f"  {target}" + (f" (via {via})" if via else ""))
    for target in result["not_recorded"]:
        print(f"  NOT recorded: {target}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    assert same, "outputs differ with the tracer on"
    assert not none, "records written without the tracer"
    assert not result["not_recorded"], result["not_recorded"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
