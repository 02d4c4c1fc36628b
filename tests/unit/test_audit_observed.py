"""Observed execution in the audit: the tracer's records override what `requires`
declare, and a stale process is judged by what it loaded (issue: observed execution).

Facts are the seed deployment (tests/audit_facts/seed.yaml) through the real parsers,
with the tracer's records of the decode server added (synth `trace:`)."""

from __future__ import annotations

import copy

from tests.audit_facts import synth

from patchset.auditor import api
from patchset.auditor.states import evaluate_host

D = "sglang-decode.service"
FWD = "sglang.srt.model_executor.model_runner:ModelRunner.forward"
# as deploy writes them (tracer.FLAGS): `=` an upstream function whose changed lines run
# on every call, `+` the patch's own function, `?` a dispatcher, `!` a compiled kernel
MHC = "=sglang.srt.models.deepseek_v4:DeepseekV4DecoderLayer.hc_pre.<locals>.hc_pre_torch_impl"
IDX = "=sglang.srt.layers.attention.dsv4.indexer:fp8_paged_mqa_logits_torch_sm120"
SPLITK = "+sglang.srt.layers.attention.flash_mla_sm120_triton:_run_splitk_mma_sparse_decode"
DISPATCH = "?sglang.srt.layers.attention.flash_mla_sm120_triton:flash_mla_sparse_decode_triton"
KERNEL = "!sglang.srt.layers.attention.flash_mla_sm120_triton:_splitk_mma_decode_kernel"


def decode(desc: dict) -> dict:
    return next(s for s in desc["servers"] if s["unit"] == D)


def traced(seed: dict, series, ran: list[str], work: bool = True, loaded=None,
           **proc) -> dict:
    """The decode server with tracing on: its main process (request handling only: it
    imports none of the kernels' modules) and its scheduler, which watched the kernels' targets and,
    with `work`, returned decode forward passes after that."""
    desc = copy.deepcopy(seed)
    srv = decode(desc)
    applied = desc["tree"]["applied"] if loaded is None else loaded
    by = series.by_name()
    srv["env"]["PATCHSET_PATCHES"] = " ".join(f"{n}:{by[n].sha256[:12]}" for n in applied)
    watch = {MHC: ["mhc-bf16"], IDX: ["indexer-bf16-gemm"], SPLITK: ["mma-splitk-decode"],
             DISPATCH: ["mma-splitk-decode"], FWD: ["~forward"]}
    srv["trace"] = [
        {"pid": srv["pid"], "title": "python3", "watch": watch,
         "unwatched": [MHC, IDX, SPLITK, DISPATCH, FWD]},
        {"pid": srv["pid"] + 1, "title": "sglang::scheduler_TP0", "watch": watch,
         "ran": ran, "forward": {"decode": 4} if work else {}, **proc}]
    return desc


def state(series, desc, patch: str, unit: str = D):
    return next(s for s in evaluate_host(series, synth.facts(desc, series))
                if s.server == unit and s.patch == patch)


def test_tracing_off_is_declared(series, seed) -> None:
    st = state(series, seed, "mhc-bf16")
    assert st.state == "active" and st.evidence == "declared" and st.ran == ()
    assert st.observation is None


def test_a_target_that_ran_makes_the_state_observed(series, seed) -> None:
    st = state(series, traced(seed, series, [MHC], ran_in={MHC: ["decode"]}), "mhc-bf16")
    assert st.state == "active" and st.evidence == "observed" and st.modes == ("decode",)
    assert st.ran[0]["pid"] == 2001 and st.ran[0]["target"] == MHC[1:]
    assert (f"observed: {MHC[1:]} ran in decode forward passes in pid 2001 "
            "(sglang::scheduler_TP0)") in st.reason


