"""Suspect ranking for a symptom: from declared data (tier, path, gate, effective state,
which path the symptom is on), never from patch names."""

from __future__ import annotations

import copy
import dataclasses
import shlex
from pathlib import Path

import pytest
from audit_facts import synth

from auditor import api
from auditor.policy import AuditDataError
from auditor.rank import Access

P, D = "sglang-prefill.service", "sglang-decode.service"
ACCESS = Access(ssh={"gpu1": ["ssh", "-p", "22", "root@10.0.0.5"]},
                addresses={"gpu1": "10.0.0.5"})




def ranked(series, desc, symptom="context-loss"):
    return api.evaluate(series, [synth.facts(desc, series)], symptom, ACCESS).symptom


def names(sym) -> list[str]:
    return [s.name for s in sym.suspects]


def test_seed_context_loss_puts_mhc_bf16_first_and_decode_kernels_last(series, seed) -> None:
    sym = ranked(series, seed)
    assert names(sym) == ["mhc-bf16", "nvfp4-cutlass-no-swiglu-clamp",
                          "default-thinking-reasoning", "indexer-bf16-gemm",
                          "mma-splitk-decode", "triton-dsa-indexer"]
    top = sym.suspects[0]
    assert top.kind == "patch" and top.score == 1.5
    assert top.reasons[0] == "tier risky (weight 1), path both"
    assert top.reasons[1].startswith(f"active in gpu1/{P}, which runs prefill (symptom "
                                     "weight 1)")
    assert top.reasons[2] == "unconditional: no gate to A/B; revert it to isolate"
    assert top.reasons[3].startswith("checkpoint-dtypes[narrowed]: F32 tensors consumed in "
                                     "BF16 by mhc-bf16")
    decode = sym.suspects[-1]
    assert decode.score == 0.15 and f"active in gpu1/{D}, which runs decode (symptom weight " \
        "0.3)" in decode.reasons[1]


def test_seed_next_steps_cheapest_first_with_exact_commands(series, seed) -> None:
    steps = ranked(series, seed).next_steps
    assert [(s.cost, s.kind) for s in steps] == [(2, "revert"), (2, "fix"), (2, "fix"),
                                                 (3, "probe")]
    assert steps[0].command == ("patchset revert mhc-bf16 --host gpu1 && ssh -p 22 "
                                "root@10.0.0.5 'systemctl restart sglang-decode.service "
                                "sglang-prefill.service'")
    assert steps[1].command.startswith("patchset plan --only default-thinking-reasoning,")
    assert steps[1].command.endswith(",mhc-bf16,nvfp4-cutlass-swiglu-clamp gpu1")
    assert steps[-1].command == ("patchset probe --url http://10.0.0.5:30000 "
                                 "--sizes 8k,16k,32k")


def test_a_gated_suspect_gets_the_exact_toggle_command(series, seed) -> None:
    sym = ranked(series, seed)
    mma = next(s for s in sym.suspects if s.name == "mma-splitk-decode")
    toggle = mma.steps[0]
    assert (toggle.cost, toggle.kind) == (1, "toggle-gate")
    assert toggle.command == ("ssh -p 22 root@10.0.0.5 'sed -i '\"'\"'/^MMA_FLASHMLA=/d'\"'\"' "
                              "/etc/sglang/decode.env && systemctl restart "
                              "sglang-decode.service'")


def test_ranking_follows_the_data_not_the_names(series, seed) -> None:
    renamed = synth.variant(series, mhc_bf16={"name": "zz-hc-mix"})
    seed["tree"]["applied"] = ["zz-hc-mix" if n == "mhc-bf16" else n
                               for n in seed["tree"]["applied"]]
    sym = ranked(renamed, seed)
    assert names(sym)[0] == "zz-hc-mix"          # same tier/path/state: same place
    safe = synth.variant(series, mhc_bf16={"tier": "safe"})
    assert names(ranked(safe, copy.deepcopy(synth.load("seed.yaml"))))[:2] == \
        ["nvfp4-cutlass-no-swiglu-clamp", "mhc-bf16"]


def test_decode_quality_raises_the_decode_kernels(series, seed) -> None:
    sym = ranked(series, seed, "decode-quality")
    scores = {s.name: s.score for s in sym.suspects}
    assert names(sym)[0] == "mhc-bf16"
    assert scores["mma-splitk-decode"] == scores["triton-dsa-indexer"] == 0.5
    assert scores["indexer-bf16-gemm"] < scores["mma-splitk-decode"]


def test_throughput_suspects_gated_off_kernels_with_toggle_on(series, seed) -> None:
    sym = ranked(series, seed, "throughput")
    assert names(sym)[:2] == ["mma-splitk-decode", "triton-dsa-indexer"]
    assert "mhc-bf16" not in names(sym)                  # active: not a throughput suspect
    step = sym.suspects[0].steps[0]
    assert step.kind == "toggle-gate" and step.title.startswith(
        f"set MMA_FLASHMLA in {P} on gpu1 (on)")
    assert "echo MMA_FLASHMLA=1 >> /etc/sglang/prefill.env" in step.command


