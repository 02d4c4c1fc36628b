"""Turn a numerics.py --json result into the README tables, the tier of each patch by the
rule in README.md, and the `evidence:` block of each patch in patches.yaml.

    python bench/kernels/evidence.py bench/kernels/results/h200-2026-11-29-final.json
        [--yaml | --write patches.yaml]

--write replaces each measured patch's `evidence:` block in patches.yaml and fails when its
tier differs from the rule's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

FLOOR = 1e-5  # relative errors below this are fp32 summation-order noise
COMMAND = ("python bench/kernels/prepare_src.py --wheel sglang-0.5.14-cp311-cp311-"
           "manylinux_2_34_x86_64.whl && python bench/kernels/numerics.py "
           "--src bench/kernels/_src --op {op} --json {json}")

# patch -> (op rows, upstream error key, patched error key, how the rule sees the code)
PATCHES = {
    "mma-splitk-decode": ("decode", "rel_upstream", "rel_patched", "new kernel"),
    "triton-dsa-indexer": ("indexer", "rel_upstream", "rel_triton", "new kernel"),
    "indexer-bf16-gemm": ("indexer", "rel_upstream", "rel_bf16", "upstream op, dtype change"),
    "mhc-bf16": ("mhc", "rel_upstream", "rel_patched", "upstream op, dtype change"),
    "nvfp4-cutlass-swiglu-clamp": ("swiglu", "rel_upstream", "rel_patched", "emulated"),
}


def tier(e_up: float, e_new: float, code: str) -> tuple[str, float]:
    """The rule of README.md, for a patch whose arithmetic changes."""
    excess = max(e_new, FLOOR) / max(e_up, FLOOR)
    if excess > 4:
        return "risky", excess
    if excess > 1.25 or code in ("new kernel", "emulated"):
        return "moderate", excess
    return "safe", excess


def rows(results: list[dict], op: str) -> list[dict]:
    return [r for r in results if r["op"] == op]


def fmt(value, digits=3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def table(header: list[str], lines: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(v) for v in line) + " |" for line in lines]
    return "\n".join(out)


def markdown(doc: dict) -> str:
    res = doc["results"]
    parts = [f"{doc['device']} ({doc['arch']}), torch {doc['torch']}, Triton {doc['triton']}, "
             f"{doc['date']}. Times in ms, median; graph = CUDA-graph replay over 4 rotating "
             "input sets, eager = do_bench with L2 flush (Python launch overhead included)."]
    parts.append("\n**Sparse-MLA decode** (64 heads x 512, top-k 512, page 256, 256k-token cache)\n")
    parts.append(table(
        ["B", "rel upstream", "rel split-K", "graph upstream", "graph split-K", "speed-up",
         "eager upstream", "eager split-K"],
        [[r["B"], r["rel_upstream"], r["rel_patched"], r["ms_graph_upstream"],
          r["ms_graph_patched"], r["speedup_graph"], r["ms_eager_upstream"],
          r["ms_eager_patched"]] for r in rows(res, "decode")]))
    for r in rows(res, "decode_entry"):
        parts.append(f"\nEntry point flash_mla_with_kvcache_sm120 (SWA 128 + c4 512 + sink, "
                     f"B={r['B']}): MMA_FLASHMLA unset equals upstream bit for bit: "
                     f"{fmt(r['gate_unset_equals_upstream'])}; rel upstream "
                     f"{fmt(r['rel_upstream'])}, MMA_FLASHMLA=1 {fmt(r['rel_patched'])}.")
    parts.append("\n**C4 indexer logits** (64 heads x 128; width = page-table width in "
                 "positions; top-512 = share of the reference's top 512 found)\n")
    parts.append(table(
        ["B", "seq", "width", "rel upstream", "rel bf16", "rel Triton", "top-512 Triton",
         "graph upstream", "graph bf16", "graph Triton", "Triton speed-up"],
        [[r["B"], r["seq"], r["width"], r.get("rel_upstream"), r.get("rel_bf16"),
          r.get("rel_triton"), r.get("top512_triton"), r.get("ms_graph_upstream"),
          r.get("ms_graph_bf16"), r.get("ms_graph_triton"), r.get("speedup_graph_triton")]
         for r in rows(res, "indexer")]))
    parts.append("\n**Hyper-connection pre-mix** (hc_pre_torch_impl, [T, 16384] x [16384, 24])\n")
    parts.append(table(
        ["T", "rel upstream (fp32)", "rel bf16", "eager upstream", "eager bf16", "speed-up"],
        [[r["T"], r["rel_upstream"], r["rel_patched"], r["ms_eager_upstream"],
          r["ms_eager_patched"], r["speedup_eager"]] for r in rows(res, "mhc")]))
    parts.append("\n**SwiGLU after NVFP4 GEMM1** (torch emulation of silu_and_mul / "
                 "silu_and_mul_clamp; reference = DeepSeek-V4's clamped definition)\n")
    parts.append(table(
        ["rows x n", "sigma", "share beyond limit", "rel upstream (no clamp)", "rel clamp"],
        [[f"{r['rows']} x {r['n']}", r["sigma"], r["frac_beyond_limit"], r["rel_upstream"],
          r["rel_patched"]] for r in rows(res, "swiglu")]))
    parts.append("\n**Tiers by the rule** (max over the shapes above)\n")
    lines = []
    for name, (op, up, new, code) in PATCHES.items():
        e_up = max(r[up] for r in rows(res, op) if r.get(up) is not None)
        e_new = max(r[new] for r in rows(res, op) if r.get(new) is not None)
        t, excess = tier(e_up, e_new, code)
        lines.append([name, e_up, e_new, excess, code, t])
    parts.append(table(["patch", "max rel upstream", "max rel patched", "excess", "code", "tier"],
                       lines))
    return "\n".join(parts) + "\n"


KEEP = {  # result columns shown in each patch's evidence
    "mma-splitk-decode": ("B", "rel_upstream", "rel_patched", "ms_graph_upstream",
                          "ms_graph_patched", "speedup_graph"),
    "triton-dsa-indexer": ("B", "seq", "width", "rel_upstream", "rel_triton", "top512_triton",
                           "ms_graph_upstream", "ms_graph_triton", "speedup_graph_triton"),
    "indexer-bf16-gemm": ("B", "seq", "width", "rel_upstream", "rel_bf16",
                          "bf16_equals_upstream", "ms_graph_upstream", "ms_graph_bf16",
                          "speedup_graph_bf16"),
    "mhc-bf16": ("T", "rel_upstream", "rel_patched", "ms_eager_upstream", "ms_eager_patched",
                 "ms_graph_upstream", "ms_graph_patched"),
    "nvfp4-cutlass-swiglu-clamp": ("rows", "n", "sigma", "frac_beyond_limit", "rel_upstream",
                                   "rel_patched"),
}
NOTES = {
    "mma-splitk-decode": "rel = ||out - ref|| / ||ref|| vs float64; graph = CUDA-graph replay, "
    "ms. Upstream error is the bf16 output rounding; the split-K kernel adds none visible. "
    "Entry point with MMA_FLASHMLA unset equals upstream bit for bit: {entry}. Measured on "
    "sm_90; bench/kernels/results/sm120-compile.txt shows the sm_120 build (smem, regs).",
    "triton-dsa-indexer": "Time follows seq, not width: seq 1024 at width 65536 vs 1024, "
    "B=32: {w32}x; B=1: {w1}x (upstream: {u32}x, {u1}x). top512 = share of the float64 "
    "top-512 found. The causal row is a 2048-token prefill chunk.",
    "indexer-bf16-gemm": "Same error as upstream (FP8 products are exact; fp32 accumulation); "
    "output equal bit for bit at small widths, summation order differs at large ones.",
    "mhc-bf16": "Upstream is fp32 (error = fp32 summation); bf16 rounds hc_fn and the mixes, "
    "at least {ratio:.0f}x the upstream error at every T, on every layer, prefill and decode.",
    "nvfp4-cutlass-swiglu-clamp": "Reference = DeepSeek-V4's clamped SwiGLU in float64; both "
    "sides are torch emulations of the JIT kernels' arithmetic (the kernels need a full "
    "SGLang install), so the tier rule caps this at moderate. Upstream's error is the "
    "missing clamp: it grows with the share of activations beyond swiglu_limit=10.",
}


def evidence(doc: dict, json_path: str) -> dict[str, tuple[str, str]]:
    """patch -> (rule tier, YAML `evidence:` block, indented for a series entry)."""
    res = doc["results"]
    out = {}
    for name, (op, up, new, code) in PATCHES.items():
        e_up = max(r[up] for r in rows(res, op) if r.get(up) is not None)
        e_new = max(r[new] for r in rows(res, op) if r.get(new) is not None)
        t, excess = tier(e_up, e_new, code)
        lines = ["    evidence:",
                 f"      command: \"{COMMAND.format(op=op, json=json_path)}\"",
                 f"      device: {doc['device']}",
                 f"      arch: {doc['arch']}",
                 f"      date: \"{doc['date']}\"",
                 "      results:"]
        for r in rows(res, op):
            cells = ", ".join(f"{k}: {fmt(r[k]) if not isinstance(r[k], str) else r[k]}"
                              for k in KEEP[name] if k in r)
            lines.append(f"        - {{{cells}}}")
        rule = (f"Tier rule (bench/kernels/README.md): max rel upstream {e_up:.3g}, patched "
                f"{e_new:.3g}, excess {excess:.3g}, {code}: {t}.")
        lines.append(f"      note: \"{rule} {note(name, res)}\"")
        out[name] = (t, "\n".join(lines) + "\n")
    return out


def note(name: str, res: list[dict]) -> str:
    idx = {(r["B"], r["seq"], r["width"]): r for r in rows(res, "indexer")}
    growth = lambda B, key: idx[(B, 1024, 65536)][key] / idx[(B, 1024, 1024)][key]
    entry = all(r["gate_unset_equals_upstream"] for r in rows(res, "decode_entry"))
    mhc = rows(res, "mhc")
    return NOTES[name].format(
        entry="yes" if entry else "NO",
        w32=f"{growth(32, 'ms_graph_triton'):.2f}", w1=f"{growth(1, 'ms_graph_triton'):.2f}",
        u32=f"{growth(32, 'ms_graph_upstream'):.1f}", u1=f"{growth(1, 'ms_graph_upstream'):.1f}",
        ratio=min(r["rel_patched"] / r["rel_upstream"] for r in mhc))


def write(draft: Path, blocks: dict[str, tuple[str, str]]) -> None:
    text = draft.read_text()
    for name, (rule_tier, block) in blocks.items():
        entry = re.search(rf"^  - name: {re.escape(name)}\n(?:^(?!  - |headers:).*\n)*", text, re.M)
        if not entry:
            sys.exit(f"{draft}: no series entry {name!r}")
        body = entry.group(0)
        declared = re.search(r"^    tier: (\S+)", body, re.M).group(1)
        if declared != rule_tier:
            sys.exit(f"{name}: tier {declared} in {draft}, the rule says {rule_tier}")
        start = body.index("    evidence:\n")
        text = text.replace(body, body[:start] + block, 1)
    draft.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--yaml", action="store_true", help="print the evidence blocks instead")
    ap.add_argument("--write", type=Path, metavar="DRAFT", help="put them into DRAFT")
    args = ap.parse_args()
    doc = json.loads(args.json.read_text())
    blocks = evidence(doc, str(args.json))
    if args.write:
        write(args.write, blocks)
    elif args.yaml:
        print("".join(f"# {name}: {t}\n{b}" for name, (t, b) in blocks.items()), end="")
    else:
        print(markdown(doc), end="")


if __name__ == "__main__":
    main()
