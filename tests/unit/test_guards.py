"""Call-path guards (patchset/analysis/guards.py, patchset/analysis/callpath.py): the walk on a small
synthetic package (every kind of test and of read, and what must not count), then the
shipped series on the real pinned 0.5.14 tree: the derived list, recall against the
`requires` and gates, the uncovered listing of `check`, `show`, and the rebase comparison.
The audit's side is tests/unit/test_audit_guards.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tests.hostutil import cli

from patchset.analysis import callpath, guards
from patchset.analysis.guards import Guard, PatchGuards
from patchset.series.manifest import load_series

ROOT = Path(__file__).resolve().parents[2]
PKG = "python/sglang/"

ENVIRON = '''
class EnvBool: ...
class EnvInt: ...


class Envs:
    SGLANG_SKIP = EnvBool(False)
    SGLANG_SIZE = EnvInt(4)
'''
SERVER_ARGS = '''
BACKENDS = ["fa3", "dsv4"]


@dataclasses.dataclass
class ServerArgs:
    attention_backend: A[Optional[str], Arg(help="x", choices=BACKENDS)] = None
    tp_size: int = 1
    device: Optional[str] = None

    def __post_init__(self):
        self.device = "cuda"
'''
OP = '''import os

from sglang.srt.environ import envs
from sglang.srt.utils import get_bool_env_var, is_hip, is_sm120_supported

_is_hip = is_hip()
_MODE = "fast" if os.environ.get("SGLANG_MODE", "1") == "1" else "slow"


def kernel(x, fast):
    if fast:
        return x * 3
    return x


def dispatch(x, server_args):
    if envs.SGLANG_SKIP.get():
        return x
    if _is_hip:
        y = x
    elif server_args.tp_size > 1 and is_sm120_supported():
        y = kernel(x, fast=_MODE == "fast")
    else:
        y = None
    return y if get_bool_env_var("SGLANG_UNRELATED") else y
'''
BACKEND = '''import os

from sglang.srt.layers.op import dispatch


class Backend:
    def forward(self, x):
        return dispatch(x, self.server_args) if os.getenv("SGLANG_USE_BACKEND") else None
'''
REGISTRY = '''from sglang.srt.layers.backend import Backend


def register_attention_backend(name):
    return lambda fn: fn


@register_attention_backend("dsv4")
def make_backend(runner):
    if global_server_args_dict["device"] == "npu":
        return None
    return Backend()
'''
NOISE = '''from sglang.srt.layers.op import kernel


class A:
    def forward(self, x):
        if envs.SGLANG_SKIP.get():
            return None
        return x


class B:
    def forward(self, x):
        return x


class C:
    def forward(self, x):
        return x


def caller(obj, x):
    if os.environ.get("SGLANG_NOISE") == "1":
        return obj.forward(x)
'''


def synthetic() -> callpath.SourceTree:
    files = {"srt/environ.py": ENVIRON, "srt/server_args.py": SERVER_ARGS,
             "srt/layers/op.py": OP, "srt/layers/backend.py": BACKEND,
             "srt/registry.py": REGISTRY, "srt/noise.py": NOISE,
             "srt/utils.py": "def is_hip():\n    return False\n"}
    return callpath.SourceTree(PKG, {PKG + k: v for k, v in files.items()})


def line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_the_walk_finds_each_kind_of_test_and_nothing_else() -> None:
    """From `kernel`'s changed line up three hops: a tested parameter (to the argument,
    to the module constant, to the env read), an early return, the negated `if` of an
    `elif`, `and` operands, a ternary, a class instantiated by a registered function;
    `get_bool_env_var` after the call and `forward` (four definitions) are not followed."""
    tree = synthetic()
    defaults = callpath.read_defaults(tree)
    assert defaults.envs["SGLANG_SKIP"] == ("bool", False, True)
    assert defaults.server["tp_size"] == (1, True)
    assert defaults.choices["attention_backend"] == {"fa3", "dsv4"}
    assert defaults.rewritten == {"device"}
    target = callpath.Target(PKG + "srt/layers/op.py", "kernel",
                             frozenset({line(OP, "return x * 3")}))
    found, notes = callpath.Walk(tree, defaults).run([target])
    got = {(r.fact, c.file.rsplit("/", 1)[1], c.line, c.function, c.hops, c.needs, r.parse)
           for c in found for r in c.reads}
    listing = "\n".join(map(str, sorted(got)))
    assert got == {
        ("env.SGLANG_MODE", "op.py", line(OP, "if fast:"), "kernel", 0, True, "raw"),
        ("env.SGLANG_SKIP", "op.py", line(OP, "if envs.SGLANG_SKIP"), "dispatch", 1, False,
         "bool"),
        ("platform.hip", "op.py", line(OP, "if _is_hip:"), "dispatch", 1, False, "raw"),
        ("server.tp_size", "op.py", line(OP, "elif server_args"), "dispatch", 1, True, "raw"),
        ("gpu.compute_cap", "op.py", line(OP, "elif server_args"), "dispatch", 1, True, "raw"),
        ("env.SGLANG_USE_BACKEND", "backend.py", line(BACKEND, "os.getenv"), "Backend.forward",
         2, True, "raw"),
        ("server.attention_backend", "registry.py", line(REGISTRY, "@register"), "make_backend",
         3, True, "raw"),
        ("server.device", "registry.py", line(REGISTRY, "global_server_args_dict"),
         "make_backend", 3, False, "startup"),
    }, listing
    mode = next(r for c in found for r in c.reads if r.fact == "env.SGLANG_MODE")
    assert (mode.default, mode.has_default) == ("1", True)
    assert mode.via == (f"fast=_MODE == 'fast' (op.py:{line(OP, 'fast=_MODE')}) <- _MODE "
                        f"(op.py:{line(OP, '_MODE = ')})")
    assert notes == ["forward: more than 3 definitions in the tree, callers through "
                     "`obj.forward` not followed"]


def test_an_overlay_replaces_files_and_keeps_the_rest() -> None:
    tree = synthetic()
    assert tree.mentioning("Backend") == (PKG + "srt/layers/backend.py", PKG + "srt/registry.py")
    changed = tree.overlay({PKG + "srt/registry.py": "x = 1\n", PKG + "srt/noise.py": None,
                            "python/outside.py": "Backend\n"})
    assert changed.mentioning("Backend") == (PKG + "srt/layers/backend.py",)
    assert changed.module(PKG + "srt/layers/op.py") is tree.module(PKG + "srt/layers/op.py")
    assert PKG + "srt/noise.py" not in changed.files and "python/outside.py" not in changed.files


def guard(fact: str, kind: str = "env", line_no: int = 10, function: str = "f",
          file: str = "a.py") -> Guard:
    return Guard(fact, kind, file, line_no, function, 1, "t", True)


def test_coverage_by_requires_gate_a_required_patch_and_a_gpu_fact(series) -> None:
    by = {p.name: p for p in series.patches}
    cases = [
        ("mma-splitk-decode", guard("env.MMA_FLASHMLA"), "gate MMA_FLASHMLA"),
        ("mma-splitk-decode", guard("env.SGLANG_SM120_TRITON_FLASHMLA"),
         "requires env.SGLANG_SM120_TRITON_FLASHMLA"),
        ("indexer-bf16-gemm", guard("env.TRITON_INDEXER"),
         "requires patch.triton-dsa-indexer (its gate TRITON_INDEXER)"),
        ("mhc-bf16", guard("platform.hip", "platform"), "requires gpu.compute_cap"),
        ("mhc-bf16", guard("env.SGLANG_OPT_USE_TILELANG_MHC_PRE"), None),
        ("default-thinking-reasoning", guard("platform.hip", "platform"), None),
    ]
    for name, g, expected in cases:
        assert guards.covered_by(g, by[name], series) == expected, (name, g.fact)


def test_compare_says_what_appeared_vanished_and_moved() -> None:
    old = PatchGuards("p", (guard("env.A", line_no=10), guard("env.A", line_no=20),
                            guard("env.B", line_no=30), guard("server.x", "server", 5, "g")))
    new = PatchGuards("p", (guard("env.A", line_no=12), guard("env.A", line_no=22),
                            guard("env.C", line_no=30), guard("server.x", "server", 5, "g")))
    change = guards.compare(old, new)
    assert [(a.line, b.line) for a, b in change.moved] == [(10, 12), (20, 22)]
    assert [g.fact for g in change.appeared] == ["env.C"]
    assert [g.fact for g in change.vanished] == ["env.B"]
    assert change.changed and not guards.compare(old, old).changed


# ---------------------------------------------------------------- the shipped series

C4_INDEXER = (       # forward_c4_indexer's tests, lines after triton-dsa-indexer
    ("server.enable_deepseek_v4_fp4_indexer", 631), ("env.SGLANG_OPT_USE_TILELANG_INDEXER", 636),
    ("env.SGLANG_OPT_USE_AITER_INDEXER", 640), ("env.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", 642),
    ("gpu.compute_cap", 643), ("env.TRITON_INDEXER", 646))
DSV4_BACKEND = (     # where the DeepSeek-V4 attention backend is made (its registration)
    *((f"server.{f}", "layers/attention/attention_registry.py:129") for f in (
        "attention_backend", "decode_attention_backend", "prefill_attention_backend")),
    ("platform.npu", "layers/attention/attention_registry.py:131"),
    ("platform.hip", "layers/attention/attention_registry.py:137"),
    ("platform.npu", "speculative/draft_utils.py:241"),
    ("platform.npu", "speculative/draft_utils.py:342"))


def indexer_path(lines_down: int, hop: int) -> set[tuple[str, str, int]]:
    """forward_c4_indexer at `hop`, the backend one further (its HIP draft path too)."""
    return {(f, f"layers/attention/dsv4/indexer.py:{n + lines_down}", hop) for f, n in
            C4_INDEXER} | {(f, w, hop + 1) for f, w in DSV4_BACKEND} | {
        ("platform.hip", "speculative/draft_utils.py:344", hop + 1)}


EXPECTED = {     # (fact, file:line under python/sglang/srt/, hops) per patch
    "default-thinking-reasoning": {
        ("server.reasoning_parser", "entrypoints/openai/serving_chat.py:1734", 0),
        ("server.reasoning_parser", "entrypoints/openai/serving_chat.py:1737", 0),
        ("server.reasoning_parser", "entrypoints/openai/serving_chat.py:1269", 1),
        ("server.reasoning_parser", "entrypoints/openai/serving_chat.py:364", 2),
    },
    "nvfp4-cutlass-swiglu-clamp": {
        *((f, f"layers/quantization/modelopt_quant.py:{n}", 0) for n in (2354, 2382, 2414, 2460)
          for f in ("server.moe_runner_backend", "server.speculative_moe_runner_backend")),
        *((f, "layers/quantization/compressed_tensors/schemes/"
           "compressed_tensors_w4a4_nvfp4_moe.py:306", 1)
          for f in ("server.moe_runner_backend", "server.speculative_moe_runner_backend")),
        ("env.SGL_CPU_QUANTIZATION", "model_loader/loader.py:1391", 3),
    },
    "triton-dsa-indexer": indexer_path(0, 0) | {
        ("server.device", f"model_executor/model_runner.py:{n}", 3) for n in (866, 869, 871)},
    # the tree after triton-dsa-indexer too: the same tests, 2 lines lower, a hop further
    "indexer-bf16-gemm": indexer_path(2, 1),
    "mma-splitk-decode": {
        ("env.SGLANG_SM120_TRITON_FLASHMLA", "layers/attention/flash_mla_sm120.py:225", 0),
        ("env.MMA_FLASHMLA", "layers/attention/flash_mla_sm120_triton.py:565", 0),
        ("server.speculative_eagle_topk", "layers/attention/deepseek_v4_backend.py:1321", 1),
        ("env.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL",
         "layers/attention/deepseek_v4_backend.py:1402", 1),
        ("gpu.compute_cap", "layers/attention/deepseek_v4_backend.py:1416", 1),
        *((f, w, 2) for f, w in DSV4_BACKEND),
    },
    "mhc-bf16": {
        ("env.SGLANG_OPT_USE_TILELANG_MHC_PRE", "models/deepseek_v4.py:1326", 1),
        ("env.SGLANG_OPT_USE_AITER_MHC_PRE", "models/deepseek_v4.py:1348", 1),
        ("env.SGLANG_OPT_DEEPGEMM_HC_PRENORM", "models/deepseek_v4.py:1364", 1),
    },
}
# requires that name no condition on the patch's call path, with why (recall's exception)
NOT_ON_A_PATH = {
    ("mhc-bf16", "server.attention_backend"): "a proxy for 'the model is DeepSeek-V4': "
    "hc_pre is a method of DeepseekV4DecoderLayer, which the model class builds whatever "
    "the attention backend; the backend only says which model the hook saw",
}


@pytest.fixture(scope="module")
def shipped(pinned_base):
    series = load_series(ROOT / "patches.yaml")
    start = time.perf_counter()
    derived = guards.derive(series, pinned_base)
    return series, derived, time.perf_counter() - start


def post_images(tree: callpath.SourceTree, patch: Path) -> dict[str, str]:
    images = guards.post_images(tree, patch.read_text())
    return {path: after.decode() for path, _, after in images if after is not None}


def listing(derived: dict[str, PatchGuards], name: str) -> str:
    return "\n".join(f"{g.fact} {g.where} {g.function} hop {g.hops}: {g.condition}"
                     for g in derived[name].guards)


def test_the_shipped_series_guards_on_the_pinned_tree(shipped, pinned_base) -> None:
    """Each patch's derived list (shown on failure) is the one read off the 0.5.14 code,
    and every guard's line in the tree after the patch holds its test."""
    series, derived, seconds = shipped
    assert list(derived) == [p.name for p in series.patches]
    for name, expected in EXPECTED.items():
        got = {(g.fact, g.file.split("sglang/srt/", 1)[1] + f":{g.line}", g.hops)
               for g in derived[name].guards}
        assert got == expected, f"{name} derived:\n{listing(derived, name)}"
    tree = guards.load_tree(pinned_base, series.upstream)
    for name in ("mhc-bf16", "mma-splitk-decode"):       # nothing earlier changes their files
        images = post_images(tree, ROOT / series.by_name()[name].file)
        for g in derived[name].guards:
            text = images.get(g.file) or tree.files[g.file]
            source = text.splitlines()[g.line - 1]
            assert g.test.split("(")[0].split(" ")[0].strip("@") in source, (g, source)
    mhc = {g.fact: g for g in derived["mhc-bf16"].guards}
    tilelang = mhc["env.SGLANG_OPT_USE_TILELANG_MHC_PRE"]
    # the sm_120 startup hook sets it itself (server_args.py:3796): no default to judge by
    assert (tilelang.function, tilelang.needs, tilelang.parse, tilelang.default,
            tilelang.has_default) == ("DeepseekV4DecoderLayer.hc_pre", False, "startup", True,
                                      False)
    mma = {g.fact: g for g in derived["mma-splitk-decode"].guards}
    assert mma["env.SGLANG_SM120_TRITON_FLASHMLA"].via.startswith(
        "_sm120_default_backend (flash_mla_sm120.py:199)")
    assert mma["env.SGLANG_SM120_TRITON_FLASHMLA"].default == "1"
    assert seconds < 30, f"derivation took {seconds:.1f} s"


