"""Suspect ranking for a symptom: from declared data (tier, path, gate, effective state,
which path the symptom is on), never from patch names."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import shlex
from pathlib import Path

import pytest
from tests.audit_facts import synth
from tests.hostutil import cli

from patchset.auditor import api, measured
from patchset.auditor import report as api_report
from patchset.auditor.model import ProbeResult
from patchset.auditor.policy import AuditDataError
from patchset.auditor.rank import Access
from patchset.isolate.measure import drift, driftstats
from patchset.isolate.search import driftsearch
from patchset.isolate.search.bisect import BisectReport, BisectStep, measurement, save

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
    assert steps[1].command == ("patchset plan --only default-thinking-reasoning,"   # series
                                "nvfp4-cutlass-swiglu-clamp,triton-dsa-indexer,"     # order,
                                "indexer-bf16-gemm,mma-splitk-decode,mhc-bf16 gpu1")  # as plan
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
    assert plan.command.endswith(f",mhc-bf16 gpu1{CARRIED}")
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
    assert greedy.command == ("python3 -m patchset.isolate.measure.probe greedy --url http://10.0.0.5:30000 "
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
    from patchset.cli.app import audit_access
    from patchset.connect import inventory as inv
    path = tmp_path / "hosts.yaml"
    path.write_text("version: 1\nhosts:\n  gpu1: {address: 10.0.0.5, roles: {decode: "
                    "{port: 30001}}}\n  gpu2: {address: 10.0.0.6}\n")
    loaded = inv.load(path)
    default = audit_access(loaded, ["gpu1", "gpu2", "root@10.0.0.7"])
    assert (default.inventory, default.series, default.options()) == (None, None, "")
    assert default.probe_hosts == ("gpu1",)
    given = audit_access(loaded, ["gpu1"], path, Path("a b/patches.yaml"))
    assert given.options() == f" --inventory {shlex.quote(str(path))} --series 'a b/patches.yaml'"
    assert given.options(series=False) == f" --inventory {shlex.quote(str(path))}"


def ranked_with(series, desc, access: Access, symptom: str = "context-loss"):
    return api.evaluate(series, [synth.facts(desc, series)], symptom, access).symptom


# ---------------------------------------------------------------- measured (--measured)
#
# A bisect by drift, computed: each suspect present in a server state shifts the prefill
# path's logprobs by its delta on its own token positions (so contributions add, the
# statement the search rests on), replay j of every state has the same batch-order
# jitter; the states' A/B and prefill-vs-decode reports come from isolate.drift, the
# search from isolate.driftsearch, the file from isolate.bisect.save: the format
# `patchset bisect HOST --probe drift` writes.

TOKENS, PROMPTS, JITTER, K = 48, tuple(700 + 30 * i for i in range(16)), 1e-4, 3.0
ENDPOINT = "http://10.0.0.5:30000"
# the bisect's candidates, gated ones first (isolate/search/bisect.py orders them so)
ORDER = ["mma-splitk-decode", "triton-dsa-indexer", "mhc-bf16", "default-thinking-reasoning",
         "indexer-bf16-gemm"]
# the safe default-thinking-reasoning carries twice the moderate triton-dsa-indexer's shift
DELTAS = {"triton-dsa-indexer": 0.04, "default-thinking-reasoning": 0.08}


def state_run(present: set[str], deltas: dict[str, float] = DELTAS,
              replays: int = 3) -> drift.DriftRun:
    sequences = []
    for s, prompt in enumerate(PROMPTS):
        decode = [-0.5 - 0.02 * i - 0.1 * s for i in range(TOKENS)]
        shift = [sum(deltas.get(name, 0.0) for j, name in enumerate(ORDER)
                     if name in present and i % len(ORDER) == j) for i in range(TOKENS)]
        lps = []
        for j in range(replays):
            rnd = random.Random(1000 * s + j)
            lps.append([x + d + rnd.gauss(0, JITTER) for x, d in zip(decode, shift)])
        sequences.append(drift.Sequence(f"ops-1k/turn-{s + 1}", [1] * prompt,
                                        list(range(TOKENS)), decode, [None] * TOKENS, lps,
                                        [None] * TOKENS))
    return drift.DriftRun(ENDPOINT, 0.0, {}, sequences, 1.0)


def bisect_file(path: Path, host: str = "gpu1", deltas: dict[str, float] = DELTAS) -> Path:
    """What `_bisect_drift` records, measured on state_run's states."""
    base = state_run(set(ORDER), deltas)
    start = drift.prefill_vs_decode(base)
    noise = drift.noise(base)
    threshold = driftstats.noise_threshold(noise, K)
    report = BisectReport(host=host, id=f"b-{host}", probe="drift", url=ENDPOINT,
                          symptom="decode-quality", started="2026-11-29T12:00:00Z",
                          starting=list(ORDER), strategy="group-testing",
                          threshold=threshold)
    report.steps.append(BisectStep(0, "baseline", "starting state", list(ORDER), [],
                                   start.verdict.outcome == "bounded", [start.to_json()]))

    def measure(group: tuple[str, ...]) -> driftsearch.Measurement:
        state = state_run(set(ORDER) - set(group), deltas, replays=1)
        ab = drift.a_b(base, state, noise_of=base)
        here = drift.prefill_vs_decode(state, noise_of=base)
        found = measurement(ab, here)
        report.steps.append(BisectStep(len(report.steps), "group",
                                       f"take out {', '.join(group)}, restart",
                                       [n for n in ORDER if n not in group], [], found.cleared,
                                       [ab.to_json(), here.to_json()]))
        return found

    found = driftsearch.search(list(ORDER), measure,
                               driftsearch.Noise.of(noise, drift.sequence_noise(base)), K)
    report.contributions = [dataclasses.asdict(c) for c in found.contributions]
    if found.culprits:
        top = max(found.contributions, key=lambda c: c.value or 0.0)
        report.culprit = {"patch": top.suspect, "action": "revert", "contribution": top.value,
                          "interval": [top.low, top.high]}
    report.verdict = f"{len(found.culprits)} suspect(s) carry the drift"
    return save(report, path)


