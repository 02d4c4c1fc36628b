"""The whole observation stack end to end on a GPU (issue 23, point 6).

Deploy's tracer, in processes laid out as SGLang's, around the series' real patched
kernels, judged by the auditor's own code:

* **derive** (CPU, once, needs the pinned wheel): per patch of the series, its pre- and
  post-images of the bench modules (prepare_src.py's cut-outs, patch by patch, `git
  apply` in series order) -> `tracetargets.for_patch`, the function engine.trace_targets
  runs on a host -> `_src/targets.json`, with each patch's sha256 and path tag from
  patches.yaml (`manifest.load_series`). Also a variant where mma-splitk-decode carries a
  manifest entry `trace: [{module: ...flash_mla_sm120_triton, qualname:
  _run_splitk_mma_sparse_decode}]` with `trace_mode: replace` (the series has none).
* **servers**: the trace dir as deploy installs it (patchset/agent/lib/tracer.py copied as
  patchset_tracer.py + sitecustomize.py, first on PYTHONPATH), PATCHSET_TRACE from
  `deploy.units.trace_value(applied, traces)` (derived targets + `~forward=
  sglang.srt.model_executor.model_runner:ModelRunner.forward`), PATCHSET_PATCHES from
  `units.patches_value`, PATCHSET_TRACE_DIR one records dir per server. A server is a main
  process (like launch_server: imports no kernel) that starts its schedulers with
  multiprocessing "spawn" (as SGLang does), each titled `sglang::scheduler_TPn`
  (setproctitle) with its own gate variables set in os.environ before its start. Each
  scheduler imports `sglang.srt.model_executor.model_runner`, a BENCH model written by
  this script (not SGLang's): `ModelRunner.forward(self, forward_batch, ...)`, with
  `forward_batch.forward_mode` an IntEnum of 0.5.14's ForwardMode names and values, runs
  what README.md says runs in every DeepSeek-V4 decoder layer on sm_120, eagerly:
  hc_pre_torch_impl (mhc-bf16), the C4 indexer (Triton with TRITON_INDEXER=1, else the
  torch one: indexer-bf16-gemm), flash_mla_with_kvcache_sm120 (split-K with
  MMA_FLASHMLA=1: mma-splitk-decode). DECODE: a batch of 16 sequences; EXTEND: one
  256-token prefill chunk, flattened one row per query token as the dsv4 backend does
  (causal lengths); IDLE: nothing. The kernels are the real patched modules under their
  real names (flash_mla_sm120{,_triton}) or prepare_src.py's cut-out names
  (dsv4_indexer_fns, mhc_fns).
* **judging**: the records dir is read by the gatherer's own primitive
  (`Runner.trace_dir`), parsed by `facts.trace.TraceRecords`, put in an auditor `Server`
  and judged by `auditor.observed.observe` (ran / not run / none, exactly as
  auditor/states.py reads an Observation), per process (a Server holding that one
  process's record) and per server (all records).

Cases (expected verdicts are the rule's; `truth` is what the bench ran):
  1 ran in decode; 2 ran in extend; 3 gated off (not run); 4 no forward pass, or only
  IDLE ones (none);
  5 a call that raised inside a forward that raised (not ran; forward not counted);
  6 os.fork() after CUDA started (child: own record, no forward, none; parent unaffected).
Each server runs twice: in the interpreter's own mode (sys.monitoring on Python 3.12)
and in wrap mode (the tracer's Python < 3.12 mode, which 0.5.14's cp311 wheel gets),
forced without touching the tracer: a shim sitecustomize.py before the trace dir takes
sys.monitoring tool ids 2-5, so the tracer finds none free and wraps, as it documents.

Then the tracer's cost after the first hits, in subprocesses with the tracer off, in
sys.monitoring mode and in wrap mode: ns per call of a watched target (a one-line module
added as a target: by attribute, and through a reference taken before its first call),
ModelRunner.forward's wrapper per IDLE batch, and a real decode forward and decode entry
call (host time, synchronised per repetition).

    python bench/kernels/prepare_src.py --wheel sglang-0.5.14-...whl        # CPU, once
    python bench/kernels/observe_gpu.py --derive --wheel sglang-0.5.14-...whl  # CPU, once
    python bench/kernels/observe_gpu.py --cpu-dry-run                       # CPU: plumbing
    python bench/kernels/observe_gpu.py --json results/observe-h200-DATE.json   # GPU

--cpu-dry-run: the same layout, tracer, targets and judging, with stub modules of the same
names and qualnames instead of the kernels (no torch); "CUDA" is a pid check, so the
forked child's forward fails as on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
AGENT = ROOT / "patchset" / "agent"
ATTN = "sglang.srt.layers.attention"
FLASH = f"{ATTN}.flash_mla_sm120"
FLASH_T = f"{ATTN}.flash_mla_sm120_triton"
RUNNER_MOD = "sglang.srt.model_executor.model_runner"
SPLITK = "_run_splitk_mma_sparse_decode"
MANIFEST_TRACE = {"mma-splitk-decode": [{"module": FLASH_T, "qualname": SPLITK}]}
DECODE_B, CHUNK, HEADS = 16, 256, 64

# ---------------------------------------------------------------- derive (CPU, once)


def derive(wheel: Path, src: Path) -> dict:
    """Per patch: its targets on the bench modules (and on the real ones, for reference),
    from its own pre-/post-images, as engine.trace_targets does on a host."""
    sys.path[:0] = [str(ROOT), str(HERE)]
    import prepare_src as ps

    from patchset.agent.lib import tracetargets as tt
    from patchset.series.manifest import load_series

    series = load_series(ROOT / "patches.yaml")
    upstream = ps.read_upstream(wheel, None)

    def bench_images(files: dict[str, bytes]) -> dict[str, bytes]:
        ind = files[ps.ATTN + "dsv4/indexer.py"].decode()
        model = files["sglang/srt/models/deepseek_v4.py"].decode()
        return {ps.FILES[0]: files[ps.FILES[0]], ps.FILES[1]: files[ps.FILES[1]],
                "dsv4_indexer_fns.py": (ps.INDEXER_PRELUDE + "\n\n" + ps.cut(
                    ind, ps.INDEXER_NAMES) + "\n").encode(),
                "mhc_fns.py": (ps.MHC_PRELUDE + "\n\n" + ps.cut_hc_pre(model)).encode()}

    out: dict = {"series": [], "bench": {}, "real": {}, "manifest_replace": {}}
    before = upstream
    for k, patch in enumerate(series.patches):
        after = ps.apply_series(upstream, [ROOT / p.file for p in series.patches[:k + 1]])
        b0, b1 = bench_images(before), bench_images(after)
        files = [(path, b0[path], b1[path]) for path in b1 if b0[path] != b1[path]]
        real = [(f"python/{path}", before[path], after[path]) for path in after
                if before[path] != after[path]]
        word = f"{patch.name}:{patch.sha256[:12]}"
        out["series"].append({"name": patch.name, "sha256": patch.sha256,
                              "path": patch.path,
                              "gate": patch.gate.env if patch.gate else None})
        out["bench"][word] = [t.to_json() for t in tt.for_patch(patch.name, files, "")]
        out["real"][word] = [t.to_json() for t in tt.for_patch(patch.name, real, "python/")]
        if patch.name in MANIFEST_TRACE:
            out["manifest_replace"][word] = [t.to_json() for t in tt.for_patch(
                patch.name, files, "", MANIFEST_TRACE[patch.name], "replace")]
        before = after
    (src / "targets.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


# ---------------------------------------------------------------- the bench model

FORWARD_BATCH_INFO = '''\
"""BENCH module (bench/kernels/observe_gpu.py), not SGLang's: ForwardMode with 0.5.14's
names and values, and a ForwardBatch holding the tensors one forward pass needs."""
from enum import IntEnum, auto


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND_V2 = auto()
    PREBUILT = auto()
    SPLIT_PREFILL = auto()
    DLLM_EXTEND = auto()


class ForwardBatch:
    def __init__(self, forward_mode, **tensors):
        self.forward_mode = forward_mode
        self.__dict__.update(tensors)
'''

MODEL_RUNNER = '''\
"""BENCH module (bench/kernels/observe_gpu.py), not SGLang's ModelRunner: the forward
entry the tracer watches (0.5.14's name and signature) around what one DeepSeek-V4
decoder layer runs on sm_120 (bench/kernels/README.md): the hyper-connection pre-mix
(hc_pre_torch_impl), the C4 indexer (dsv4 backend: the Triton one when TRITON_INDEXER=1,
read at import like its real gate, else the torch one) and sparse MLA through
flash_mla_with_kvcache_sm120 (which the dsv4 backend also calls for prefill chunks,
flattened to one row per query token). IDLE runs nothing."""
from sglang.srt.layers.attention import flash_mla_sm120
from sglang.srt.model_executor.forward_batch_info import ForwardMode

import dsv4_indexer_fns as indexer
import mhc_fns


class ModelRunner:
    def __init__(self, is_draft_worker=False):
        self.is_draft_worker = is_draft_worker
        self.forward_pass_id = 0

    def forward(self, forward_batch, skip_attn_backend_init=None, pp_proxy_tensors=None,
                reinit_attn_backend=False, split_forward_count=1):
        self.forward_pass_id += 1
        b = forward_batch
        if b.forward_mode == ForwardMode.IDLE:
            return None
        _, mixes = mhc_fns.hc_pre_torch_impl(b.hidden, b.hc_fn)
        index = (indexer.fp8_paged_mqa_logits_triton_sm120 if indexer._TRITON_INDEXER
                 else indexer.fp8_paged_mqa_logits_torch_sm120)
        logits = index(b.index_q, b.index_cache, b.index_w, b.seq_lens, b.page_table, None,
                       b.width, False)
        out, _ = flash_mla_sm120.flash_mla_with_kvcache_sm120(**b.attn)
        return out, logits, mixes
'''

SYNTHETIC = "def f(x):\n    return x\n\n\ndef g(x):\n    return x\n"  # observe_bm: f watched, g not

# Stubs for --cpu-dry-run: the modules' names and every derived target's qualname, the
# call graph and the gates of the real ones, no torch. "CUDA" belongs to the pid that
# built the inputs: any op of another pid (a forked child) raises as CUDA would.
STUBS = {
    "dry_device.py": '''\
import os
OWNER = [None]


class Fake:
    def __init__(self, *shape):
        self.shape = shape
        OWNER[0] = OWNER[0] or os.getpid()


def op(*tensors):
    if OWNER[0] is not None and os.getpid() != OWNER[0]:
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess (dry run)")
    return Fake(*tensors[0].shape) if tensors else None
''',
    "sglang/srt/layers/attention/flash_mla_sm120.py": '''\
import os
from dry_device import op
_sm120_default_backend = (
    "triton" if os.environ.get("SGLANG_SM120_TRITON_FLASHMLA", "1") == "1" else "torch")
_sm120_splitk_mma = os.environ.get("MMA_FLASHMLA") == "1"


def flash_mla_with_kvcache_sm120(**kwargs):
    if _sm120_default_backend == "triton":
        from sglang.srt.layers.attention.flash_mla_sm120_triton import (
            flash_mla_sparse_decode_triton)
        return flash_mla_sparse_decode_triton(
            kwargs["q"], kwargs["k_cache"], kwargs["indices"], None, None, 512, None,
            splitk_mma=_sm120_splitk_mma)
    return op(kwargs["q"]), None
''',
    "sglang/srt/layers/attention/flash_mla_sm120_triton.py": '''\
import functools
from dry_device import op


def _tiled_sparse_decode_kernel():
    pass


def _run_triton_sparse_decode(q, k_cache, indices, topk_length, softmax_scale):
    return op(q), None


def _splitk_mma_decode_kernel():
    pass


def _splitk_combine_kernel():
    pass


@functools.lru_cache(maxsize=None)
def _num_sms(device_index):
    return 132


def _run_splitk_mma_sparse_decode(q, k_cache, indices, topk_length, softmax_scale):
    B, _, H, D = q.shape
    assert D == 512 and H % 16 == 0, f"{q.shape=}"
    _num_sms(0)
    return op(q), None


def flash_mla_sparse_decode_triton(q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                                   softmax_scale, extra_k_cache=None, extra_indices=None,
                                   extra_topk_length=None, splitk_mma=False):
    run = _run_splitk_mma_sparse_decode if splitk_mma else _run_triton_sparse_decode
    return run(q, k_cache, indices, topk_length, softmax_scale)
''',
    "dsv4_indexer_fns.py": '''\
import functools
import os
from dry_device import op


def fp8_paged_mqa_logits_torch_sm120(q, cache, w, seq_lens, table, meta, width, clean=True):
    return op(q)


def _fp8_paged_mqa_logits_sm120_kernel():
    pass


@functools.lru_cache(maxsize=None)
def _num_sms(device_index):
    return 132


def fp8_paged_mqa_logits_triton_sm120(q, cache, w, seq_lens, table, meta, width,
                                      clean=True):
    _num_sms(0)
    return op(q)


_TRITON_INDEXER = os.environ.get("TRITON_INDEXER") == "1"
''',
    "mhc_fns.py": '''\
from dry_device import op


def hc_pre_torch_impl(x, hc_fn):
    return op(x), op(x)
''',
}

WRAP_SHIM = '''\
"""observe_gpu.py's wrap-mode shim (not deployed anywhere): takes sys.monitoring tool ids
2-5, so that the deployed tracer finds none free and wraps functions (its mode before
Python 3.12), then runs the deployed sitecustomize.py of TRACE_DIR unchanged. Guarded: the
deployed one chains to the next sitecustomize on the path, which is this file again."""
import importlib.util
import os
import sys

if not getattr(sys, "_observe_gpu_shim", False):
    sys._observe_gpu_shim = True
    _mon = getattr(sys, "monitoring", None)
    if _mon is not None:
        for _tool in (2, 3, 4, 5):
            if _mon.get_tool(_tool) is None:
                _mon.use_tool_id(_tool, "observe-gpu-blocker")
    _spec = importlib.util.spec_from_file_location(
        "_deployed_sitecustomize", os.path.join(TRACE_DIR, "sitecustomize.py"))
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
'''


def build_tree(dest: Path, src: Path, dry: bool) -> None:
    """The sglang package the schedulers import: prepare_src.py's patched modules (or the
    stubs) + the bench model_executor."""
    if dry:
        for name in ("sglang", "sglang/srt", "sglang/srt/layers", "sglang/srt/layers/attention"):
            (dest / name).mkdir(parents=True, exist_ok=True)
            (dest / name / "__init__.py").write_text("")
        for name, text in STUBS.items():
            (dest / name).write_text(text)
    else:
        shutil.copytree(src / "patched", dest, dirs_exist_ok=True)
    (dest / "sglang/srt/model_executor").mkdir(parents=True, exist_ok=True)
    (dest / "sglang/srt/model_executor/__init__.py").write_text("")
    (dest / "sglang/srt/model_executor/forward_batch_info.py").write_text(FORWARD_BATCH_INFO)
    (dest / "sglang/srt/model_executor/model_runner.py").write_text(MODEL_RUNNER)
    (dest / "observe_bm.py").write_text(SYNTHETIC)


# ---------------------------------------------------------------- inputs (in a scheduler)

def make_batches(dry: bool) -> dict:
    """{decode, extend, idle, bad}: ForwardBatches of the bench model (bad: a decode batch
    whose q has 60 heads, which the split-K decode asserts against)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    if dry:
        from dry_device import Fake

        def batch(mode, rows, heads=HEADS):
            return ForwardBatch(mode, hidden=Fake(rows, 4, 4096), hc_fn=Fake(24, 16384),
                                index_q=Fake(rows, 1, 64, 128), index_cache=Fake(1, 64, 1, 132),
                                index_w=Fake(rows, 64), seq_lens=Fake(rows, 1),
                                page_table=Fake(rows, 1), width=4096,
                                attn={"q": Fake(rows, 1, heads, 512), "k_cache": Fake(1),
                                      "indices": Fake(rows, 1, 128)})
        return {"decode": batch(ForwardMode.DECODE, DECODE_B),
                "extend": batch(ForwardMode.EXTEND, CHUNK),
                "idle": ForwardBatch(ForwardMode.IDLE),
                "bad": batch(ForwardMode.DECODE, DECODE_B, heads=60)}
    import torch
    sys.path.insert(0, str(HERE))
    import numerics as nx
    torch.manual_seed(0)
    dev, D = "cuda", nx.D
    swa_cache, swa64 = nx.make_mla_cache(64, 128)
    c4_cache, c464 = nx.make_mla_cache(256, 64)
    hc_fn = torch.randn(24, 16384, device=dev) * 16384 ** -0.5

    def attn(rows, heads=HEADS):
        return dict(q=torch.randn(rows, 1, heads, D, device=dev).to(torch.bfloat16),
                    k_cache=swa_cache, head_dim_v=D, softmax_scale=D ** -0.5,
                    indices=nx.make_indices(rows, 128, swa64.shape[0]),
                    topk_length=torch.randint(1, 129, (rows,), device=dev, dtype=torch.int32),
                    attn_sink=torch.randn(heads, device=dev, dtype=torch.float32),
                    extra_k_cache=c4_cache,
                    extra_indices_in_kvcache=nx.make_indices(rows, 512, c464.shape[0]),
                    extra_topk_length=torch.randint(1, 513, (rows,), device=dev,
                                                    dtype=torch.int32))

    def index(rows, width, causal):
        pages = width // nx.BS
        if causal:    # a prefill chunk: one row per query token, one sequence's table
            cache, _, _ = nx.make_index_cache(pages + 1)
            table = torch.randperm(pages + 1, device=dev)[:pages].int().expand(rows, pages)
            lens = torch.arange(width - rows + 1, width + 1, device=dev, dtype=torch.int32)
        else:
            cache, _, _ = nx.make_index_cache(rows * pages + 1)
            table = torch.randperm(rows * pages + 1, device=dev)[: rows * pages].int()
            table = table.view(rows, pages)
            lens = torch.full((rows,), 1024, device=dev, dtype=torch.int32)
        return dict(index_q=torch.randn(rows, 1, nx.NH, nx.HD, device=dev).to(
                        torch.float8_e4m3fn),
                    index_cache=cache, index_w=torch.randn(rows, nx.NH, device=dev) * 0.1,
                    seq_lens=lens.unsqueeze(-1), page_table=table.contiguous(), width=width)

    def batch(mode, rows, width, causal, heads=HEADS):
        return ForwardBatch(mode, hidden=torch.randn(rows, 4, 4096, device=dev).to(
            torch.bfloat16), hc_fn=hc_fn, attn=attn(rows, heads),
            **index(rows, width, causal))
    return {"decode": batch(ForwardMode.DECODE, DECODE_B, 16384, False),
            "extend": batch(ForwardMode.EXTEND, CHUNK, 4096, True),
            "idle": ForwardBatch(ForwardMode.IDLE),
            "bad": batch(ForwardMode.DECODE, DECODE_B, 16384, False, heads=60)}


