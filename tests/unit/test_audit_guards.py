"""The audit against undeclared call-path guards (auditor/guards.py, called from
auditor.states.Evaluator._runtime): the seed deployment (tests/audit_facts/seed.yaml)
with one server's environ or /server_info moved off the pin's default, the guards derived
from the real pinned base (tests/unit/test_guards.py checks the list itself)."""

from __future__ import annotations

import pytest
from tests.audit_facts import synth

from patchset.auditor import api
from patchset.auditor import guards as audit_guards
from patchset.auditor.states import evaluate_host
from patchset.analysis import guards

P, D = "sglang-prefill.service", "sglang-decode.service"
SPARSE_TEST = "python/sglang/srt/layers/attention/deepseek_v4_backend.py:1402"


@pytest.fixture()
def derived(series, pinned_base, monkeypatch):
    """The shipped series' guards for this test only (the lookup table is per process)."""
    monkeypatch.setattr(audit_guards, "_DERIVED", {})
    found = guards.stored(series, pinned_base)
    audit_guards.use(series, found)
    return found


def states(series, desc) -> dict[tuple[str | None, str], object]:
    return {(s.server, s.patch): s for s in evaluate_host(series, synth.facts(desc, series))}


def server(desc: dict, unit: str) -> dict:
    return next(s for s in desc["servers"] if s["unit"] == unit)


def test_the_seed_deployment_is_as_declared(series, seed, derived) -> None:
    """Nothing undeclared is off its default there: the guards change no state."""
    got = {k: s.state for k, s in states(series, seed).items()}
    assert got[(P, "mhc-bf16")] == got[(D, "mhc-bf16")] == "active"
    assert got[(D, "triton-dsa-indexer")] == got[(D, "mma-splitk-decode")] == "active"


def test_a_non_default_undeclared_env_in_one_role_makes_it_unknown_there(series, seed,
                                                                          derived) -> None:
    """SGLANG_OPT_FLASHMLA_SPARSE_PREFILL (default false) sends extend batches away from
    mma-splitk-decode's entry; nothing declares it."""
    server(seed, D)["env"]["SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"] = "1"
    st = states(series, seed)
    assert st[(D, "mma-splitk-decode")].state == "unknown"
    assert st[(D, "mma-splitk-decode")].reason == (
        f"undeclared guard SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=1 ({SPARSE_TEST})")
    assert st[(P, "mma-splitk-decode")].state == "gated-off"      # its own state there
    assert st[(D, "mhc-bf16")].state == "active"                  # not on its path


@pytest.mark.parametrize("value", ["0", "False", "no", "maybe"])
def test_the_default_spelt_any_way_sglang_reads_it_changes_nothing(series, seed, derived,
                                                                   value) -> None:
    """EnvBool: 0/false/no/n are False (the default here), a bad value reads the default."""
    server(seed, D)["env"]["SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"] = value
    assert states(series, seed)[(D, "mma-splitk-decode")].state == "active"


def test_an_env_the_startup_hook_sets_itself_is_not_judged(series, seed, derived) -> None:
    """On sm_120 the server's startup turns SGLANG_OPT_USE_TILELANG_MHC_PRE off whatever
    the environment says (server_args.py:3796): the scheduler inherits `False`, which is
    what makes mhc-bf16 run there. No default to judge it by: mhc-bf16 stays active."""
    server(seed, D)["env"]["SGLANG_OPT_USE_TILELANG_MHC_PRE"] = "False"
    assert states(series, seed)[(D, "mhc-bf16")].state == "active"


def test_a_declared_guard_is_judged_by_its_requires_not_as_undeclared(series, seed,
                                                                      derived) -> None:
    server(seed, D)["env"]["SGLANG_SM120_TRITON_FLASHMLA"] = "0"
    st = states(series, seed)[(D, "mma-splitk-decode")]
    assert st.state == "inert" and st.reason.startswith(
        "requires env.SGLANG_SM120_TRITON_FLASHMLA in [unset, 1]")


def test_server_args_off_default_and_fields_set_at_startup(series, seed, derived) -> None:
    """A ServerArgs field with a default: off it is unknown; one SGLang sets itself at
    startup (device) has no default to judge by."""
    info = dict(server(seed, D)["server_info"], enable_deepseek_v4_fp4_indexer=True,
                device="cuda")
    server(seed, D)["server_info"] = info
    st = states(series, seed)
    assert st[(D, "triton-dsa-indexer")].state == "unknown"
    assert st[(D, "triton-dsa-indexer")].reason == (
        "undeclared guard enable_deepseek_v4_fp4_indexer=True "
        "(python/sglang/srt/layers/attention/dsv4/indexer.py:631)")
    assert st[(P, "triton-dsa-indexer")].state == "gated-off"
    assert st[(D, "mhc-bf16")].state == "active"


def test_without_guards_the_state_is_the_declared_one(series, seed, monkeypatch) -> None:
    monkeypatch.setattr(audit_guards, "_DERIVED", {})
    audit_guards.use(series, None)
    server(seed, D)["env"]["SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"] = "1"
    assert states(series, seed)[(D, "mma-splitk-decode")].state == "active"


def test_the_ranking_says_the_suspect_is_unverified(series, seed, derived) -> None:
    def suspect(desc):
        sym = api.evaluate(series, [synth.facts(desc, series)], "context-loss").symptom
        return next(s for s in sym.suspects if s.name == "mma-splitk-decode")

    declared = suspect(seed)
    server(seed, D)["env"]["SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"] = "true"
    unverified = suspect(seed)
    reason = next(r for r in unverified.reasons if "unverified" in r)
    assert reason.startswith(f"unknown (unverified) in gpu1/{D}")
    assert reason.endswith(
        f"undeclared guard SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=true ({SPARSE_TEST})")
    assert unverified.score < declared.score