def with_measured(series, files: list[Path], hosts: list[str], symptom: str = "decode-quality",
                  probes: dict | None = None):
    runs = measured.load_all(files, hosts, series, symptom)
    facts = [synth.facts(synth.load("seed.yaml"), series, host=h) for h in hosts]
    return api.evaluate(series, facts, symptom, dataclasses.replace(ACCESS, measured=runs),
                        probes=probes).symptom


def test_measured_contributions_rank_first_and_cleared_suspects_last(series, tmp_path) -> None:
    path = bisect_file(tmp_path / "bisect.json")
    values = {c["suspect"]: c for c in json.loads(path.read_text())["contributions"]}
    carried = sorted((n for n, c in values.items() if c["value"] is not None),
                     key=lambda n: -values[n]["value"])
    assert carried == ["default-thinking-reasoning", "triton-dsa-indexer"]   # the deltas
    sym = with_measured(series, [path], ["gpu1"])
    # contributions first (the prior weights said 0.5 for triton, 0.25 for the other), the
    # unmeasured hazard next, the cleared ones last (mhc-bf16's prior 1.5 included)
    assert names(sym) == carried + ["nvfp4-cutlass-no-swiglu-clamp", "mhc-bf16",
                                    "mma-splitk-decode", "indexer-bf16-gemm"]
    by = {s.name: s for s in sym.suspects}
    assert (by["triton-dsa-indexer"].score, by["default-thinking-reasoning"].score) == (0.5, 0.25)
    top = by["default-thinking-reasoning"]
    [m] = top.measured
    c = values["default-thinking-reasoning"]
    assert (m.host, m.bisect, m.value, m.low, m.high, m.how, m.above) == (
        "gpu1", "b-gpu1", c["value"], c["low"], c["high"], "measured", True)
    assert top.reasons[0] == (
        f"measured on gpu1 (bisect b-gpu1, {path}): contribution {c['value']:.3g} "
        f"[{c['low']:.3g}, {c['high']:.3g}] (measured), above the noise: ranked by it, ahead "
        "of the prior weights")
    assert top.reasons[1] == "tier safe (weight 0.25), path both"       # the priors follow
    cleared = by["mhc-bf16"]
    assert cleared.measured[0].value is None and cleared.measured[0].above is False
    assert cleared.reasons[0].endswith(": ranked after every unmeasured suspect")
    assert "cleared with its group" in cleared.reasons[0]
    assert by["nvfp4-cutlass-no-swiglu-clamp"].measured == ()
    # the measured ones lead the next steps; a cleared suspect has none there
    commands = [st.command for st in sym.next_steps]
    assert sym.next_steps[0].kind == "toggle-gate" and "TRITON_INDEXER" in commands[0]
    assert any("patchset revert default-thinking-reasoning" in c for c in commands)
    assert not any("revert mhc-bf16" in c or "MMA_FLASHMLA" in c for c in commands)
    assert [m.source for m in sym.measured] == [str(path)] and sym.measured[0].ranks