def sync(dry: bool) -> None:
    if not dry:
        import torch
        torch.cuda.synchronize()


# ---------------------------------------------------------------- a scheduler process

def set_title(title: str) -> None:
    """As SGLang's scheduler does (setproctitle); comm only when setproctitle is absent."""
    try:
        import setproctitle
        setproctitle.setproctitle(title)
    except ImportError:
        import ctypes
        ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)   # PR_SET_NAME


def scheduler(spec: dict, conn) -> None:
    """Spawned by the main process (multiprocessing "spawn", like SGLang's
    run_scheduler_process). Runs spec["work"] and sends what happened."""
    set_title(f"sglang::scheduler_{spec['name']}")
    res: dict = {"name": spec["name"], "pid": os.getpid(), "ppid": os.getppid(),
                 "env": {k: os.environ.get(k) for k in ("MMA_FLASHMLA", "TRITON_INDEXER")},
                 "forwards": {}, "errors": []}
    try:
        from sglang.srt.model_executor import model_runner
        runner = model_runner.ModelRunner(is_draft_worker=False)
        work = spec["work"]
        batches = make_batches(spec["dry"]) if work else {}
        for item in work:
            kind, count = item[0], (item[1] if len(item) > 1 else 1)
            if kind in ("decode", "extend", "idle"):
                for _ in range(count):
                    runner.forward(batches[kind])
                sync(spec["dry"])
                res["forwards"][kind] = res["forwards"].get(kind, 0) + count
            elif kind == "raise":
                try:
                    runner.forward(batches["bad"])
                    res["errors"].append("the bad batch did not raise")
                except Exception as exc:  # noqa: BLE001
                    res["raised"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            elif kind == "fork":
                res["fork"] = fork_after_cuda(runner, batches, spec)
    except Exception as exc:  # noqa: BLE001
        import traceback
        res["errors"].append(traceback.format_exc()[-2000:])
    conn.send(res)
    conn.close()


def fork_after_cuda(runner, batches: dict, spec: dict) -> dict:
    """os.fork() with CUDA initialised: the child tries one decode forward (which must
    fail), writes what happened and _exits; the parent runs 2 more decode forwards."""
    out_file = Path(spec["scratch"]) / f"fork-child-of-{os.getpid()}.json"
    pid = os.fork()
    if pid == 0:
        child = {"pid": os.getpid(), "ppid": os.getppid()}
        try:
            runner.forward(batches["decode"])
            sync(spec["dry"])
            child["forward"] = "returned"
        except BaseException as exc:  # noqa: BLE001
            child["forward"] = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        try:
            out_file.write_text(json.dumps(child))
        finally:
            os._exit(0)
    deadline = time.monotonic() + 120
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = "killed after 120 s"
    child = json.loads(out_file.read_text()) if out_file.exists() else {"pid": pid}
    child["status"] = status
    for _ in range(2):
        runner.forward(batches["decode"])
    sync(spec["dry"])
    return {"child": child, "parent_forwards_after": 2}


# ---------------------------------------------------------------- a server's main process

def server_main(config_path: Path) -> int:
    """Like launch_server: imports no kernel, starts the schedulers with "spawn" (gate
    variables set in os.environ before each start), waits, writes what they sent."""
    import multiprocessing as mp
    config = json.loads(config_path.read_text())
    ctx = mp.get_context("spawn")
    procs = []
    for spec in config["schedulers"]:
        saved = {k: os.environ.get(k) for k in spec["env"]}
        for key, value in spec["env"].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=scheduler, args=(dict(spec, dry=config["dry"],
                                                        scratch=config["scratch"]), child))
        proc.start()
        child.close()
        procs.append((spec, proc, parent))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    results = []
    for spec, proc, conn in procs:
        res = conn.recv() if conn.poll(config["timeout"]) else {
            "name": spec["name"], "errors": ["no result in time"]}
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        res["exitcode"] = proc.exitcode
        results.append(res)
    out = {"main_pid": os.getpid(), "schedulers": results}
    Path(config["out"]).write_text(json.dumps(out, indent=1))
    return 0


