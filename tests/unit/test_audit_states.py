"""Effective patch states from declared gate/path/requires evaluated against facts.

Facts come from tests/audit_facts/seed.yaml (the seed deployment: DeepSeek-V4-Flash-NVFP4,
P/D under systemd on 8 sm_120 GPUs) and variations of it, through the same parsers as a
live host (tests/audit_facts/synth).
"""

from __future__ import annotations

import copy

import pytest
from tests.audit_facts import synth

from patchset.auditor.states import evaluate_host, holds
from patchset.agent.lib import wire
from patchset.series.model import Requirement

P, D = "sglang-prefill.service", "sglang-decode.service"




def states(series, desc) -> dict[tuple[str | None, str], object]:
    return {(s.server, s.patch): s for s in evaluate_host(series, synth.facts(desc, series))}


def matrix(series, desc) -> dict[str, tuple[str, ...]]:
    st = states(series, desc)
    servers = sorted({k[0] for k in st}, key=lambda s: (s != P, str(s)))
    return {p.name: tuple(st[(srv, p.name)].state for srv in servers) for p in series.patches}


def server(desc: dict, unit: str) -> dict:
    return next(s for s in desc["servers"] if s["unit"] == unit)


def test_seed_deployment_states(series, seed) -> None:
    assert matrix(series, seed) == {            # (prefill, decode)
        "default-thinking-reasoning": ("active", "active"),
        "nvfp4-cutlass-swiglu-clamp": ("not-applied", "not-applied"),
        "triton-dsa-indexer": ("gated-off", "active"),
        "indexer-bf16-gemm": ("active", "inert"),
        "mma-splitk-decode": ("gated-off", "active"),
        "mhc-bf16": ("active", "active"),
    }
    st = states(series, seed)
    assert st[(P, "mma-splitk-decode")].reason.startswith(
        f"gate MMA_FLASHMLA unset in {P} (sglang::scheduler_TP0 environ (pid 1001) (+3 more "
        "agree)); the patch runs with MMA_FLASHMLA=1")
    inert = st[(D, "indexer-bf16-gemm")]
    assert inert.reason.startswith("requires patch.triton-dsa-indexer ne active")
    assert "live: active" in inert.reason
    assert st[(P, "nvfp4-cutlass-swiglu-clamp")].reason.startswith("not applied on /opt/sglang")


def test_gate_off_in_decode_makes_the_torch_indexer_patch_live(series, seed) -> None:
    del server(seed, D)["env"]["TRITON_INDEXER"]
    m = matrix(series, seed)
    assert m["triton-dsa-indexer"] == ("gated-off", "gated-off")
    assert m["indexer-bf16-gemm"] == ("active", "active")


def test_gate_set_to_another_value_is_gated_off_with_the_live_value(series, seed) -> None:
    server(seed, D)["env"]["MMA_FLASHMLA"] = "0"
    st = states(series, seed)[(D, "mma-splitk-decode")]
    assert st.state == "gated-off" and st.reason.startswith("gate MMA_FLASHMLA=0 in")


def test_decode_only_patch_in_a_prefill_unit_is_inert(series, seed) -> None:
    s = synth.variant(series, mma_splitk_decode={"path": "decode"})
    server(seed, P)["env"]["MMA_FLASHMLA"] = "1"
    st = states(s, seed)
    assert st[(P, "mma-splitk-decode")].state == "inert"
    assert st[(P, "mma-splitk-decode")].reason.startswith(
        f"path decode: {P} serves prefill only (server.disaggregation_mode (server_info): "
        "prefill)")
    assert st[(D, "mma-splitk-decode")].state == "active"


def test_role_falls_back_to_the_command_line_then_the_unit(series, seed) -> None:
    s = synth.variant(series, mma_splitk_decode={"path": "decode"})
    server(seed, P)["server_info"] = None          # server still loading: no /server_info
    server(seed, P)["env"]["MMA_FLASHMLA"] = "1"
    st = states(s, seed)[(P, "mma-splitk-decode")]
    assert st.state == "inert" and "(server.disaggregation_mode (command line): prefill)" \
        in st.reason