def test_declared_active_but_not_run_after_forwards_is_inert_and_a_finding(series,
                                                                          seed) -> None:
    desc = traced(seed, series, [])
    st = state(series, desc, "mma-splitk-decode")
    assert (st.state, st.declared, st.contradiction, st.evidence) == (
        "inert", "active", "declared-active-not-run", "observed")
    assert "pid 2001 (sglang::scheduler_TP0) returned 4 decode forward pass(es)" in st.reason
    assert "requires miss a dispatch condition" in st.reason
    rep = api.evaluate(series, [synth.facts(desc, series)], "context-loss")
    [f] = [f for f in rep.findings if f.id == "trace[declared-active-not-run]"
           and "mma-splitk-decode" in f.subject]
    assert f.status == "fail" and f.patches == ("mma-splitk-decode",)
    suspects = [s.name for s in rep.symptom.suspects] if rep.symptom else []
    assert "mma-splitk-decode" not in suspects


def test_no_forward_pass_yet_stays_declared_and_says_so(series, seed) -> None:
    st = state(series, traced(seed, series, [], work=False), "mma-splitk-decode")
    assert st.state == "active" and st.evidence == "declared" and st.contradiction is None
    assert st.observation.startswith("no evidence yet:") and \
        "no decode forward pass after its code was watched" in st.observation


def _snapshot(series, desc, symptom="context-loss"):
    """Every state, hazard finding and the ranking of one audit."""
    rep = api.evaluate(series, [synth.facts(desc, series)], symptom)
    states = {(s.server, s.patch): (s.state, s.contradiction) for s in rep.hosts[0].states}
    hazards = {(f.id, f.subject): f.status for f in rep.findings if f.id.startswith("hazard")}
    return states, hazards, [s.name for s in rep.symptom.suspects]


def test_request_level_work_changes_nothing(series, seed) -> None:
    """Requests were handled in the main process; no forward pass returned anywhere: states, hazards and ranking are the declared ones,
    and every traced state says it has no evidence yet."""
    before = _snapshot(series, seed)
    desc = traced(seed, series, [], work=False)
    assert _snapshot(series, desc) == before
    for patch in ("mhc-bf16", "mma-splitk-decode", "indexer-bf16-gemm"):
        st = state(series, desc, patch)
        assert st.evidence == "declared" and st.observation, patch


def test_a_forward_in_another_process_is_no_evidence(series, seed) -> None:
    """The forward passes ran in a process that did not watch the kernels (they were not
    imported there): no conclusion about the scheduler that watched them."""
    desc = traced(seed, series, [], work=False)
    decode(desc)["trace"][0]["forward"] = {"decode": 9}      # the main process, unwatched
    st = state(series, desc, "mma-splitk-decode")
    assert st.state == "active" and st.evidence == "declared"
    assert "pid 2000: sglang.srt.layers" in st.observation and "not watched" in st.observation


def test_forwards_of_another_mode_or_a_draft_model_are_no_evidence(series, seed) -> None:
    for forward in ({"extend": 5}, {"draft:decode": 5}, {"idle": 5}, {"prebuilt": 3}):
        desc = traced(seed, series, [], work=False, forward=forward)
        st = state(series, desc, "mma-splitk-decode")
        assert (st.state, st.evidence) == ("active", "declared"), forward
    desc = traced(seed, series, [], work=False, forward={"mixed": 1})  # mixed runs decode
    assert state(series, desc, "mma-splitk-decode").state == "inert"


def test_a_forward_before_the_code_was_watched_is_no_evidence(series, seed) -> None:
    """The kernels' module was imported (watched) after the last recorded forward."""
    st = state(series, traced(seed, series, [], watched_at=60), "mma-splitk-decode")
    assert (st.state, st.evidence) == ("active", "declared")
    assert "no decode forward pass after its code was watched" in st.observation
    st = state(series, traced(seed, series, [], watched_at=40), "mma-splitk-decode")
    assert st.state == "inert"


