"""Numerics and timing of each numerics-changing patch's op against upstream v0.5.14's op
and a float64 reference, at DeepSeek-V4 shapes, on fresh random (never zero) inputs.

    python bench/kernels/prepare_src.py --wheel sglang-0.5.14-...whl   # -> bench/kernels/_src
    python bench/kernels/numerics.py --src bench/kernels/_src [--op decode,indexer,mhc,swiglu]
                                     [--json FILE] [--small]

For every op and shape it prints rel = ||out - ref|| / ||ref|| of the upstream and the
patched version (ref = the same function in float64) and the median time of both
(triton.testing.do_bench), with the GPU name and compute capability.  Outputs are checked
finite and written everywhere (the allocator is filled with NaN before each checked
call).  --small runs tiny shapes; with TRITON_INTERPRET=1 and no GPU it checks the Triton
kernels on the CPU (no timing).

ops
  decode   upstream _run_triton_sparse_decode vs the split-K kernel (mma-splitk-decode),
           64 heads x 512, top-k 512, DeepSeek-V4 FP8 page layout; also the entry point
           flash_mla_with_kvcache_sm120 (SWA + extra cache + attention sink) with
           MMA_FLASHMLA unset (must equal upstream bit for bit) and =1.
  indexer  upstream fp8_paged_mqa_logits_torch_sm120 vs the same with the bf16 bmm
           (indexer-bf16-gemm) and the Triton kernel (triton-dsa-indexer), 64 heads x 128,
           contexts to 64k; time vs page-table width; top-512 agreement with the reference.
  mhc      hc_pre_torch_impl mixes, [T, 16384] x [16384, 24], T to 32k (mhc-bf16).
  swiglu   silu_and_mul (upstream cutlass_moe_fp4) vs the clamped silu_and_mul_clamp
           (nvfp4-cutlass-swiglu-clamp), both as torch emulations of the JIT kernels'
           arithmetic (bf16 clamp, fp32 math, bf16 store): the kernels need a full SGLang.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import torch
import triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRET:
    # Triton 3.6's interpreter multiplies bf16 dot operands as their raw uint16 bits
    # (and needs numpy < 2 for range() over its 1-element scalars): widen bf16 first.
    import numpy as np
    from triton.runtime import interpreter as _interp

    _dot = _interp.InterpreterBuilder.create_dot

    def _bf16_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        widen = lambda h: _interp.TensorHandle(
            (h.data.astype(np.uint32) << 16).view(np.float32), triton.language.float32
        ) if h.dtype == triton.language.bfloat16 else h
        return _dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    _interp.InterpreterBuilder.create_dot = _bf16_dot
DEV = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
RESULTS: list[dict] = []


# ---------------------------------------------------------------- helpers

def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output"
    return ((out - ref).norm() / ref.norm()).item()


def poison() -> None:
    """Fill free allocator memory with NaN, so an element a kernel forgets stays NaN."""
    if DEV == "cuda":
        free = torch.cuda.mem_get_info()[0]
        blob = torch.empty(int(free * 0.5) // 4, dtype=torch.float32, device=DEV)
        blob.fill_(float("nan"))
        del blob


def bench(calls) -> tuple[float | None, float | None]:
    """Median ms of one call: (eager, graph).

    eager: triton.testing.do_bench on calls[0], L2 flushed before each call, Python
    launch overhead included (as in an eager prefill).  graph: the calls, one per input
    set, captured round-robin in one CUDA graph and replayed (as a captured decode step
    runs); rotating the input sets keeps one set's data from sitting in L2."""
    if DEV != "cuda":
        return None, None
    eager = triton.testing.do_bench(calls[0], warmup=25, rep=100, return_mode="median")
    for call in calls:
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rounds = max(1, min(50, int(20 / (eager * len(calls)))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for call in calls:
                call()
    times = []
    for _ in range(10):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / (rounds * len(calls)))
    del graph
    return eager, sorted(times)[len(times) // 2]


def ratio(a, b):
    return a / b if a and b else None


def record(op: str, shape: dict, **values) -> None:
    row = {"op": op, **shape, **values}
    RESULTS.append(row)
    cells = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()]
    print("  ".join(cells), flush=True)


def load_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_flash_mla(root: Path, mma: str | None):
    """Import sglang.srt.layers.attention.flash_mla_sm120{,_triton} from `root` with
    MMA_FLASHMLA set to `mma` (None: unset); both gates are read at import."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    os.environ.pop("MMA_FLASHMLA", None)
    if mma is not None:
        os.environ["MMA_FLASHMLA"] = mma
    sys.path.insert(0, str(root))
    try:
        entry = importlib.import_module("sglang.srt.layers.attention.flash_mla_sm120")
        kernels = importlib.import_module("sglang.srt.layers.attention.flash_mla_sm120_triton")
    finally:
        sys.path.remove(str(root))
    if DEV == "cpu":  # no driver: fake the SM count, skip autotuning's benchmark
        kernels._num_sms = lambda index: 4
        kernels._tiled_sparse_decode_kernel.configs[1:] = []
    return entry, kernels


# ---------------------------------------------------------------- decode (sparse MLA)

NOPE, ROPE, D = 448, 64, 512


def make_mla_cache(num_pages: int, page: int):
    """A DeepSeek-V4 FP8 page buffer as the backend views it, and its float64 rows.

    Page = page*576 bytes of token data (448 FP8 nope + 64 bf16 rope) then page*8 bytes
    of UE8M0 scales (7 used), padded to a multiple of 576 like the pool allocates."""
    n = num_pages * page
    page_bytes = -(-page * 584 // 576) * 576
    nope = (torch.randn(n, NOPE, device=DEV) * 2).to(torch.float8_e4m3fn)
    exps = torch.randint(118, 133, (n, 7), device=DEV, dtype=torch.uint8)
    rope = torch.randn(n, ROPE, device=DEV).to(torch.bfloat16)
    buf = torch.randint(0, 256, (num_pages, page_bytes), dtype=torch.uint8, device=DEV)
    data = buf[:, : page * 576].reshape(num_pages, page, 576)
    data[..., :NOPE] = nope.view(torch.uint8).reshape(num_pages, page, NOPE)
    data[..., NOPE:] = rope.view(torch.uint8).reshape(num_pages, page, 2 * ROPE)
    scales = buf[:, page * 576 : page * 584].reshape(num_pages, page, 8)
    scales[..., :7] = exps.reshape(num_pages, page, 7)
    k_cache = buf[:, : page * 584].view(num_pages, page, 1, 584).view(torch.float8_e4m3fn)
    k64 = torch.cat(
        [(nope.double().reshape(n, 7, 64) * torch.exp2(exps.double() - 127).unsqueeze(-1)).reshape(n, NOPE),
         rope.double()], dim=1)
    return k_cache, k64


def make_indices(batch: int, topk: int, n_tokens: int, invalid: float = 0.015):
    idx = torch.randint(0, n_tokens, (batch, 1, topk), device=DEV, dtype=torch.int32)
    idx[torch.rand(batch, 1, topk, device=DEV) < invalid] = -1
    return idx


def mla_reference(q, k64, idx, topk_len, scale):
    """float64 softmax(q k^T * scale) k over the valid indices: (out [B,H,D], lse [B,H])."""
    B, H = q.shape[0], q.shape[2]
    idx = idx.reshape(B, -1).long()
    valid = idx >= 0
    if topk_len is not None:
        valid &= torch.arange(idx.shape[1], device=DEV)[None, :] < topk_len[:, None]
    k = k64[idx.clamp(min=0)]  # [B, T, D]
    s = torch.einsum("bhd,btd->bht", q[:, 0].double(), k) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bht,btd->bhd", torch.exp(s - lse[..., None]).nan_to_num(0.0), k)
    return out, lse


def op_decode(src: Path, small: bool) -> None:
    print("# decode: sparse MLA, 64 heads x 512, top-k 512 (mma-splitk-decode)")
    H, topk, page = 64, 512, 256
    num_pages = 4 if small else 1024  # 256k tokens: four sets of top-k rows stay out of L2
    scale = D ** -0.5
    _, up = load_flash_mla(src / "upstream", None)
    _, pt = load_flash_mla(src / "patched", "1")
    k_cache, k64 = make_mla_cache(num_pages, page)
    batches = (1, 2) if small else (1, 2, 4, 8, 16, 32, 64)
    for B in batches:
        sets = [(torch.randn(B, 1, H, D, device=DEV).to(torch.bfloat16),
                 make_indices(B, topk, num_pages * page)) for _ in range(4)]
        q, idx = sets[0]
        ref, ref_lse = mla_reference(q, k64, idx, None, scale)
        runs = {"upstream": (None, None, (None, None))}  # fails in the interpreter
        for tag, fn in (("upstream", up._run_triton_sparse_decode),
                        ("patched", pt._run_splitk_mma_sparse_decode))[DEV == "cpu":]:
            poison()
            out, lse = fn(q, k_cache, idx, None, scale)
            calls = [lambda q=q, i=i: fn(q, k_cache, i, None, scale) for q, i in sets]
            runs[tag] = (rel(out[:, 0], ref), (lse[:, 0].double() - ref_lse).abs().max().item(),
                         bench(calls))
        # the same with a per-row valid length (topk_length), error only
        tl_len = torch.randint(topk // 4, topk + 1, (B,), device=DEV, dtype=torch.int32)
        ref2, _ = mla_reference(q, k64, idx, tl_len, scale)
        poison()
        out2, _ = pt._run_splitk_mma_sparse_decode(q, k_cache, idx, tl_len, scale)
        knobs = ("_MMA_BLOCK_H", "_MMA_BLOCK_T", "_MMA_NUM_WARPS", "_MMA_NUM_STAGES",
                 "_MMA_PROGRAMS_PER_SM")
        for cfg in SWEEP:  # other split-K configurations, as the knobs above
            shipped = [getattr(pt, k) for k in knobs]
            for k, v in zip(knobs, cfg):
                setattr(pt, k, v)
            try:
                out_c, _ = pt._run_splitk_mma_sparse_decode(q, k_cache, idx, None, scale)
                eager, graph = bench([lambda q=q, i=i: pt._run_splitk_mma_sparse_decode(
                    q, k_cache, i, None, scale) for q, i in sets])
                record("decode_sweep", {"B": B, "config": ".".join(map(str, cfg))},
                       rel=rel(out_c[:, 0], ref), ms_eager=eager, ms_graph=graph)
            except Exception as exc:  # e.g. out of shared memory
                record("decode_sweep", {"B": B, "config": ".".join(map(str, cfg))},
                       error=str(exc).splitlines()[0][:100])
            for k, v in zip(knobs, shipped):
                setattr(pt, k, v)
        (ru, lu, (eu, gu)), (rp, lp, (ep, gp)) = runs["upstream"], runs["patched"]
        record("decode", {"B": B, "H": H, "topk": topk}, rel_upstream=ru, rel_patched=rp,
               lse_abs_upstream=lu, lse_abs_patched=lp, rel_patched_topk_length=rel(out2[:, 0], ref2),
               ms_eager_upstream=eu, ms_eager_patched=ep, ms_graph_upstream=gu,
               ms_graph_patched=gp, speedup_graph=ratio(gu, gp), speedup_eager=ratio(eu, ep))
    decode_entry(src, small)


def decode_entry(src: Path, small: bool) -> None:
    """flash_mla_with_kvcache_sm120 as the backend calls it: SWA cache (page 128, top-k
    128) + c4 cache (page 64, top-k 512) + attention sink.  Gate unset == upstream."""
    B, H = (2, 64) if small else (16, 64)
    swa_cache, swa64 = make_mla_cache(8 if small else 64, 128)
    c4_cache, c464 = make_mla_cache(8 if small else 256, 64)
    q = torch.randn(B, 1, H, D, device=DEV).to(torch.bfloat16)
    swa_idx = make_indices(B, 128, swa64.shape[0])
    c4_idx = make_indices(B, 512, c464.shape[0])
    swa_len = torch.randint(1, 129, (B,), device=DEV, dtype=torch.int32)
    c4_len = torch.randint(1, 513, (B,), device=DEV, dtype=torch.int32)
    sink = torch.randn(H, device=DEV, dtype=torch.float32)
    kwargs = dict(q=q, k_cache=swa_cache, head_dim_v=D, softmax_scale=D ** -0.5,
                  indices=swa_idx, topk_length=swa_len, attn_sink=sink, extra_k_cache=c4_cache,
                  extra_indices_in_kvcache=c4_idx, extra_topk_length=c4_len)
    outs = {}
    for tag, root, gate in (("upstream", "upstream", None), ("gate_unset", "patched", None),
                            ("gate_on", "patched", "1"))[2 if DEV == "cpu" else 0:]:
        entry, _ = load_flash_mla(src / root, gate)
        poison()
        outs[tag] = entry.flash_mla_with_kvcache_sm120(**kwargs)[0]
    os.environ.pop("MMA_FLASHMLA", None)
    # float64: one softmax over both caches plus the sink in the denominator
    o1, l1 = mla_reference(q, swa64, swa_idx, swa_len, D ** -0.5)
    o2, l2 = mla_reference(q, c464, c4_idx, c4_len, D ** -0.5)
    lse = torch.logaddexp(torch.logaddexp(l1, l2), sink.double()[None, :])
    ref = (o1 * torch.exp(l1 - lse)[..., None] + o2 * torch.exp(l2 - lse)[..., None])
    if DEV == "cpu":
        record("decode_entry", {"B": B, "H": H, "topk": "128+512"},
               rel_patched=rel(outs["gate_on"][:, 0], ref))
        return
    record("decode_entry", {"B": B, "H": H, "topk": "128+512"},
           gate_unset_equals_upstream=bool(torch.equal(outs["gate_unset"], outs["upstream"])),
           rel_upstream=rel(outs["upstream"][:, 0], ref), rel_patched=rel(outs["gate_on"][:, 0], ref))


# ---------------------------------------------------------------- indexer (C4 logits)

NH, HD, BS = 64, 128, 64


def make_index_cache(num_pages: int):
    """[num_pages, 64, 1, 132] FP8 view: per page 64x128 FP8 values then 64 fp32 scales."""
    vals = (torch.randn(num_pages, BS * HD, device=DEV) * 1.5).to(torch.float8_e4m3fn)
    scl = torch.exp(torch.randn(num_pages, BS, device=DEV) * 0.3).float()
    buf = torch.empty(num_pages, BS * (HD + 4), dtype=torch.uint8, device=DEV)
    buf[:, : BS * HD] = vals.view(torch.uint8)
    buf[:, BS * HD :] = scl.view(torch.uint8)
    return buf.view(num_pages, BS, 1, HD + 4).view(torch.float8_e4m3fn), vals, scl


def index_reference(q, vals, scl, w, seq_lens, page_table):
    """float64 logits [B, max positions]; rows compared only below seq_len."""
    B = q.shape[0]
    out = []
    q64 = q[:, 0].double()  # [B, NH, HD]
    for b in range(B):
        n = int(seq_lens[b])
        pages = page_table[b, : -(-n // BS)].long()
        k = vals[pages].double().reshape(-1, HD)[:n]  # [n, HD]
        s = torch.relu(k @ q64[b].T) @ w[b].double()  # [n]
        out.append(s * scl[pages].double().reshape(-1)[:n])
    return out


def index_errors(logits, ref, seq_lens):
    got = torch.cat([logits[b, : int(seq_lens[b])] for b in range(len(ref))])
    want = torch.cat(ref)
    overlap = []
    for b, r in enumerate(ref):
        k = min(512, r.numel())
        a = set(torch.topk(logits[b, : r.numel()].double(), k).indices.tolist())
        overlap.append(len(a & set(torch.topk(r, k).indices.tolist())) / k)
    return rel(got, want), min(overlap)


def op_indexer(src: Path, small: bool) -> None:
    print("# indexer: C4 logits, 64 heads x 128 (triton-dsa-indexer, indexer-bf16-gemm)")
    up = load_file(src / "upstream" / "dsv4_indexer_fns.py", "indexer_upstream")
    pt = load_file(src / "patched" / "dsv4_indexer_fns.py", "indexer_patched")
    if DEV == "cpu":
        pt._num_sms = lambda index: 4
    fns = {"upstream": up.fp8_paged_mqa_logits_torch_sm120,
           "bf16": pt.fp8_paged_mqa_logits_torch_sm120,
           "triton": pt.fp8_paged_mqa_logits_triton_sm120}
    if small:
        cases = [(2, None, 256), (3, 100, 512)]
    else:
        cases = [(1, 1024, 1024), (1, 1024, 16384), (1, 1024, 65536), (1, 65536, 65536),
                 (32, 1024, 1024), (32, 1024, 16384), (32, 1024, 65536), (32, 65536, 65536),
                 (32, None, 65536), (2048, "causal", 4096)]
    for B, seq, width in cases:
        pages = width // BS
        nsets = 1 if small else 4  # input sets rotated in the graph timing (see bench)
        cache, vals, scl = make_index_cache(nsets * B * pages + 1)
        perm = torch.randperm(nsets * B * pages + 1, device=DEV)[: nsets * B * pages].int()
        tables = list(perm.view(nsets, B, pages))
        qs = [torch.randn(B, 1, NH, HD, device=DEV).to(torch.float8_e4m3fn) for _ in range(nsets)]
        ws = [torch.randn(B, NH, device=DEV) * 0.1 for _ in range(nsets)]
        q, w, page_table = qs[0], ws[0], tables[0]
        if seq is None:  # random lengths, not page aligned
            seq_lens = torch.randint(1, width + 1, (B,), device=DEV, dtype=torch.int32)
        elif seq == "causal":  # a prefill chunk: one row per query token
            seq_lens = torch.arange(width - B + 1, width + 1, device=DEV, dtype=torch.int32)
        else:
            seq_lens = torch.full((B,), seq, device=DEV, dtype=torch.int32)
        check = B <= 32 or small
        ref = index_reference(q, vals, scl, w, seq_lens, page_table) if check else None
        row, first = {}, None
        sl = seq_lens.unsqueeze(-1)  # the backend passes [B, 1]
        for tag, fn in fns.items():
            try:
                poison()
                out = fn(q, cache, w, sl, page_table, None, width, False)
                assert out.shape == (B, width)
                if check:
                    row[f"rel_{tag}"], row[f"top512_{tag}"] = index_errors(out, ref, seq_lens)
                if first is None:
                    first = out
                elif tag == "bf16":  # valid region only: the Triton kernel leaves the rest
                    row["bf16_equals_upstream"] = bool(torch.equal(out, first))
                del out
                row[f"ms_eager_{tag}"], row[f"ms_graph_{tag}"] = bench(
                    [lambda q=q, w=w, t=t, fn=fn: fn(q, cache, w, sl, t, None, width, False)
                     for q, w, t in zip(qs, ws, tables)])
            except Exception as exc:  # e.g. out of memory, or an op this torch lacks
                row[f"error_{tag}"] = str(exc).splitlines()[0][:120]
            if DEV == "cuda":
                torch.cuda.empty_cache()
        for per_sm in INDEX_SWEEP:  # other grid sizes of the Triton kernel
            kept, pt._INDEXER_PROGRAMS_PER_SM = pt._INDEXER_PROGRAMS_PER_SM, per_sm
            tag = f"triton_{per_sm}_per_sm"
            if check:
                row[f"rel_{tag}"] = index_errors(
                    fns["triton"](q, cache, w, sl, page_table, None, width, False), ref, seq_lens)[0]
            row[f"ms_graph_{tag}"] = bench(
                [lambda q=q, w=w, t=t: fns["triton"](q, cache, w, sl, t, None, width, False)
                 for q, w, t in zip(qs, ws, tables)])[1]
            pt._INDEXER_PROGRAMS_PER_SM = kept
        row["speedup_graph_triton"] = ratio(row.get("ms_graph_upstream"), row.get("ms_graph_triton"))
        row["speedup_graph_bf16"] = ratio(row.get("ms_graph_upstream"), row.get("ms_graph_bf16"))
        record("indexer", {"B": B, "seq": seq if seq is not None else "random", "width": width}, **row)
        del cache, vals, scl, tables, first


# ---------------------------------------------------------------- mhc (hyper-connection pre-mix)

def op_mhc(src: Path, small: bool) -> None:
    print("# mhc: hc_pre_torch_impl mixes, [T, 16384] x [16384, 24] (mhc-bf16)")
    up = load_file(src / "upstream" / "mhc_fns.py", "mhc_upstream")
    pt = load_file(src / "patched" / "mhc_fns.py", "mhc_patched")
    for T in ((1, 7) if small else (1, 16, 128, 1024, 8192, 32768)):
        sets = [(torch.randn(T, 4, 4096, device=DEV).to(torch.bfloat16),
                 torch.randn(24, 16384, device=DEV) * 16384 ** -0.5) for _ in range(2)]
        x, hc_fn = sets[0]
        x64 = x.flatten(1).double()
        rsqrt = torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6)
        ref = (x64 @ hc_fn.double().T) * rsqrt
        del x64
        row = {}
        for tag, mod in (("upstream", up), ("patched", pt)):
            poison()
            _, mixes = mod.hc_pre_torch_impl(x, hc_fn)
            row[f"rel_{tag}"] = rel(mixes[:, 0], ref)
            del mixes
            row[f"ms_eager_{tag}"], row[f"ms_graph_{tag}"] = bench(
                [lambda x=x, h=h, mod=mod: mod.hc_pre_torch_impl(x, h) for x, h in sets])
        row["speedup_eager"] = ratio(row["ms_eager_upstream"], row["ms_eager_patched"])
        row["speedup_graph"] = ratio(row["ms_graph_upstream"], row["ms_graph_patched"])
        record("mhc", {"T": T}, **row)
        del x, ref, sets


# ---------------------------------------------------------------- swiglu clamp (NVFP4 MoE)

def op_swiglu(src: Path, small: bool) -> None:
    print("# swiglu: silu(gate) * up after GEMM1 of cutlass_moe_fp4 (nvfp4-cutlass-swiglu-clamp)")
    limit = 10.0
    n = 2048  # DeepSeek-V4 moe_intermediate_size
    for rows, sigma in (((16, 1.0), (16, 4.0)) if small else
                        ((8192 * 6, 1.0), (8192 * 6, 3.0), (8192 * 6, 6.0))):
        c1 = (torch.randn(rows, 2 * n, device=DEV) * sigma).to(torch.bfloat16)
        gate, up_ = c1[:, :n], c1[:, n:]
        upstream = (torch.nn.functional.silu(gate.float()) * up_.float()).to(torch.bfloat16)
        g, u = gate.clamp(max=limit), up_.clamp(-limit, limit)  # in bf16, as the kernel does
        patched = (torch.nn.functional.silu(g.float()) * u.float()).to(torch.bfloat16)
        g64, u64 = gate.double().clamp(max=limit), up_.double().clamp(-limit, limit)
        ref = torch.nn.functional.silu(g64) * u64  # DeepSeek-V4's definition
        beyond = ((gate > limit) | (up_.abs() > limit)).double().mean().item()
        record("swiglu", {"rows": rows, "n": n, "sigma": sigma}, frac_beyond_limit=beyond,
               rel_upstream=rel(upstream, ref), rel_patched=rel(patched, ref))


# ---------------------------------------------------------------- main

SWEEP: list[tuple[int, ...]] = []
INDEX_SWEEP: list[int] = []
OPS = {"decode": op_decode, "indexer": op_indexer, "mhc": op_mhc, "swiglu": op_swiglu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path(__file__).parent / "_src")
    ap.add_argument("--op", default=",".join(OPS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", default="", help="split-K configs to time too: BLOCK_H.BLOCK_T."
                    "warps.stages.programs_per_sm, comma separated")
    ap.add_argument("--index-sweep", default="", help="Triton indexer programs per SM to "
                    "time too, comma separated")
    args = ap.parse_args()
    SWEEP.extend(tuple(map(int, c.split("."))) for c in args.sweep.split(",") if c)
    INDEX_SWEEP.extend(int(c) for c in args.index_sweep.split(",") if c)
    torch.manual_seed(args.seed)
    if DEV == "cuda":
        name, cc = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
    else:
        name, cc = "cpu (TRITON_INTERPRET=1)" if INTERPRET else "cpu", None
    env = {"device": name, "arch": f"sm_{cc[0]}{cc[1]}" if cc else "cpu",
           "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}
    print("# " + "  ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    for op in args.op.split(","):
        OPS[op](args.src, args.small)
    if args.json:
        args.json.write_text(json.dumps({**env, "results": RESULTS}, indent=1) + "\n")


if __name__ == "__main__":
    main()
