"""Each check on variations of the seed deployment: exact statuses and what they say."""

from __future__ import annotations

import copy

import pytest
from tests.audit_facts import synth

from patchset.auditor import api
from patchset.auditor.checks import describe

P, D = "sglang-prefill.service", "sglang-decode.service"




def run(series, desc) -> list:
    return api.evaluate(series, [synth.facts(desc, series)]).findings


def by(findings, check_id: str, subject_start: str = ""):
    hits = [f for f in findings if f.id == check_id and f.subject.startswith(subject_start)]
    assert hits, f"no {check_id} finding on {subject_start!r}"
    return hits[0]


def srv(desc, unit):
    return next(s for s in desc["servers"] if s["unit"] == unit)


def test_checks_are_described() -> None:
    checks = describe()
    assert len({c["id"] for c in checks}) == len(checks) == 15
    assert all(c["description"] and c["severity"] in ("high", "medium", "low") for c in checks)


def test_seed_has_exactly_the_hazard_and_the_dtype_warning(series, seed) -> None:
    bad = sorted((f.id, f.status, f.subject.split(":")[0]) for f in run(series, seed)
                 if f.status != "pass")
    assert bad == [("checkpoint-dtypes[narrowed]", "warn",
                    "/models/DeepSeek-V4-Flash-NVFP4 *hc_attn_fn, *hc_ffn_fn for mhc-bf16"),
                   ("hazard[nvfp4-cutlass-no-swiglu-clamp]", "fail", D),
                   ("hazard[nvfp4-cutlass-no-swiglu-clamp]", "fail", P),
                   # notes (severity info): attention_backend unset, dsv4 by the V4 hook
                   ("resolved-args[attention_backend]", "warn", f"{D} attention_backend"),
                   ("resolved-args[attention_backend]", "warn", f"{P} attention_backend")]


def test_env_file_changed_but_process_not_restarted(series, seed) -> None:
    seed["units"][D]["env_files"]["/etc/sglang/decode.env"]["values"]["MMA_FLASHMLA"] = "0"
    seed["units"][D]["env_files"]["/etc/sglang/decode.env"]["changed"] = "2026-11-29T08:00:00Z"
    found = run(series, seed)
    f = by(found, "gate-env[process]", f"{D} MMA_FLASHMLA")
    assert (f.status, f.expected, f.found) == ("fail", "0", "1")
    assert f.message.startswith(f"{D} declares MMA_FLASHMLA=0 but the running server has 1")
    assert f.patches == ("mma-splitk-decode",)
    stale = by(found, "stale-process[changed]", D)
    assert stale.status == "warn" and "env file /etc/sglang/decode.env changed at " \
        "2026-11-29T08:00:00Z, after the server started at 2026-11-28T11:00:00Z" in stale.message


def test_gate_set_for_a_patch_not_applied(series, seed) -> None:
    seed["tree"]["applied"].remove("mma-splitk-decode")
    f = by(run(series, seed), "gate-env[unused]", f"{D} MMA_FLASHMLA")
    assert f.status == "warn" and f.severity == "low"
    assert f.message == "MMA_FLASHMLA is set but mma-splitk-decode is not applied: it changes " \
        "nothing"


def test_process_older_than_the_apply_and_pending_reload(series, seed) -> None:
    srv(seed, P)["started"] = "2026-11-28T09:00:00Z"
    seed["units"][P]["need_reload"] = "yes"
    found = run(series, seed)
    f = by(found, "stale-process[apply]", P)
    assert f.status == "fail" and f.message == ("started 2026-11-28T09:00:00Z, before the last "
                                                "apply at 2026-11-28T10:00:00Z: it runs the "
                                                "code of an earlier apply")
    assert by(found, "stale-process[daemon-reload]", P).status == "warn"


def test_patches_the_process_started_with_decide_staleness(series, seed) -> None:
    applied = [f"{n}:{series.by_name()[n].sha256[:12]}" for n in seed["tree"]["applied"]]
    s = srv(seed, P)
    s["started"] = "2026-11-28T09:00:00Z"                # before the apply ...
    s["env"]["PATCHSET_PATCHES"] = " ".join(applied)      # ... but with the same patches
    assert by(run(series, seed), "stale-process", P).status == "pass"
    s["env"]["PATCHSET_PATCHES"] = " ".join(applied[:-1])
    f = by(run(series, seed), "stale-process[apply]", P)
    assert f.status == "fail" and f.message.startswith("started without mhc-bf16 "
                                                       "(PATCHSET_PATCHES of pid 1000;")


