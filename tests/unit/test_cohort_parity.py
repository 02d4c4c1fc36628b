"""The check cohort-parity on two hosts of the seed deployment (prefill + decode each):
a mismatch named with its servers, a wire patch high, a declared-compatible mismatch
passing, an unknown fact left unknown; and the cohorts as the inventory declares them."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
from tests.audit_facts import synth

from patchset.auditor import api
from patchset.auditor.cohorts import CohortSpec, from_inventory, runs
from patchset.connect import inventory as inventory_mod
from patchset.errors import ManifestError

PAIR = (CohortSpec("flash", ("gpu1", "gpu2")),)


def loaded_with(desc: dict, series) -> dict:
    """Every server of `desc` started with the patches its tree has (PATCHSET_PATCHES)."""
    sha = {p.name: p.sha256[:12] for p in series.patches}
    words = " ".join(f"{n}:{sha[n]}" for n in desc["tree"]["applied"])
    for s in desc["servers"]:
        s.setdefault("env", {})["PATCHSET_PATCHES"] = words
    return desc


def audit(series, one: dict, two: dict, cohorts=PAIR):
    facts = [synth.facts(one, series, "gpu1"), synth.facts(two, series, "gpu2")]
    return [f for f in api.evaluate(series, facts, cohorts=cohorts).findings
            if f.id.startswith("cohort-parity")]


def by(findings, sub: str):
    return next(f for f in findings if f.id == f"cohort-parity[{sub}]")


def without(desc: dict, patch: str) -> dict:
    """`desc` with `patch` reverted on the tree and restarted (not loaded either)."""
    desc = copy.deepcopy(desc)
    desc["tree"]["applied"] = [n for n in desc["tree"]["applied"] if n != patch]
    for s in desc["servers"]:
        s.get("env", {}).pop("PATCHSET_PATCHES", None)
    return desc


def test_the_same_deployment_on_both_hosts_passes(series, seed) -> None:
    seed = loaded_with(seed, series)
    found = audit(series, seed, copy.deepcopy(seed))
    assert {f.status for f in found} == {"pass"}
    assert len(found) == 1 + len(series.patches)          # the tree and each patch
    assert by(found, "tree").subject == "cohort flash the tree"


def test_a_patch_on_one_host_only_is_named_with_its_servers(series, seed) -> None:
    seed = loaded_with(seed, series)
    other = loaded_with(without(seed, "mhc-bf16"), series)
    found = audit(series, seed, other)
    f = by(found, "mhc-bf16")
    assert (f.status, f.severity, f.patches) == ("fail", "medium", ("mhc-bf16",))
    for server in ("gpu1/sglang-prefill.service applied", "gpu2/sglang-decode.service applied",
                   "gpu2/sglang-decode.service loaded absent"):
        assert server in f.message
    assert by(found, "tree").status == "fail"
    assert by(found, "triton-dsa-indexer").status == "pass"


def test_a_wire_patch_mismatch_is_high(series, seed) -> None:
    wired = dataclasses.replace(series, patches=tuple(
        dataclasses.replace(p, wire=True) if p.name == "mhc-bf16" else p
        for p in series.patches))
    seed = loaded_with(seed, wired)
    f = by(audit(wired, seed, loaded_with(without(seed, "mhc-bf16"), wired)), "mhc-bf16")
    assert (f.status, f.severity) == ("fail", "high")
    assert "wire" in f.message


def test_a_gate_off_in_one_decode_process_is_a_mismatch(series, seed) -> None:
    seed = loaded_with(seed, series)
    other = copy.deepcopy(seed)
    next(s for s in other["servers"] if s["unit"] == "sglang-decode.service")["env"][
        "MMA_FLASHMLA"] = "0"
    f = by(audit(series, seed, other), "mma-splitk-decode")
    assert f.status == "fail"
    assert "gpu2/sglang-decode.service gates off (0)" in f.message
    assert "prefill" not in f.message          # a decode patch's gate: not the prefill's


@pytest.mark.parametrize("how", ["patch", "cohort"])
def test_a_mismatch_declared_compatible_passes(series, seed, how) -> None:
    cohorts = PAIR
    if how == "patch":
        series = dataclasses.replace(series, patches=tuple(
            dataclasses.replace(p, parity="any") if p.name == "mhc-bf16" else p
            for p in series.patches))
    else:
        cohorts = (CohortSpec("flash", ("gpu1", "gpu2"), ("mhc-bf16",)),)
    seed = loaded_with(seed, series)
    found = audit(series, seed, loaded_with(without(seed, "mhc-bf16"), series), cohorts)
    f = by(found, "mhc-bf16")
    assert f.status == "pass" and "declared compatible" in f.message


def test_an_unknown_fact_stays_unknown(series, seed) -> None:
    seed = loaded_with(seed, series)
    other = copy.deepcopy(seed)
    for s in other["servers"]:
        s["environ_denied"] = True
    found = audit(series, seed, other)
    f = by(found, "triton-dsa-indexer")
    assert f.status == "unknown"
    assert "gpu2/sglang-decode.service loaded" in f.message
    assert by(found, "tree").status == "pass"      # the tree itself was read


def test_an_unreachable_member_leaves_parity_unknown(series, seed) -> None:
    from patchset.auditor.model import HostFacts
    seed = loaded_with(seed, series)
    facts = [synth.facts(seed, series, "gpu1"), HostFacts("gpu2", reachable=False,
                                                          error="connection refused")]
    found = [f for f in api.evaluate(series, facts, cohorts=PAIR).findings
             if f.id.startswith("cohort-parity")]
    assert {f.status for f in found} == {"unknown"}
    assert "gpu2: connection refused" in by(found, "tree").message


def test_hosts_outside_a_cohort_are_not_compared(series, seed) -> None:
    seed = loaded_with(seed, series)
    assert audit(series, seed, without(seed, "mhc-bf16"), cohorts=()) == []


def test_each_server_has_a_hash_of_what_it_runs(series, seed) -> None:
    seed = loaded_with(seed, series)
    reports = api.evaluate(series, [synth.facts(seed, series, "gpu1"),
                                    synth.facts(without(seed, "mhc-bf16"), series, "gpu2")],
                           cohorts=PAIR).hosts
    digests = {(r.host, r.role): r.digest() for r in runs(series, reports, PAIR)}
    assert digests[("gpu1", "prefill")] != digests[("gpu2", "prefill")]
    assert "unknown" == digests[("gpu2", "decode")]        # loaded: unknown there


# ---------------------------------------------------------------- the inventory

def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_inventory_cohorts_and_compatible(tmp_path, series) -> None:
    inv = inventory_mod.load(write(tmp_path, (
        "version: 1\nhosts:\n  gpu1: {cohort: flash}\n  gpu2: {cohort: flash}\n  gpu3: {}\n"
        "cohorts:\n  flash:\n    compatible: [mhc-bf16]\n")))
    assert from_inventory(inv, series) == (CohortSpec("flash", ("gpu1", "gpu2"),
                                                      ("mhc-bf16",)),)


@pytest.mark.parametrize("text, where", [
    ("hosts:\n  gpu1: {cohort: 'a b'}\n", ":3: hosts.gpu1.cohort:"),
    ("hosts:\n  gpu1: {cohort: a}\ncohorts:\n  b: {}\n", ":5: cohorts.b:"),
    ("hosts:\n  gpu1: {cohort: a}\ncohorts:\n  a: {compatible: x}\n", "cohorts.a.compatible:"),
    ("hosts:\n  gpu1: {cohort: a}\ncohorts:\n  a: {strict: [x]}\n", "cohorts.a.strict:"),
])
def test_bad_cohorts_are_one_line_errors(tmp_path, text, where) -> None:
    with pytest.raises(ManifestError) as err:
        inventory_mod.load(write(tmp_path, "version: 1\n" + text))
    assert where in str(err.value) and "\n" not in str(err.value)


def test_a_compatible_patch_not_in_the_series_is_named_at_its_line(tmp_path, series) -> None:
    inv = inventory_mod.load(write(tmp_path, (
        "version: 1\nhosts:\n  gpu1: {cohort: a}\ncohorts:\n  a:\n    compatible: [nope]\n")))
    with pytest.raises(ManifestError) as err:
        from_inventory(inv, series)
    assert str(err.value).endswith(":6: cohorts.a.compatible: 'nope' is not a patch of "
                                   "the series")


def test_ansible_names_the_cohort(tmp_path) -> None:
    path = tmp_path / "inventory.ini"
    path.write_text("[gpus]\ngpu1 ansible_host=10.0.0.1 patchset_tree=/opt/sglang "
                    "patchset_cohort=flash\n")
    inv = inventory_mod.load(path)
    assert inv.hosts["gpu1"].cohort == "flash"
    assert inv.cohorts["flash"].hosts == ("gpu1",)


# ---------------------------------------------------------------- report and metrics

def test_the_report_and_the_exporter_carry_cohort_and_hash(series, seed) -> None:
    from patchset.auditor import metrics
    from patchset.auditor.report import to_dict, validate
    seed = loaded_with(seed, series)
    other = loaded_with(without(seed, "mhc-bf16"), series)
    data = to_dict(api.evaluate(series, [synth.facts(seed, series, "gpu1"),
                                         synth.facts(other, series, "gpu2")], cohorts=PAIR))
    assert validate(data) == []
    rows = {(c["host"], c["role"]): c for c in data["cohorts"]}
    assert rows[("gpu1", "decode")]["hash"] != rows[("gpu2", "decode")]["hash"]
    assert rows[("gpu1", "prefill")]["cohort"] == "flash"
    text = metrics.render(data)
    line = (f'patchset_server_cohort{{cohort="flash",hash="{rows[("gpu2", "decode")]["hash"]}",'
            'host="gpu2",role="decode",server="sglang-decode.service"} 1.0')
    assert line in text


# ---------------------------------------------------------------- patches.yaml

def test_patches_declare_wire_and_parity(tmp_path) -> None:
    from patchset.series.manifest import load_series as load
    from tests.system.test_audit_hosts import write_series
    s = load(write_series(tmp_path / "ok", **{"mhc-bf16": {"wire": True, "parity": "any"}}))
    p = s.by_name()["mhc-bf16"]
    assert (p.wire, p.parity) == (True, "any")
    assert (s.by_name()["triton-dsa-indexer"].wire,
            s.by_name()["triton-dsa-indexer"].parity) == (False, "strict")


@pytest.mark.parametrize("change, field", [({"wire": "yes"}, ".wire:"),
                                           ({"parity": "loose"}, ".parity:")])
def test_bad_wire_or_parity_is_a_one_line_error(tmp_path, change, field) -> None:
    from patchset.series.manifest import load_series as load
    from tests.system.test_audit_hosts import write_series
    with pytest.raises(ManifestError) as err:
        load(write_series(tmp_path / "bad", **{"mhc-bf16": change}))
    assert field in str(err.value) and "\n" not in str(err.value)
    assert "patches.yaml:" in str(err.value)