def test_recall_every_declared_env_and_server_condition_is_derived(shipped) -> None:
    """What `requires` and `gate` name in env.* / server.* is on the derived call path,
    but for the listed exception, which stays underivable (or the list must shrink)."""
    series, derived, _ = shipped
    for patch in series.patches:
        facts = {g.fact for g in derived[patch.name].guards}
        missing = {f for f in guards.declared_facts(patch) - facts
                   if (patch.name, f) not in NOT_ON_A_PATH}
        assert not missing, f"{patch.name}: {sorted(missing)} not derived:\n" \
                            f"{listing(derived, patch.name)}"
    for (name, fact) in NOT_ON_A_PATH:
        assert fact in guards.declared_facts(series.by_name()[name])
        assert fact not in {g.fact for g in derived[name].guards}, (name, fact)


UNCOVERED = {
    ("nvfp4-cutlass-swiglu-clamp", "server.speculative_moe_runner_backend"),
    ("nvfp4-cutlass-swiglu-clamp", "env.SGL_CPU_QUANTIZATION"),
    ("triton-dsa-indexer", "server.enable_deepseek_v4_fp4_indexer"),
    ("triton-dsa-indexer", "env.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"),
    ("triton-dsa-indexer", "server.decode_attention_backend"),
    ("triton-dsa-indexer", "server.prefill_attention_backend"),
    ("triton-dsa-indexer", "server.device"),
    ("indexer-bf16-gemm", "server.enable_deepseek_v4_fp4_indexer"),
    ("indexer-bf16-gemm", "env.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"),
    ("indexer-bf16-gemm", "server.decode_attention_backend"),
    ("indexer-bf16-gemm", "server.prefill_attention_backend"),
    ("mma-splitk-decode", "server.speculative_eagle_topk"),
    ("mma-splitk-decode", "env.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"),
    ("mma-splitk-decode", "server.decode_attention_backend"),
    ("mma-splitk-decode", "server.prefill_attention_backend"),
    ("mhc-bf16", "env.SGLANG_OPT_USE_TILELANG_MHC_PRE"),
    ("mhc-bf16", "env.SGLANG_OPT_USE_AITER_MHC_PRE"),
    ("mhc-bf16", "env.SGLANG_OPT_DEEPGEMM_HC_PRENORM"),
}