def test_entered_raised_or_via_the_outer_function_is_not_ran(series, seed) -> None:
    """A call that raised, or a hit on the enclosing function of the nested
    hc_pre_torch_impl (wrap mode), shows neither that it ran nor that it did not."""
    desc = traced(seed, series, [], entered=[IDX, MHC], raised={IDX: "RuntimeError"})
    st = state(series, desc, "mhc-bf16")
    assert (st.state, st.evidence, st.ran) == ("active", "declared", ())
    assert f"{MHC[1:]} was entered in pid 2001" in st.observation
    st = state(series, desc, "indexer-bf16-gemm")
    assert "never returned (raised RuntimeError)" in st.observation
    desc = traced(seed, series, [MHC], via={MHC: "DeepseekV4DecoderLayer.hc_pre"})
    st = state(series, desc, "mhc-bf16")
    assert (st.state, st.evidence, st.ran) == ("active", "declared", ())
    assert "its enclosing DeepseekV4DecoderLayer.hc_pre ran in pid 2001" in st.observation


def test_an_older_record_format_is_no_evidence(series, seed) -> None:
    st = state(series, traced(seed, series, [MHC], format=1), "mhc-bf16")
    assert (st.state, st.evidence) == ("active", "declared")
    assert "tracer format 1" in st.observation


def test_declared_inert_but_ran_is_active_and_high(series, seed) -> None:
    desc = traced(seed, series, [IDX])           # the torch indexer is inert in decode
    st = state(series, desc, "indexer-bf16-gemm")
    assert (st.state, st.declared, st.contradiction) == ("active", "inert", "inert-but-ran")
    rep = api.evaluate(series, [synth.facts(desc, series)])
    [f] = [f for f in rep.findings if f.id == "trace[inert-but-ran]"]
    assert f.severity == "high" and f.status == "fail" and "indexer-bf16-gemm" in f.subject


def test_a_patch_reverted_on_disk_but_loaded_stays_a_suspect(series, seed) -> None:
    desc = traced(seed, series, [MHC])
    desc["tree"]["applied"].remove("mhc-bf16")    # `patchset revert mhc-bf16`, no restart
    desc["tree"]["updated"] = "2026-11-29T09:00:00Z"
    st = state(series, desc, "mhc-bf16")
    assert st.state == "active" and st.evidence == "observed"
    assert st.reason.startswith("loaded by pid 2000 (mhc-bf16:") and \
        "no longer on disk: restart to unload" in st.reason
    rep = api.evaluate(series, [synth.facts(desc, series)], "context-loss")
    assert "mhc-bf16" in [s.name for s in rep.symptom.suspects]


def test_a_patch_applied_after_the_start_is_not_loaded(series, seed) -> None:
    loaded = [n for n in seed["tree"]["applied"] if n != "mhc-bf16"]
    desc = traced(seed, series, [], loaded=loaded)
    desc["tree"]["updated"] = "2026-11-29T09:00:00Z"   # the apply came after the start
    st = state(series, desc, "mhc-bf16")
    assert st.state == "not-applied" and "not loaded by it (restart to load)" in st.reason


def test_unavailable_tracing_is_a_warning(series, seed) -> None:
    desc = traced(seed, series, [MHC])
    decode(desc)["trace"][1]["unavailable"] = ["sglang.x:f: no code object"]
    rep = api.evaluate(series, [synth.facts(desc, series)])
    [f] = [f for f in rep.findings if f.id == "trace[unavailable]"]
    assert f.status == "warn" and "pid 2001" in f.message


def test_observed_active_ranks_above_declared_active(series, seed) -> None:
    """Same patch, same deployment: seen running, its score is x `observed` (policy)."""
    from patchset.auditor import policy

    def score(desc, patch):
        rep = api.evaluate(series, [synth.facts(desc, series)], "context-loss")
        return next(s for s in rep.symptom.suspects if s.name == patch)

    # the decode server's states are what mma-splitk-decode's score comes from
    declared = score(seed, "mma-splitk-decode")
    observed = score(traced(seed, series, [SPLITK]), "mma-splitk-decode")
    weight = policy.load().observed
    assert weight > 1 and observed.score == round(declared.score * weight, 3)
    assert "(observed: it ran)" in observed.reasons[1]
    assert "(observed: it ran)" not in declared.reasons[1]


