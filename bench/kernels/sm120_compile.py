"""Compile the series' Triton kernels for sm_120 (and sm_90) without a GPU and report what
bounds them there: shared memory (sm_120 allows 99 KiB a block), registers, stack (spills)
and which matrix instruction the dots became.

    python bench/kernels/sm120_compile.py --src bench/kernels/_src [--arch 120,90]
                                          [--configs 16.32.4.1,16.16.4.1]

--configs (BLOCK_H.BLOCK_T.num_warps.num_stages) compiles other split-K decode
configurations than the one the patch ships (its _MMA_* constants).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
SM120_SMEM = 99 * 1024

DECODE_SIG = {
    "Q_ptr": "*bf16", "cache_fp8_ptr": "*fp8e4nv", "cache_uint8_ptr": "*u8",
    "cache_bf16_ptr": "*bf16", "indices_ptr": "*i32", "topk_len_ptr": "*i32",
    "O_ptr": "*fp32", "LSE_ptr": "*fp32", "qk_scale_log2": "fp32", "page_size": "i32",
    "page_bytes": "i64", "scale_section_off": "i64", "topk": "i32", "tokens_per_split": "i32",
    "stride_qb": "i32", "stride_qh": "i32", "stride_ib": "i32", "H": "constexpr",
    "HAS_TOPK_LEN": "constexpr", "NUM_SPLITS": "constexpr", "BLOCK_H": "constexpr",
    "BLOCK_T": "constexpr",
}
INDEXER_SIG = {
    "q_ptr": "*fp8e4nv", "kv_fp8_ptr": "*fp8e4nv", "kv_f32_ptr": "*fp32", "weight_ptr": "*fp32",
    "seq_lens_ptr": "*i32", "page_table_ptr": "*i32", "logits_ptr": "*fp32", "max_pages": "i32",
    "max_seq_len": "i32", "num_splits": "i32", "page_table_stride": "i32",
    "NUM_HEADS": "constexpr", "HEAD_DIM": "constexpr", "PAGE": "constexpr",
}


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report(label: str, fn, sig: dict, constexprs: dict, arch: int, warps: int, stages: int):
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                            target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": warps, "num_stages": stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    usage = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", f.name],
                           capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    fields = dict(p.split(":") for p in next(l for l in usage.splitlines() if "REG:" in l).split()
                  if ":" in p)
    ptx = kernel.asm["ptx"]
    mma = "wgmma" if "wgmma" in ptx else "mma.sync" if "mma.sync" in ptx else "none"
    smem = kernel.metadata.shared
    fits = "" if arch != 120 else ("  fits" if smem <= SM120_SMEM else "  OVER 99 KiB")
    print(f"sm_{arch} {label:<34} smem={smem:>6}{fits}  regs={fields['REG']:>3}  "
          f"stack={fields['STACK']:>4}  mma={mma}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path(__file__).parent / "_src")
    ap.add_argument("--arch", default="120,90")
    ap.add_argument("--configs", default="")
    args = ap.parse_args()
    attn = args.src / "patched" / "sglang" / "srt" / "layers" / "attention"
    dec = load(attn / "flash_mla_sm120_triton.py", "decode_patched")
    idx = load(args.src / "patched" / "dsv4_indexer_fns.py", "indexer_patched")
    shipped = (dec._MMA_BLOCK_H, dec._MMA_BLOCK_T, dec._MMA_NUM_WARPS, dec._MMA_NUM_STAGES)
    configs = [shipped] + [tuple(map(int, c.split("."))) for c in args.configs.split(",") if c]
    for arch in map(int, args.arch.split(",")):
        for bh, bt, warps, stages in configs:
            tag = "shipped" if (bh, bt, warps, stages) == shipped else "candidate"
            report(f"splitk decode {bh}.{bt}.{warps}.{stages} ({tag})", dec._splitk_mma_decode_kernel,
                   DECODE_SIG, {"H": 64, "HAS_TOPK_LEN": True, "NUM_SPLITS": 4, "BLOCK_H": bh,
                                "BLOCK_T": bt}, arch, warps, stages)
        report("splitk combine (4 splits)", dec._splitk_combine_kernel,
               {"Op_ptr": "*fp32", "LSEp_ptr": "*fp32", "O_ptr": "*bf16", "LSE_ptr": "*fp32",
                "H": "constexpr", "NUM_SPLITS": "constexpr"}, {"H": 64, "NUM_SPLITS": 4}, arch, 4, 3)
        report("indexer logits", idx._fp8_paged_mqa_logits_sm120_kernel, INDEXER_SIG,
               {"NUM_HEADS": 64, "HEAD_DIM": 128, "PAGE": 64}, arch, 4, 3)


if __name__ == "__main__":
    main()