def test_the_uncovered_listing(shipped) -> None:
    """Platform tests are covered by the gpu requirement, gates by gate (a required
    patch's too); what is left is what `check` lists."""
    series, derived, _ = shipped
    missing = guards.uncovered(series, derived)
    assert {(name, g.fact) for name, g in missing} == UNCOVERED, \
        "\n".join(f"{n}: {g.fact} {g.where}" for n, g in missing)
    assert len(missing) == 24 and not any(g.kind == "platform" for _, g in missing)


def test_check_lists_the_uncovered_guards_and_passes(shipped, pinned_base, capsys,
                                                      patchset_home) -> None:
    manifest = str(ROOT / "patches.yaml")
    code, out, err = cli(capsys, "check", "--offline", "--json", "--series", manifest)
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] is True and data["guards"]["derived"] == sum(
        len(g.guards) for g in shipped[1].values())
    assert {(g["patch"], g["fact"]) for g in data["guards"]["uncovered"]} == UNCOVERED
    code, out, err = cli(capsys, "check", "--offline", "--series", manifest)
    assert code == 0 and "check passed" in out, err
    assert ("guards not covered by requires or gate: 24 (information; `patchset show NAME` "
            "lists each patch's)") in out
    assert ("  mhc-bf16: env.SGLANG_OPT_USE_TILELANG_MHC_PRE at python/sglang/srt/models/"
            "deepseek_v4.py:1326 in DeepseekV4DecoderLayer.hc_pre (hop 1): not "
            "envs.SGLANG_OPT_USE_TILELANG_MHC_PRE.get() [set at startup]") in out