# ---------------------------------------------------------------- `patchset trace`

def test_the_trace_command_lists_what_ran_and_exits_1_on_a_contradiction(
        series, seed, tmp_path, monkeypatch, capsys) -> None:
    import json
    from pathlib import Path

    from patchset.connect.resolve import Hosts
    from tests.hostutil import cli
    from tests.unit.test_audit_probe import Replay
    monkeypatch.setenv("PATCHSET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(Path(series.root))
    (tmp_path / "hosts.yaml").write_text("version: 1\nhosts:\n  gpu1:\n    address: 10.0.0.5\n")
    desc = {"now": traced(seed, series, [MHC, SPLITK])}
    monkeypatch.setattr(Hosts, "audit_transport",
                        lambda resolver, spec: Replay(desc["now"], series, spec))
    code, out, err = cli(capsys, "trace", "gpu1", "--inventory", str(tmp_path / "hosts.yaml"),
                         "--json")
    assert code == 0, err
    [dec] = [v for v in json.loads(out) if v["server"] == D]
    proc = next(p for p in dec["processes"] if p["pid"] == 2001)
    ran = {r["target"] for r in proc["targets"] if r["ran"]}
    assert ran == {MHC[1:], SPLITK[1:]} and IDX[1:] in {r["target"] for r in proc["targets"]}
    assert proc["forwards"] == {"decode": 4}
    assert dec["contradictions"] == [] and dec["traced"] is True
    prefill = next(v for v in json.loads(out) if v["server"] != D)
    assert prefill["traced"] is False and "tracing off" in prefill["why"]

    desc["now"] = traced(seed, series, [MHC])    # split-K watched, decode forwards, not run
    code, out, err = cli(capsys, "trace", "gpu1", "--inventory", str(tmp_path / "hosts.yaml"))
    assert code == 1, out
    assert "mma-splitk-decode: declared-active-not-run" in out, out
    assert f"ran {MHC[1:]} in no forward  [mhc-bf16]" in out, out
    assert f"watched {SPLITK[1:]}  [mma-splitk-decode]" in out
    assert f"unwatched {SPLITK[1:]}  [mma-splitk-decode] (not imported in this process)" in out
    assert "forward passes: 4 decode" in out


def test_a_hazard_fix_counts_only_if_the_process_loaded_it(series, seed) -> None:
    """The seed's NVFP4 hazard is fixed by nvfp4-cutlass-swiglu-clamp. Applied on disk
    after the decode server started (not in its PATCHSET_PATCHES), it fixes nothing
    there yet; once the server was started with it, the hazard is gone."""
    def hazard(desc):
        rep = api.evaluate(series, [synth.facts(desc, series)])
        return {f.subject.split(":")[0]: f.status for f in rep.findings
                if f.id == "hazard[nvfp4-cutlass-no-swiglu-clamp]"}

    loaded = list(seed["tree"]["applied"])
    on_disk = copy.deepcopy(seed)
    on_disk["tree"]["applied"].append("nvfp4-cutlass-swiglu-clamp")
    on_disk["tree"]["updated"] = "2026-11-29T09:00:00Z"           # after the start
    desc = traced(on_disk, series, [], work=False, loaded=loaded)
    assert hazard(desc)[D] == "fail"
    restarted = traced(on_disk, series, [], work=False,
                       loaded=loaded + ["nvfp4-cutlass-swiglu-clamp"])
    assert hazard(restarted).get(D) in (None, "pass")


def test_a_path_tag_is_checked_against_the_modes_it_ran_in(series, seed) -> None:
    """The seeds' "decode-only" kernels served prefill chunks: a patch tagged decode whose
    code ran in an extend forward pass is a finding; tagged both, it is not."""
    from dataclasses import replace
    tagged = replace(series, patches=tuple(
        replace(p, path="decode") if p.name == "mma-splitk-decode" else p
        for p in series.patches))
    modes = {"ran_in": {SPLITK: ["extend", "decode"]}, "forward": {"decode": 4, "extend": 2}}
    desc = traced(seed, tagged, [SPLITK], **modes)
    rep = api.evaluate(tagged, [synth.facts(desc, tagged)])
    [f] = [f for f in rep.findings if f.id == "trace[path-disagrees]"]
    assert f.status == "fail" and f.patches == ("mma-splitk-decode",)
    assert "tagged path decode, but its code ran in extend forward passes (pid 2001)" in \
        f.message
    st = state(tagged, desc, "mma-splitk-decode")
    assert st.modes == ("decode", "extend")
    rep = api.evaluate(series, [synth.facts(traced(seed, series, [SPLITK], **modes), series)])
    assert not [f for f in rep.findings if f.id == "trace[path-disagrees]"]


def test_an_unknown_state_whose_code_ran_is_active_observed(series, seed, pinned_base,
                                                           monkeypatch) -> None:
    """Unknown (here: an undeclared call-path guard off its default,
    SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=1 where the pin's default is false) is asserted, not
    known; a call that returned settles it: active, observed, declared unknown."""
    from patchset.auditor import guards as audit_guards
    from patchset.analysis import guards
    monkeypatch.setattr(audit_guards, "_DERIVED", {})
    audit_guards.use(series, guards.stored(series, pinned_base))
    declared = traced(seed, series, [], work=False)
    decode(declared)["env"]["SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"] = "1"
    before = state(series, declared, "mma-splitk-decode")
    assert before.state == "unknown" and "undeclared guard" in before.reason, before.reason
    desc = traced(seed, series, [SPLITK], ran_in={SPLITK: ["decode"]})
    decode(desc)["env"]["SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"] = "1"
    st = state(series, desc, "mma-splitk-decode")
    assert (st.state, st.evidence, st.declared) == ("active", "observed", "unknown")
    assert "undeclared guard SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=1" in st.reason


def test_a_gated_patchs_dispatcher_running_with_the_gate_off_shows_nothing(series,
                                                                          seed) -> None:
    """The H200 run of bench/kernels/observe_gpu.py: with MMA_FLASHMLA unset, split-K's
    changed dispatcher (flash_mla_sparse_decode_triton) runs on every decode and returns,
    its own launcher never: gated-off stays gated-off (no trace[inert-but-ran]); the
    launcher not entered while decode forwards returned is the evidence."""
    desc = traced(seed, series, [DISPATCH], ran_in={DISPATCH: ["decode"]})
    decode(desc)["env"].pop("MMA_FLASHMLA", None)
    st = state(series, desc, "mma-splitk-decode")
    assert st.state == "gated-off" and st.contradiction is None, st.reason
    assert st.evidence == "observed" and "none of its code ran while pid 2001" in st.reason
    rep = api.evaluate(series, [synth.facts(desc, series)])
    assert not [f for f in rep.findings if f.id == "trace[inert-but-ran]"]


def test_a_dispatcher_that_ran_is_not_the_patch_running(series, seed) -> None:
    """Gate on, decode forwards returned, the dispatcher ran, the launcher never: the
    patch's code did not run (declared-active-not-run); before any forward, the
    dispatcher's call only corroborates the declared state; a compiled kernel among the
    targets makes "not run" unknowable (upstream code could launch it)."""
    st = state(series, traced(seed, series, [DISPATCH]), "mma-splitk-decode")
    assert (st.state, st.contradiction) == ("inert", "declared-active-not-run")
    st = state(series, traced(seed, series, [DISPATCH], work=False), "mma-splitk-decode")
    assert (st.state, st.evidence) == ("active", "observed")
    assert "observed: its changed function" in st.reason
    desc = traced(seed, series, [])
    decode(desc)["trace"][1]["watch"][KERNEL] = ["mma-splitk-decode"]
    st = state(series, desc, "mma-splitk-decode")
    assert (st.state, st.evidence) == ("active", "declared")
    assert "is a compiled kernel: its launches cannot be watched" in st.observation