def test_a_suspect_cleared_on_one_host_of_two_stays_among_the_unmeasured(series,
                                                                         tmp_path) -> None:
    one = with_measured(series, [bisect_file(tmp_path / "a.json")], ["gpu1", "gpu2"])
    assert names(one)[:2] == ["default-thinking-reasoning", "triton-dsa-indexer"]
    mhc = next(s for s in one.suspects if s.name == "mhc-bf16")
    assert mhc.rank == 3 and mhc.reasons[1] == ("also a suspect on gpu2, which no bisect "
                                                "measured: ranked with the unmeasured suspects")
    both = with_measured(series, [bisect_file(tmp_path / "a.json"),
                                  bisect_file(tmp_path / "b.json", host="gpu2")],
                         ["gpu1", "gpu2"])
    assert names(both)[-3:] == ["mhc-bf16", "mma-splitk-decode", "indexer-bf16-gemm"]
    assert [m.host for m in both.suspects[0].measured] == ["gpu1", "gpu2"]


def test_a_measurement_ranks_only_the_symptoms_it_bears_on(series, seed, tmp_path) -> None:
    sym = with_measured(series, [bisect_file(tmp_path / "b.json")], ["gpu1"], "throughput")
    assert names(sym) == names(ranked(series, seed, "throughput"))
    assert all(s.measured == () for s in sym.suspects) and sym.measured[0].ranks is False


def test_a_drift_probe_that_fails_corroborates_decode_quality(series, seed) -> None:
    rep = drift.prefill_vs_decode(state_run(set(ORDER)))
    assert rep.verdict.above is True
    result = ProbeResult(probe="drift", name="drift", ok=False, reason=rep.verdict.why,
                         expected="prefill and decode within the noise", url=ENDPOINT,
                         drift=rep.to_json(points=True))
    sym = api.evaluate(series, [synth.facts(seed, series)], "decode-quality", ACCESS,
                       probes={"gpu1": [result]}).symptom
    probe = sym.next_steps[-1]
    assert probe.why.startswith(f"reproduced by this audit's probes: drift {ENDPOINT} on "
                                f"gpu1: {rep.verdict.why}")
    assert probe.command == f"python3 -m patchset.isolate.measure.probe greedy --url {ENDPOINT} --max-tokens 2000"


def test_the_recorded_judgement_is_the_audits_and_an_older_file_is_judged_by_its_threshold(
        series, tmp_path) -> None:
    """The search decides which contributions are real from their own errors and records
    it (`above`); the audit takes that, and judges a file from before the field by the
    recorded threshold, as the search then did."""
    data = json.loads(bisect_file(tmp_path / "bisect.json").read_text())
    [top] = [c for c in data["contributions"] if c["suspect"] == "default-thinking-reasoning"]
    assert top["above"] is True and top["value"] > data["threshold"]
    top["above"] = False                     # the search found it within its own error
    (tmp_path / "judged.json").write_text(json.dumps(data))
    for c in data["contributions"]:
        del c["above"]
    (tmp_path / "older.json").write_text(json.dumps(data))
    for name, above in (("judged.json", False), ("older.json", True)):
        [run] = measured.load_all([tmp_path / name], ["gpu1"], series, "decode-quality")
        assert run.contribution("default-thinking-reasoning").above is above, name