def test_show_lists_the_guards_and_what_covers_each(shipped, pinned_base, capsys) -> None:
    manifest = str(ROOT / "patches.yaml")
    code, out, err = cli(capsys, "show", "mma-splitk-decode", "--series", manifest)
    assert code == 0, err
    assert "guards: 12 condition(s) on its call path in the pin" in out
    assert ("  env.SGLANG_SM120_TRITON_FLASHMLA at python/sglang/srt/layers/attention/"
            "flash_mla_sm120.py:225 in flash_mla_with_kvcache_sm120 (hop 0): "
            "_sm120_default_backend == 'triton' [default '1']  covered: requires "
            "env.SGLANG_SM120_TRITON_FLASHMLA") in out
    assert ("deepseek_v4_backend.py:1402 in DeepseekV4AttnBackend.forward (hop 1)") in out
    assert out.count("NOT COVERED") == 4
    code, out, err = cli(capsys, "show", "triton-dsa-indexer", "--json", "--series", manifest)
    data = json.loads(out)
    by = {(g["fact"], g["line"]): g["covered_by"] for g in data["guards"]}
    assert by[("env.TRITON_INDEXER", 646)] == "gate TRITON_INDEXER"
    assert by[("env.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", 642)] is None
    assert any("forward" in n for n in data["guard_notes"])


def test_the_cache_is_keyed_by_what_the_guards_depend_on(shipped, pinned_base,
                                                         tmp_path) -> None:
    """A second lookup reads the stored file; another patch text is another key; without
    a base offline there are none."""
    series, derived, _ = shipped
    first = guards.stored(series, pinned_base, cache=tmp_path)
    assert first == derived
    [stored_file] = (tmp_path / guards.CACHE_DIR).iterdir()
    data = json.loads(stored_file.read_text())
    data["patches"][0]["guards"] = []
    stored_file.write_text(json.dumps(data))
    assert guards.stored(series, cache=tmp_path)["default-thinking-reasoning"].guards == ()
    import dataclasses
    other = dataclasses.replace(series, patches=(dataclasses.replace(
        series.patches[0], sha256="0" * 64),) + series.patches[1:])
    assert guards.series_key(other) != guards.series_key(series)
    assert guards.stored(other, cache=tmp_path / "empty", offline=True) is None