# ---------------------------------------------------------------- cost (after first hits)

def cost_child(dry: bool, calls: int, batches_n: int) -> dict:
    import observe_bm
    held = observe_bm.f                      # taken before the first call (a dispatch table)
    from sglang.srt.layers.attention import flash_mla_sm120
    from sglang.srt.model_executor import model_runner
    runner = model_runner.ModelRunner()
    batches = make_batches(dry)
    for _ in range(2):                       # first hits, every forward mode's re-arm
        runner.forward(batches["decode"])
        runner.forward(batches["idle"])
        observe_bm.f(1)
        held(1)
        flash_mla_sm120.flash_mla_with_kvcache_sm120(**batches["decode"].attn)
    sync(dry)

    def best(fn, n, *args, gpu=False):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                fn(*args)
            if gpu:
                sync(dry)
            times.append((time.perf_counter() - t) / n)
        return min(times)

    loop = best(lambda: None, calls)            # subtracted from every row: the loop
    out = {"a function that is no target (observe_bm.g)": best(lambda: observe_bm.g(1), calls),
           "target by attribute (observe_bm.f)": best(lambda: observe_bm.f(1), calls),
           "target through a reference held before its first call": best(held, calls, 1),
           "ModelRunner.forward, IDLE batch": best(runner.forward, calls // 5,
                                                   batches["idle"]),
           "ModelRunner.forward, DECODE batch (real kernels, synced per rep)": best(
               runner.forward, batches_n, batches["decode"], gpu=True),
           "flash_mla_with_kvcache_sm120, DECODE B=16 (synced per rep)": best(
               lambda: flash_mla_sm120.flash_mla_with_kvcache_sm120(**batches["decode"].attn),
               batches_n, gpu=True)}
    out = {k: v - loop for k, v in out.items()}
    mod = sys.modules.get("patchset_tracer")
    tracer = getattr(mod, "_tracer", None) if mod else None
    return {"mode": (("sys.monitoring" if tracer.monitoring else "wrap") if tracer else "off"),
            "python": sys.version.split()[0], "ns": {k: v * 1e9 for k, v in out.items()}}