def test_a_stale_unit_is_a_suspect_with_a_restart(series, seed) -> None:
    next(s for s in seed["servers"] if s["unit"] == P)["started"] = "2026-11-28T09:00:00Z"
    sym = ranked(series, seed)
    stale = next(s for s in sym.suspects if s.kind == "check")
    assert stale.name == "stale-process on gpu1"
    assert stale.steps[0].command == "ssh -p 22 root@10.0.0.5 'systemctl restart " \
        "sglang-prefill.service'"


def test_aliases_and_unknown_symptoms(series, seed) -> None:
    assert ranked(series, seed, "long-prefill-quality").name == "context-loss"
    with pytest.raises(AuditDataError) as err:
        ranked(series, seed, "slowness")
    assert err.value.exit_code == 2
    assert str(err.value) == ("unknown symptom 'slowness' (known: context-loss, "
                              "decode-quality, throughput)")


GIVEN = Access(ssh=ACCESS.ssh, addresses=ACCESS.addresses, inventory="my hosts/hosts.yaml",
               series="series/patches.yaml")
CARRIED = " --inventory 'my hosts/hosts.yaml' --series series/patches.yaml"


def test_suggested_commands_carry_the_inventory_and_series_the_audit_was_given(series,
                                                                               seed) -> None:
    steps = api.evaluate(series, [synth.facts(seed, series)], "context-loss", GIVEN) \
        .symptom.next_steps
    revert, plan = steps[0], steps[1]
    assert revert.command == (f"patchset revert mhc-bf16 --host gpu1{CARRIED} && ssh -p 22 "
                              "root@10.0.0.5 'systemctl restart sglang-decode.service "
                              "sglang-prefill.service'")    # the ssh part carries nothing
    assert plan.command.startswith("patchset plan --only default-thinking-reasoning,")
    assert plan.command.endswith(f",nvfp4-cutlass-swiglu-clamp gpu1{CARRIED}")
    # a host the inventory gives no router/decode port: the probe keeps the facts' URL
    assert steps[-1].command == "patchset probe --url http://10.0.0.5:30000 --sizes 8k,16k,32k"
    for step in (s for s in steps[:-1] if s.command.startswith("patchset ")):
        assert shlex.split(step.command.split(" && ")[0])[-4:] == [
            "--inventory", "my hosts/hosts.yaml", "--series", "series/patches.yaml"]


def test_a_host_with_an_inventory_port_is_probed_by_name_with_the_inventory(series,
                                                                            seed) -> None:
    named = dataclasses.replace(GIVEN, probe_hosts=("gpu1",))
    probe = ranked_with(series, seed, named).next_steps[-1]
    assert probe.command == ("patchset probe gpu1 --inventory 'my hosts/hosts.yaml' "
                             "--sizes 8k,16k,32k")          # `patchset probe` has no --series
    bare = dataclasses.replace(ACCESS, probe_hosts=("gpu1",))
    assert ranked_with(series, seed, bare).next_steps[-1].command == \
        "patchset probe gpu1 --sizes 8k,16k,32k"
    # the standalone probes still take a URL
    greedy = ranked_with(series, seed, named, "decode-quality").next_steps[-1]
    assert greedy.command == ("python3 -m isolate.probe greedy --url http://10.0.0.5:30000 "
                              "--max-tokens 2000")


def test_local_remedies_carry_the_options_remote_ones_do_not(series, seed) -> None:
    seed["tree"]["drift"] = [{"path": "python/sglang/srt/x.py", "expected": "a" * 40,
                              "found": "b" * 40}]
    next(s for s in seed["servers"] if s["unit"] == P)["started"] = "2026-11-28T09:00:00Z"
    sym = ranked_with(series, seed, GIVEN)
    commands = {s.name: s.steps[0].command for s in sym.suspects if s.kind == "check"}
    assert commands["tree-drift on gpu1"] == f"patchset status gpu1{CARRIED}"
    assert commands["stale-process on gpu1"] == ("ssh -p 22 root@10.0.0.5 'systemctl restart "
                                                 "sglang-prefill.service'")


def test_only_explicit_files_are_carried(tmp_path) -> None:
    from auditor import cli_support
    from deploy import inventory as inv
    path = tmp_path / "hosts.yaml"
    path.write_text("version: 1\nhosts:\n  gpu1: {address: 10.0.0.5, roles: {decode: "
                    "{port: 30001}}}\n  gpu2: {address: 10.0.0.6}\n")
    loaded = inv.load(path)
    default = cli_support.access(loaded, ["gpu1", "gpu2", "root@10.0.0.7"])
    assert (default.inventory, default.series, default.options()) == (None, None, "")
    assert default.probe_hosts == ("gpu1",)
    given = cli_support.access(loaded, ["gpu1"], path, Path("a b/patches.yaml"))
    assert given.options() == f" --inventory {shlex.quote(str(path))} --series 'a b/patches.yaml'"
    assert given.options(series=False) == f" --inventory {shlex.quote(str(path))}"


def ranked_with(series, desc, access: Access, symptom: str = "context-loss"):
    return api.evaluate(series, [synth.facts(desc, series)], symptom, access).symptom
