"""Build the kernel sources numerics.py loads: upstream v0.5.14 and the patched series.

Reads the pinned wheel (or an unpacked tree), applies patches/*.patch in the order of the
series file with `git apply` (only the hunks of the files below), and writes OUT/upstream
and OUT/patched, each holding:
  sglang/srt/layers/attention/flash_mla_sm120{,_triton}.py  (empty package stubs above)
  dsv4_indexer_fns.py   the sm120 indexer functions, cut out of dsv4/indexer.py
  mhc_fns.py            hc_pre_torch_impl, cut out of models/deepseek_v4.py
Those upstream modules import half of SGLang; the cut-out functions need only torch and
Triton, so the numerics run with nothing but torch + Triton on the GPU host.

usage: python bench/kernels/prepare_src.py --wheel sglang-0.5.14-...whl [--out DIR]
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ATTN = "sglang/srt/layers/attention/"
FILES = (
    ATTN + "flash_mla_sm120.py",
    ATTN + "flash_mla_sm120_triton.py",
    ATTN + "dsv4/indexer.py",
    "sglang/srt/models/deepseek_v4.py",
)
INDEXER_NAMES = (
    "fp8_paged_mqa_logits_torch_sm120",
    "_fp8_paged_mqa_logits_sm120_kernel",
    "_INDEXER_PROGRAMS_PER_SM",
    "_num_sms",
    "fp8_paged_mqa_logits_triton_sm120",
    "_TRITON_INDEXER",
)
INDEXER_PRELUDE = """\
import functools
import os
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

FP8_DTYPE = torch.float8_e4m3fn
"""
MHC_PRELUDE = """\
import types

import torch
import torch.nn.functional as F

self = types.SimpleNamespace(rms_norm_eps=1e-6)  # DeepSeek-V4 rms_norm_eps
"""


def read_upstream(wheel: Path | None, tree: Path | None) -> dict[str, bytes]:
    if tree is not None:
        return {f: (tree / f).read_bytes() for f in FILES}
    with zipfile.ZipFile(wheel) as zf:
        return {f: zf.read(f) for f in FILES}


def series_files(series: Path) -> list[Path]:
    doc = yaml.safe_load(series.read_text())
    return [ROOT / e["file"] for e in doc["series"]]  # paths are relative to the repo root


def apply_series(files: dict[str, bytes], patches: list[Path]) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, data in files.items():
            dest = work / "python" / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=tmp)
        includes = [f"--include=python/{f}" for f in FILES]
        for patch in patches:
            subprocess.run(["git", "apply", "--whitespace=nowarn", *includes, str(patch)],
                           cwd=work, env=env, check=True)
        return {f: (work / "python" / f).read_bytes() for f in FILES}


def cut(source: str, names: tuple[str, ...]) -> str:
    """Top-level defs/assignments named in `names`, decorators included, in file order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        if name in names:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            out.append("".join(lines[start - 1:node.end_lineno]))
    return "\n\n".join(out)


def cut_hc_pre(source: str) -> str:
    """The nested hc_pre_torch_impl, without its capture-mode decorator."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "hc_pre_torch_impl":
            lines = source.splitlines(keepends=True)[node.lineno - 1:node.end_lineno]
            return textwrap.dedent("".join(lines))
    raise SystemExit("hc_pre_torch_impl not found in deepseek_v4.py")


def write_tree(dest: Path, files: dict[str, bytes]) -> None:
    pkg = dest / ATTN
    pkg.mkdir(parents=True)
    for part in ("sglang", "sglang/srt", "sglang/srt/layers", ATTN.rstrip("/")):
        (dest / part / "__init__.py").write_text("")
    for name in FILES[:2]:
        (dest / name).write_bytes(files[name])
    indexer = files[ATTN + "dsv4/indexer.py"].decode()
    (dest / "dsv4_indexer_fns.py").write_text(INDEXER_PRELUDE + "\n\n" + cut(indexer, INDEXER_NAMES) + "\n")
    model = files["sglang/srt/models/deepseek_v4.py"].decode()
    (dest / "mhc_fns.py").write_text(MHC_PRELUDE + "\n\n" + cut_hc_pre(model))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--wheel", type=Path, help="the pinned sglang-0.5.14 wheel")
    src.add_argument("--tree", type=Path, help="an unpacked tree holding sglang/")
    ap.add_argument("--series", type=Path, default=ROOT / "patches.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "kernels" / "_src")
    args = ap.parse_args()
    upstream = read_upstream(args.wheel, args.tree)
    patched = apply_series(upstream, series_files(args.series))
    if args.out.exists():
        shutil.rmtree(args.out)
    write_tree(args.out / "upstream", upstream)
    write_tree(args.out / "patched", patched)
    print(f"wrote {args.out}/upstream and {args.out}/patched", file=sys.stderr)


if __name__ == "__main__":
    main()