# ---------------------------------------------------------------- the controller

def site(tmp: Path, dry: bool, src: Path) -> dict[str, Path]:
    dirs = {"trace": tmp / "trace", "shim": tmp / "shim", "tree": tmp / "tree",
            "scratch": tmp / "scratch"}
    for d in dirs.values():
        d.mkdir(parents=True)
    shutil.copy(AGENT / "lib" / "tracer.py", dirs["trace"] / "patchset_tracer.py")    # as deploy
    shutil.copy(AGENT / "sitecustomize.py", dirs["trace"] / "sitecustomize.py")
    (dirs["shim"] / "sitecustomize.py").write_text(
        f"TRACE_DIR = {str(dirs['trace'])!r}\n" + WRAP_SHIM)
    build_tree(dirs["tree"], src, dry)
    return dirs


def environ(dirs: dict[str, Path], mode: str, trace: str | None, patches: str | None,
            records: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PATCHSET_") and k not in ("MMA_FLASHMLA", "TRITON_INDEXER")}
    path = [str(dirs["trace"]), str(dirs["tree"])]
    if mode == "wrap":
        path.insert(0, str(dirs["shim"]))
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    if trace is not None and mode != "off":
        env.update(PATCHSET_TRACE=trace, PATCHSET_TRACE_DIR=str(records),
                   PATCHSET_PATCHES=patches or "")
    return env


SCHEDULERS = {
    # name: (env, work)
    "series": [
        ("TP0", {"MMA_FLASHMLA": "1"}, [["decode", 8]]),
        ("TP1", {"MMA_FLASHMLA": "1", "TRITON_INDEXER": "1"}, [["extend", 4]]),
        ("TP2", {"TRITON_INDEXER": "1"}, [["extend", 4], ["decode", 8]]),
        ("TP3", {"MMA_FLASHMLA": "1"}, []),
        ("TP4", {"MMA_FLASHMLA": "1"}, [["raise"]]),
        ("TP5", {"MMA_FLASHMLA": "1"}, [["decode", 2], ["fork"]]),
        ("TP6", {"MMA_FLASHMLA": "1"}, [["idle", 4]]),
    ],
    "manifest": [
        ("TP0", {}, [["extend", 4], ["decode", 8]]),
        ("TP1", {"MMA_FLASHMLA": "1"}, [["decode", 8]]),
    ],
}


def run_servers(dirs: dict[str, Path], targets: dict, dry: bool, modes: list[str],
                timeout: int) -> dict:
    """Start every (server, mode) at once, as units would be; wait; return their results
    and records dirs."""
    from patchset.deploy import units
    applied = [{"name": p["name"], "sha256": p["sha256"], "path": p["path"]}
               for p in targets["series"]]
    runs = {}
    for server, schedulers in SCHEDULERS.items():
        traces = dict(targets["bench"])
        if server == "manifest":
            traces.update(targets["manifest_replace"])
        trace = units.trace_value(applied, traces)
        patches = units.patches_value(applied, "decode")
        for mode in modes:
            key = f"{server}/{mode}"
            records = dirs["scratch"] / f"{server}-{mode}"
            records.mkdir(mode=0o700)
            config = {"schedulers": [{"name": n, "env": {"MMA_FLASHMLA": None,
                                                         "TRITON_INDEXER": None, **e},
                                      "work": w} for n, e, w in schedulers],
                      "dry": dry, "scratch": str(dirs["scratch"]), "timeout": timeout,
                      "out": str(dirs["scratch"] / f"{server}-{mode}.json")}
            cfg = dirs["scratch"] / f"{server}-{mode}.config.json"
            cfg.write_text(json.dumps(config))
            env = environ(dirs, mode, trace, patches, records)
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                     "--server", str(cfg)], env=env, cwd=str(dirs["scratch"]),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            runs[key] = {"proc": proc, "records": records, "out": Path(config["out"]),
                         "trace": trace, "patches": patches}
    for key, run in runs.items():
        try:
            output, _ = run["proc"].communicate(timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            run["proc"].kill()
            output, _ = run["proc"].communicate()
        run["output"] = output[-4000:]
        run["rc"] = run["proc"].returncode
        run["result"] = json.loads(run["out"].read_text()) if run["out"].exists() else None
        del run["proc"]
    return runs


def judge(run: dict, targets: dict) -> dict:
    """The records dir through the gatherer's primitive, the fact's parser and the
    auditor's rule: per process and for the whole server."""
    from patchset.auditor.model import Proc, Server
    from patchset.auditor.observed import modes_ran, observe, unavailable
    from patchset.agent.lib.facts.base import FactValue
    from patchset.agent.lib.facts.trace import TraceRecords
    from patchset.agent.lib.redact import Redactor
    from patchset.agent.runner import Runner

    fact = TraceRecords()
    raw = Runner(Redactor()).trace_dir(fact.command(path=str(run["records"])))
    collected = fact.collect(raw)
    records = collected.value if collected.known else []
    main_pid = (run["result"] or {}).get("main_pid")
    env = FactValue({"PATCHSET_PATCHES": run["patches"]})

    def server(recs: list[dict], label: str) -> Server:
        main = Proc(main_pid or 0, "python3", None, env)
        srv = Server(id=label, kind="server", unit=None, main=main, children=[])
        srv.trace = FactValue(recs, provenance=collected.provenance, source=label)
        return srv

    def verdicts(srv: Server) -> dict:
        out = {}
        for p in targets["series"]:
            word = f"{p['name']}:{p['sha256'][:12]}"
            paths = [x for x in ("prefill", "decode") if p["path"] in (None, "both", x)]
            gated = p.get("gate") is not None
            obs = observe(srv, word, paths, gated)
            if obs is None:
                out[p["name"]] = {"verdict": "none", "why": "no records"}
                continue
            verdict = "ran" if obs.ran else "not run" if obs.observed_not_run else "none"
            out[p["name"]] = {
                "verdict": verdict, "modes": sorted(modes_ran(srv, word, gated)),
                "why": obs.none if verdict == "none" else (
                    "; ".join(f"{e['target']} returned in pid {e['pid']}" for e in obs.ran[:2])
                    if obs.ran else obs.not_run[0]["forwards"]),
                "raised": sorted({e["raised"] for e in obs.entered if e.get("raised")})}
        return out

    per_process = {}
    for rec in records:
        per_process[rec["pid"]] = {
            "title": rec.get("title"), "ppid": rec.get("ppid"), "mode": rec.get("mode"),
            "forward": rec.get("forward") or {},
            "verdicts": verdicts(server([rec], f"pid {rec['pid']}"))}
    whole = server(records, "server")
    return {"records": len(records), "processes": per_process, "server": verdicts(whole),
            "unavailable": unavailable(whole), "raw_records": records}


CASES = [
    # (case, server, scheduler ('main', 'TPn', 'TPn-child'), patch, expected, truth, check)
    ("1 ran in decode", "series", "TP0", "mma-splitk-decode", "ran",
     "split-K ran in 8 decode forwards", "modes has decode"),
    ("2 ran in extend", "series", "TP1", "mhc-bf16", "ran",
     "hc_pre ran in 4 extend forwards", "modes has extend"),
    ("3 gated off (manifest trace: replace)", "manifest", "TP0", "mma-splitk-decode",
     "not run", "MMA_FLASHMLA unset: split-K never called", ""),
    ("3 gate on, same targets", "manifest", "TP1", "mma-splitk-decode", "ran",
     "MMA_FLASHMLA=1: split-K ran", "modes has decode"),
    ("3 routed off by the Triton gate", "series", "TP2", "indexer-bf16-gemm", "not run",
     "TRITON_INDEXER=1: the torch indexer never called", ""),
    ("3 gated off, targets as derived", "series", "TP2", "mma-splitk-decode", "none",
     "MMA_FLASHMLA unset: split-K never called; its changed dispatcher ran (with the gate "
     "off too), its kernels cannot be watched", "why has 'behaviour off too'"),
    ("4 no forward pass", "series", "TP3", "mhc-bf16", "none",
     "imported, nothing ran", "why has 'forward pass'"),
    ("4 no forward pass", "series", "TP3", "mma-splitk-decode", "none",
     "imported, nothing ran", ""),
    ("4 only IDLE forward passes", "series", "TP6", "mhc-bf16", "none",
     "imported, 4 IDLE forwards (a DP rank without requests)", "why has 'forward pass'"),
    ("5 call raised", "series", "TP4", "mma-splitk-decode", "none",
     "split-K asserted (60 heads), the forward raised", "no decode forward counted"),
    ("6 fork after CUDA: child", "series", "TP5-child", "mma-splitk-decode", "none",
     "the child's forward failed", "own record, ppid = parent, no forward"),
    ("6 fork after CUDA: parent", "series", "TP5", "mma-splitk-decode", "ran",
     "2 decode forwards before and 2 after the fork", "decode count 4, modes has decode"),
    ("0 main process", "series", "main", "mhc-bf16", "none",
     "imports no kernel", "why has 'not imported'"),
]


def check_case(case: tuple, judged: dict, result: dict) -> tuple[str, str, bool, str]:
    """(process label, got, ok, detail) for one case."""
    _, _, who, patch, expected, _, check = case
    scheds = {s["name"]: s for s in (result or {}).get("schedulers", [])}
    procs = judged["processes"]
    if who == "main":
        pid = (result or {}).get("main_pid")
    elif who.endswith("-child"):
        pid = ((scheds.get(who[:-6]) or {}).get("fork") or {}).get("child", {}).get("pid")
    else:
        pid = (scheds.get(who) or {}).get("pid")
    proc = procs.get(pid)
    if proc is None:
        return f"{who} (pid {pid})", "no record", False, "no record for this process"
    v = proc["verdicts"][patch]
    got = v["verdict"]
    ok = got == expected
    detail = v["why"][:150]
    if check == "modes has decode":
        ok &= "decode" in v["modes"]
    if check == "modes has extend":
        ok &= "extend" in v["modes"]
    if "decode count 4" in check:
        ok &= (proc["forward"].get("decode") or {}).get("count") == 4
    if check.startswith("why has"):
        ok &= check.split("'")[1] in v["why"]
    if check == "no decode forward counted":
        ok &= "decode" not in proc["forward"]
        ok &= bool((scheds.get(who) or {}).get("raised"))
    if check.startswith("own record"):
        parent = (scheds.get("TP5") or {}).get("pid")
        ok &= proc["ppid"] == parent and not proc["forward"] and pid != parent
        ok &= str((((scheds.get("TP5") or {}).get("fork") or {}).get("child") or {}).get(
            "forward", "")).startswith("raised")
    modes = ",".join(v["modes"]) or "-"
    if v.get("raised"):
        detail = f"raised {','.join(v['raised'])}; {detail}"
    return (f"{who} {proc['title']} pid {pid}", f"{got} [{modes}]", ok, detail)


def controller(args) -> int:
    sys.path.insert(0, str(ROOT))
    src = args.src
    targets = json.loads((src / "targets.json").read_text())
    dry = args.cpu_dry_run
    started = time.time()
    info = {"python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d"),
            "dry_run": dry}
    if not dry:
        import torch
        info.update(device=torch.cuda.get_device_name(0), torch=torch.__version__)
    modes = ["default", "wrap"]
    with tempfile.TemporaryDirectory(prefix="observe-gpu-") as tmp:
        dirs = site(Path(tmp), dry, src)
        runs = run_servers(dirs, targets, dry, modes, args.timeout)
        results = {}
        for key, run in runs.items():
            judged = judge(run, targets)
            results[key] = {"rc": run["rc"], "output": run["output"], "result": run["result"],
                            "trace": run["trace"], **judged}
        cost = {} if args.no_cost else measure_cost(dirs, targets, dry, args)
    rows, wrong, findings = [], 0, []
    for mode in modes:
        for case in CASES:
            key = f"{case[1]}/{mode}"
            res = results[key]
            proc, got, ok, detail = check_case(case, res, res["result"])
            finding = case[6] == "FINDING"
            rows.append({"case": case[0], "server": key, "process": proc, "patch": case[3],
                         "expected": case[4], "got": got, "ok": ok, "truth": case[5],
                         "detail": detail, "finding": finding})
            wrong += not ok
            if finding:
                findings.append(rows[-1])
    rc_bad = {k: r["rc"] for k, r in results.items() if r["rc"] != 0}
    errors = {f"{k}/{s['name']}": s["errors"] for k, r in results.items()
              for s in (r["result"] or {}).get("schedulers", []) if s.get("errors")}
    # ---- print
    mode_of = {k: sorted({p["mode"] for p in r["processes"].values() if p["mode"]})
               for k, r in results.items()}
    print(f"observe_gpu: {info.get('device', 'CPU dry run (stub kernels)')}, Python "
          f"{info['python']}" + (f", torch {info['torch']}" if 'torch' in info else "") +
          f"; tracer modes seen: {mode_of}")
    print(f"{'case':38} {'server/mode':16} {'process':44} {'patch':18} {'expected':8} "
          f"{'got':24} OK")
    for r in rows:
        mark = "yes" if r["ok"] else "NO"
        if r["finding"]:
            mark += " (finding: truth says not run)"
        print(f"{r['case']:38} {r['server']:16} {r['process'][:44]:44} {r['patch']:18} "
              f"{r['expected']:8} {r['got']:24} {mark}")
    print("details:")
    for r in rows:
        print(f"  {r['case']} / {r['server']}: {r['detail']}")
    for key, res in results.items():
        print(f"server {key}: {res['records']} records; whole server: " + ", ".join(
            f"{n} {v['verdict']}" for n, v in res["server"].items()))
    if cost:
        print_cost(cost)
    if rc_bad or errors:
        print(f"process errors: rc {rc_bad} {json.dumps(errors)[:3000]}")
        for key, res in results.items():
            if res["rc"]:
                print(f"--- {key} output:\n{res['output']}")
    print(f"{len(rows) - wrong} of {len(rows)} cases as expected; {len(findings)} finding(s); "
          f"{time.time() - started:.1f} s")
    if args.json:
        for res in results.values():
            res.pop("output", None) if not res["rc"] else None
        doc = {**info, "command": " ".join(sys.argv), "cases": rows, "cost": cost,
               "targets": {k: targets[k] for k in ("bench", "manifest_replace")},
               "servers": results, "seconds": round(time.time() - started, 1)}
        args.json.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    return 1 if wrong or rc_bad or errors else 0