def test_shadowed_by_other_gpus(series, seed) -> None:
    for gpu in seed["gpus"]:
        gpu["compute_cap"] = "9.0"
    st = states(series, seed)[(P, "mhc-bf16")]
    assert st.state == "inert"
    assert st.reason.startswith("requires gpu.compute_cap in [12.0, 12.1] (on sm_120 the server "
                                "forces")
    assert st.reason.endswith("live: 9.0 (GPUs 0,1,2,3 (CUDA_VISIBLE_DEVICES))")


def test_mixed_gpus_by_index_without_pci_order_are_unknown(series, seed) -> None:
    seed["gpus"][1]["compute_cap"] = "9.0"
    for s in seed["servers"]:
        s["env"].pop("CUDA_DEVICE_ORDER")
    st = states(series, seed)[(P, "mhc-bf16")]
    assert st.state == "unknown"
    assert "without CUDA_DEVICE_ORDER=PCI_BUS_ID on a host with mixed GPUs" in st.reason


def test_hand_edited_file_is_drifted(series, seed) -> None:
    path = series.by_name()["mhc-bf16"].files[0].path
    seed["tree"]["drift"] = [{"path": path, "expected": "a" * 40, "found": "b" * 40}]
    st = states(series, seed)[(P, "mhc-bf16")]
    assert st.state == "drifted"
    assert st.reason == (f"{path} was edited since the apply (expected blob aaaaaaaaaaaa, "
                         "found bbbbbbbbbbbb)")


def test_other_version_of_the_patch_is_drifted(series, seed) -> None:
    seed["tree"]["applied"][-1] = {"name": "mhc-bf16", "sha256": "0" * 64}
    st = states(series, seed)[(D, "mhc-bf16")]
    assert st.state == "drifted" and "the applied version (sha256 000000000000)" in st.reason


def test_process_started_before_the_apply_is_unknown(series, seed) -> None:
    server(seed, D)["started"] = "2026-11-28T09:30:00Z"      # apply at 10:00
    st = states(series, seed)
    assert st[(D, "mhc-bf16")].state == "unknown"
    assert "before the last apply at 2026-11-28T10:00:00Z" in st[(D, "mhc-bf16")].reason
    assert st[(P, "mhc-bf16")].state == "active"


def test_server_importing_another_tree_is_inert(series, seed) -> None:
    server(seed, P)["imports"] = "/opt/venv/lib/python3.11/site-packages/sglang/__init__.py"
    st = states(series, seed)[(P, "mhc-bf16")]
    assert st.state == "inert"
    assert st.reason.startswith(f"{P} imports /opt/venv/lib/python3.11/site-packages/sglang/"
                                "__init__.py, not the managed tree /opt/sglang/python/sglang")


def test_unreadable_environ_makes_gated_patches_unknown_naming_the_fact(series, seed) -> None:
    server(seed, D)["environ_denied"] = True
    st = states(series, seed)
    gated = st[(D, "mma-splitk-decode")]
    assert gated.state == "unknown"
    assert gated.reason.startswith("unknown env.MMA_FLASHMLA: permission denied reading "
                                   "/proc/2001/environ")
    assert st[(D, "mhc-bf16")].state == "active"          # needs no env fact


def test_schedulers_that_disagree_are_unknown(series, seed) -> None:
    server(seed, D)["child_env"] = {"MMA_FLASHMLA": "1"}
    server(seed, D)["env"]["MMA_FLASHMLA"] = "1"
    desc = copy.deepcopy(seed)
    result = synth.gather_result(desc, series)
    child = result["raw"]["servers"][1]["children"][2]["environ"]
    child["stdout"] = child["stdout"].replace("MMA_FLASHMLA=1", "MMA_FLASHMLA=0")
    from patchset.auditor import hostfacts
    facts = hostfacts.build("gpu1", wire.decode_result("audit", result))
    st = {(s.server, s.patch): s for s in evaluate_host(series, facts)}
    reason = st[(D, "mma-splitk-decode")].reason
    assert st[(D, "mma-splitk-decode")].state == "unknown"
    assert "the scheduler processes disagree on MMA_FLASHMLA: sglang::scheduler_TP0=1, " \
        "sglang::scheduler_TP1=1, sglang::scheduler_TP2=0" in reason


def test_no_server_info_uses_the_command_line_or_says_unknown(series, seed) -> None:
    server(seed, D)["server_info"] = None
    st = states(series, seed)[(D, "triton-dsa-indexer")]
    assert st.state == "unknown"
    assert "server.attention_backend: server_info unavailable" in st.reason
    assert "--attention-backend is not on the command line" in st.reason
    server(seed, D)["argv"] += ["--attention-backend", "dsv4"]
    assert states(series, seed)[(D, "triton-dsa-indexer")].state == "active"