def test_bad_measured_files_exit_2_with_one_line_before_any_host(series, tmp_path, capsys,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv("PATCHSET_INVENTORY", str(tmp_path / "none.yaml"))
    monkeypatch.chdir(Path(series.root))
    host = "root@127.0.0.1:1"                 # contacting it would be exit 3
    good = json.loads(bisect_file(tmp_path / "good.json", host=host).read_text())

    def written(name: str, data) -> str:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        return str(path)

    def edited(**fields) -> dict:
        return {**copy.deepcopy(good), **fields}

    stranger = edited(contributions=[dict(good["contributions"][0], suspect="no-such-patch")])
    cases = [
        (written("x.json", "{not json"), ":1: (json): not JSON"),
        (str(tmp_path / "missing.json"), "(file): not found"),
        (written("list.json", []), "not a bisect report"),
        (written("one.json", edited(strategy="one-at-a-time")),
         "strategy: 'one-at-a-time', not 'group-testing'"),
        (written("host.json", edited(host="gpu9")),
         f"host: 'gpu9' is not among the audited hosts ({host})"),
        (written("patch.json", stranger), "contributions[0].suspect: 'no-such-patch' is not "
         "a patch of the series"),
        (written("how.json", edited(contributions=[dict(good["contributions"][0],
                                                         how="guessed")])),
         "contributions[0].how: 'guessed' is not one of"),
        (written("value.json", edited(contributions=[dict(good["contributions"][1],
                                                           value=-1)])),
         "contributions[0].value: expected a number >= 0 or null, got -1"),
        (written("interval.json", edited(contributions=[dict(good["contributions"][0],
                                                              low=2.0, high=1.0)])),
         "contributions[0]: low 2, value "),
        (written("mixed.json", edited(contributions=[
            {k: v for k, v in good["contributions"][0].items() if k != "above"},
            *good["contributions"][1:]])),
         "contributions[0].above: missing, while other contributions have it"),
        (written("above.json", edited(contributions=[dict(good["contributions"][0],
                                                           above="yes")])),
         'contributions[0].above: expected true or false, got "yes"'),
        (written("steps.json", edited(steps="none")), "steps: expected a list"),
    ]
    for path, says in cases:
        code, out, err = cli(capsys, "audit", host, "--symptom", "decode-quality",
                             "--measured", path, "--format", "json")
        assert (code, out) == (2, ""), (path, err)
        assert err.startswith(f"patchset: error: --measured {path}:") and says in err, err
        assert len(err.strip().splitlines()) == 1, err
    code, _, err = cli(capsys, "audit", host, "--measured", str(tmp_path / "good.json"))
    assert code == 2 and err == ("patchset: error: --measured needs --symptom: the measured "
                                 "contributions rank that symptom's suspects\n")
    twice = written("twice.json", good)
    code, _, err = cli(capsys, "audit", host, "--symptom", "decode-quality", "--measured",
                       str(tmp_path / "good.json"), "--measured", twice)
    assert code == 2 and f"host: {host} is measured by {tmp_path / 'good.json'} too" in err
    # a good one goes through to the report (localhost: audited here, no tree)
    local = bisect_file(tmp_path / "local.json", host="localhost")
    code, out, _ = cli(capsys, "audit", "localhost", "--symptom", "decode-quality",
                       "--measured", str(local), "--format", "json")
    data = json.loads(out)
    assert code == 1 and api_report.validate(data) == []
    assert [(m["host"], m["source"]) for m in data["symptom"]["measured"]] == [
        ("localhost", str(local))]