@pytest.mark.parametrize("field,value,status", [
    ("kv_cache_dtype", "bfloat16", "fail"), ("page_size", 64, "fail"),
    ("disaggregation_transfer_backend", "nixl", "fail"), ("tp_size", 2, "warn"),
])
def test_prefill_decode_consistency(series, seed, field, value, status) -> None:
    srv(seed, D)["server_info"] = dict(srv(seed, D)["server_info"], **{field: value})
    f = by(run(series, seed), f"pd-consistency[{field}]")
    assert f.status == status and f.found == f"decode {value}"


def test_hazard_cleared_by_backend_or_by_the_fix(series, seed) -> None:
    for s in seed["servers"]:
        s["server_info"] = dict(s["server_info"], moe_runner_backend="marlin")
    f = by(run(series, seed), "hazard[nvfp4-cutlass-no-swiglu-clamp]", P)
    assert (f.status, f.found) == ("pass", "server.moe_runner_backend=marlin")
    fixed = copy.deepcopy(synth.load("seed.yaml"))
    fixed["tree"]["applied"].insert(1, "nvfp4-cutlass-swiglu-clamp")
    f = by(run(series, fixed), "hazard[nvfp4-cutlass-no-swiglu-clamp]", P)
    assert (f.status, f.found) == ("pass", "nvfp4-cutlass-swiglu-clamp active")


def test_hazard_from_the_command_line_or_unknown(series, seed) -> None:
    srv(seed, P)["server_info"] = None          # loading: the flag on argv still tells
    f = by(run(series, seed), "hazard[nvfp4-cutlass-no-swiglu-clamp]", P)
    assert f.status == "fail"
    argv = srv(seed, P)["argv"]
    del argv[argv.index("--moe-runner-backend"):argv.index("--moe-runner-backend") + 2]
    f = by(run(series, seed), "hazard[nvfp4-cutlass-no-swiglu-clamp]", P)
    assert f.status == "unknown"
    assert f.message.startswith("server.moe_runner_backend: server_info unavailable")


def test_tree_drift_foreign_commit_and_base(series, seed) -> None:
    path = series.by_name()["mhc-bf16"].files[0].path
    seed["tree"]["drift"] = [{"path": path, "expected": "a" * 40, "found": "b" * 40}]
    seed["tree"]["foreign_commits"] = ["1234567 local hack"]
    seed["tree"]["upstream"] = {"name": "sglang", "version": "0.5.13"}
    found = run(series, seed)
    f = by(found, "tree-drift[hand-edit]")
    assert f.status == "fail" and f.patches == ("mhc-bf16",)
    assert by(found, "foreign-commits[commit]").found == "1234567 local hack"
    base = by(found, "pinned-base[version]")
    assert (base.status, base.expected, base.found) == ("fail", "sglang 0.5.14", "sglang 0.5.13")


def test_gpu_arch_and_checkpoint_format(series, seed) -> None:
    for gpu in seed["gpus"]:
        gpu["compute_cap"] = "9.0"
    ck = seed["checkpoints"]["/models/DeepSeek-V4-Flash-NVFP4"]["tensors"]
    ck["layers.3.ffn.experts.0.w1.weight"]["dtype"] = "BF16"
    found = run(series, seed)
    f = by(found, "gpu-arch[patches]", P)
    assert f.status == "warn"
    assert f.patches == ("indexer-bf16-gemm", "mhc-bf16", "mma-splitk-decode",
                         "triton-dsa-indexer")
    assert f.message == ("indexer-bf16-gemm, mhc-bf16, mma-splitk-decode, triton-dsa-indexer "
                         "applied for another GPU architecture: inert here")
    nv = by(found, "checkpoint-dtypes[nvfp4-experts]",
            "/models/DeepSeek-V4-Flash-NVFP4 *.experts.0.*weight")
    assert (nv.status, nv.expected, nv.found) == ("fail", "U8", "BF16")
    narrowed = by(found, "checkpoint-dtypes[narrowed]")
    assert narrowed.status == "pass" and narrowed.message == "mhc-bf16 is not active here"


def test_unhealthy_server_and_other_tree(series, seed) -> None:
    srv(seed, D)["health"] = 503
    srv(seed, P)["imports"] = "/usr/lib/python3/dist-packages/sglang/__init__.py"
    seed["units"][D]["active"] = "activating"
    found = run(series, seed)
    assert by(found, "server-health[health]", D).found == "HTTP 503"
    assert by(found, "server-health[unit]", D).status == "fail"
    f = by(found, "imported-tree", P)
    assert (f.status, f.found) == ("fail", "/usr/lib/python3/dist-packages/sglang")