def test_no_server_running_and_unmanaged_tree(series, seed) -> None:
    seed["servers"] = []
    st = states(series, seed)
    assert st[(None, "mhc-bf16")].state == "unknown"
    assert "no SGLang server is running on gpu1" in st[(None, "mhc-bf16")].reason
    assert st[(None, "nvfp4-cutlass-swiglu-clamp")].state == "not-applied"
    seed["tree"]["managed"] = False
    assert states(series, seed)[(None, "mhc-bf16")].reason == \
        "/opt/sglang is not managed by patchset (no .patchset/state.json)"


def test_unknown_tree_makes_everything_unknown(series, seed) -> None:
    del seed["tree"]
    st = states(series, seed)
    assert {s.state for s in st.values()} == {"unknown"}
    assert st[(P, "mhc-bf16")].reason.startswith("the tree's state is unknown: no tree given")


def test_a_requires_cycle_is_unknown_not_a_recursion_error(series, seed) -> None:
    s = synth.variant(series, mhc_bf16={"requires": (Requirement("patch.default-thinking-reasoning",
                                                                   "eq", "active"),)},
                      default_thinking_reasoning={"requires": (Requirement("patch.mhc-bf16",
                                                                           "eq", "active"),)})
    st = states(s, seed)[(P, "mhc-bf16")]
    assert st.state == "unknown" and "a cycle of requires" in st.reason


@pytest.mark.parametrize("op,found,expected,result", [
    ("eq", "12.0", "12.0", True), ("eq", "12.0", 12.0, True), ("eq", "256", 256, True),
    ("eq", None, "1", False), ("ne", None, None, False), ("ne", "triton", None, True),
    ("in", None, (None, "1"), True), ("in", "0", (None, "1"), False),
    ("not_in", None, ("1", "true"), True), ("not_in", "true", ("1", "true"), False),
    ("eq", True, "true", True), ("eq", "dsv4", "DSV4", False),
])
def test_condition_semantics(op, found, expected, result) -> None:
    assert holds(op, found, expected) is result


def test_backend_reported_as_auto_is_unknown_not_a_value(series, seed) -> None:
    """/server_info can say `auto`: SGLang resolves it inside the scheduler, so the audit
    must not evaluate a `requires` against the literal string."""
    from patchset.auditor.facttable import Context, resolve
    server(seed, D)["server_info"] = dict(server(seed, D)["server_info"],
                                          moe_runner_backend="auto")
    host = synth.facts(seed, series)
    decode = next(s for s in host.servers if "decode" in s.id)
    fact = resolve("server.moe_runner_backend", Context(host, decode))
    assert not fact.known and "/server_info says auto" in fact.reason
    assert "set it explicitly in the unit" in fact.reason
    prefill = next(s for s in host.servers if "prefill" in s.id)
    assert resolve("server.moe_runner_backend", Context(host, prefill)).value == "triton"


@pytest.mark.parametrize("where", ["internal_states", "journal"])
def test_an_auto_backend_is_read_where_the_resolved_args_check_reads_it(series, seed,
                                                                        where) -> None:
    """/server_info says auto, but the scheduler's own copy or the startup line says what
    runs: `requires` and the hazards get that value, from the same reading as the
    resolved-args check (auditor/running.py), and say where it came from."""
    from patchset.auditor.facttable import Context, resolve
    from patchset.agent.lib.facts.journal import ServerArgsLog
    from tests.unit.test_resolved_args import journal, line
    info = dict(server(seed, D)["server_info"], moe_runner_backend="auto")
    if where == "internal_states":
        info["internal_states"] = [{"moe_runner_backend": "marlin"}] * 2
    server(seed, D)["server_info"] = info
    host = synth.facts(seed, series)
    decode = next(s for s in host.servers if "decode" in s.id)
    if where == "journal":
        decode.server_args_log = ServerArgsLog().collect(journal(line(
            moe_runner_backend="marlin")))
    fact = resolve("server.moe_runner_backend", Context(host, decode))
    assert (fact.known, fact.value) == (True, "marlin")
    assert ("internal_states" if where == "internal_states" else "journal") in fact.source