def measure_cost(dirs: dict[str, Path], targets: dict, dry: bool, args) -> dict:
    from patchset.deploy import units
    applied = [{"name": p["name"], "sha256": p["sha256"], "path": p["path"]}
               for p in targets["series"]]
    traces = dict(targets["bench"])
    traces["observe-bench:" + "0" * 12] = [{"module": "observe_bm", "qualname": "f"}]
    applied.append({"name": "observe-bench", "sha256": "0" * 64, "path": "both"})
    trace = units.trace_value(applied, traces)
    out: dict = {}
    for rnd in range(args.rounds):          # interleaved rounds: drift hits every mode
        for mode in ("off", "default", "wrap"):
            records = dirs["scratch"] / f"cost-{mode}-{rnd}"
            records.mkdir(mode=0o700)
            env = environ(dirs, mode, trace, "", records)
            env.update(MMA_FLASHMLA="1")
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--cost",
                                   str(args.calls), str(args.batches)] +
                                  (["--cpu-dry-run"] if dry else []),
                                  env=env, cwd=str(dirs["scratch"]), capture_output=True,
                                  text=True, timeout=args.timeout)
            entry = out.setdefault(mode, {"rounds": []})
            if proc.returncode:
                entry["error"] = proc.stderr[-2000:]
                continue
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            got["records"] = len(list(records.glob("*.json")))
            entry["rounds"].append(got)
            entry["mode"], entry["python"] = got["mode"], got["python"]
    for entry in out.values():
        if entry["rounds"]:
            keys = entry["rounds"][0]["ns"]
            entry["ns"] = {k: min(r["ns"][k] for r in entry["rounds"]) for k in keys}
            entry["ns_max"] = {k: max(r["ns"][k] for r in entry["rounds"]) for k in keys}
    return out


