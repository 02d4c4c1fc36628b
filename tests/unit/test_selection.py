"""Selection rules: cumulative tiers, paths, --only/--exclude, depends, conflicts, order."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from patchset.api import closed_selections
from patchset.cli import main
from patchset.errors import SelectionError
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, parse_names, plan


@pytest.fixture()
def series(series_dir: Path):
    return load_series(series_dir / "patches.yaml")


def names(series, **kw) -> tuple[str, ...]:
    return plan(series, Selection(**kw)).names


def test_tiers_are_cumulative(series) -> None:
    assert names(series, tier="safe") == ("chat-a",)
    assert names(series, tier="moderate") == ("chat-a", "dsv4-b", "idx-c")
    assert names(series, tier="risky") == ("chat-a", "dsv4-b", "idx-c", "idx-d", "chat-e")
    assert names(series) == names(series, tier="risky")


def test_path_keeps_both_patches(series) -> None:
    decode = plan(series, Selection(path="decode"))
    # idx-d (decode) needs dsv4-b (prefill): pulled in and marked so.
    assert decode.names == ("chat-a", "dsv4-b", "idx-c", "idx-d", "chat-e")
    pulled = {d.name: d for d in decode.decisions}["dsv4-b"]
    assert pulled.selected and pulled.pulled_in and "idx-d depends on it" in pulled.reason
    assert names(series, path="prefill") == ("chat-a", "dsv4-b", "chat-e")


def test_only_pulls_dependencies_in_series_order(series) -> None:
    result = plan(series, Selection(only=("idx-d",)))
    assert result.names == ("dsv4-b", "idx-c", "idx-d")
    reasons = {d.name: d.reason for d in result.decisions}
    assert reasons["idx-d"] == "named in --only"
    assert reasons["chat-a"] == "not named in --only"
    assert reasons["idx-c"] == "pulled in: idx-d depends on it"


def test_exclude_and_every_decision_has_a_reason(series) -> None:
    result = plan(series, Selection(tier="moderate", exclude=("chat-a",)))
    assert result.names == ("dsv4-b", "idx-c")
    assert all(d.reason for d in result.decisions)
    assert {d.name: d.reason for d in result.decisions}["idx-d"] == \
        "tier risky is above --tier moderate"


def test_excluding_a_needed_dependency_is_refused(series) -> None:
    with pytest.raises(SelectionError, match="chat-e depends on chat-a, which --exclude removes"):
        plan(series, Selection(exclude=("chat-a",)))


def test_unknown_names_and_bad_values(series) -> None:
    with pytest.raises(SelectionError, match="--only 'ghost': no such patch"):
        plan(series, Selection(only=("ghost",)))
    with pytest.raises(SelectionError, match="--path 'up'"):
        plan(series, Selection(path="up"))
    with pytest.raises(SelectionError, match="both in --only and --exclude"):
        plan(series, Selection(only=("chat-a",), exclude=("chat-a",)))


def test_conflicts_refused(series_dir: Path) -> None:
    manifest = series_dir / "patches.yaml"
    data = yaml.safe_load(manifest.read_text())
    data["series"][2]["conflicts"] = ["chat-a"]    # no patch needs both (idx-d needs
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))   # idx-c and dsv4-b)
    series = load_series(manifest)
    with pytest.raises(SelectionError, match="idx-c conflicts with chat-a"):
        plan(series, Selection(tier="moderate"))
    assert plan(series, Selection(only=("idx-c",))).names == ("idx-c",)
    assert all("idx-c" not in {p.name for p in sel} or "chat-a" not in {p.name for p in sel}
               for sel in closed_selections(series, exhaustive=True))


def test_parse_names_accepts_commas_and_repeats() -> None:
    assert parse_names(["a,b", " c ", "d,,"]) == ("a", "b", "c", "d")


@pytest.mark.parametrize("values", [[""], [" , "], ["a", ""]])
def test_an_explicit_empty_name_list_is_bad_input(values) -> None:
    # read as no names, `--only ''` would select every patch, risky ones included
    with pytest.raises(SelectionError, match="--only .*: names nothing"):
        parse_names(values, "--only")


def test_plan_refuses_an_empty_only(capsys) -> None:
    from patchset.cli import main
    code = main(["plan", "--only", ""])
    assert code == 2 and "--only '': names nothing" in capsys.readouterr().err


def test_exhaustive_selections_are_dependency_closed(series) -> None:
    selections = closed_selections(series, exhaustive=True)
    assert len(selections) == 15   # of 32 subsets, these respect depends (empty included)
    for chosen in selections:
        present = {p.name for p in chosen}
        assert all(set(p.depends) <= present for p in chosen)
        order = [p.name for p in series.patches if p.name in present]
        assert [p.name for p in chosen] == order


def test_plan_cli_prints_reason_per_patch(series_dir: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(series_dir)
    assert main(["plan", "--tier", "safe"]) == 0
    out = capsys.readouterr().out
    assert "+ chat-a" in out and "tier safe within --tier safe" in out
    assert "- idx-d" in out and "tier risky is above --tier safe" in out
    assert main(["plan", "--only", "idx-d", "--json"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    assert data["selected"] == ["dsv4-b", "idx-c", "idx-d"]
    assert [d["pulled_in"] for d in data["decisions"]] == [False, True, True, False, False]