def print_cost(cost: dict) -> None:
    modes = [m for m in ("off", "default", "wrap") if "ns" in cost.get(m, {})]
    rounds = len(cost[modes[0]]["rounds"]) if modes else 0
    print(f"tracer cost after the first hits: ns per call, an empty loop's time subtracted; "
          f"best of 5 repetitions in a process, min (max) over {rounds} interleaved rounds "
          "of fresh processes per mode:")
    names = {m: cost[m]["mode"] for m in modes}
    print(f"{'call':66} " + " ".join(f"{names[m]:>22}" for m in modes))
    for key in cost[modes[0]]["ns"] if modes else []:
        cells = [f"{cost[m]['ns'][key]:.1f} ({cost[m]['ns_max'][key]:.1f})" for m in modes]
        print(f"{key:66} " + " ".join(f"{c:>22}" for c in cells))
    for m in cost:
        if "error" in cost[m]:
            print(f"cost {m}: {cost[m]['error']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=HERE / "_src")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="stub modules instead of the kernels: layout, tracer, judging only")
    ap.add_argument("--derive", action="store_true", help="write SRC/targets.json (CPU)")
    ap.add_argument("--wheel", type=Path, help="the pinned sglang wheel (with --derive)")
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--server", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cost", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.server:
        return server_main(args.server)
    if args.cost:
        print(json.dumps(cost_child(args.cpu_dry_run, *args.cost)))
        return 0
    if args.derive:
        if not args.wheel:
            ap.error("--derive needs --wheel")
        out = derive(args.wheel, args.src)
        for word, ts in out["bench"].items():
            print(word, [("!" if t["kind"] == "kernel" else "") + f"{t['module']}:{t['qualname']}"
                         for t in ts])
        return 0
    return controller(args)


if __name__ == "__main__":
    sys.exit(main())
