"""Issue 25, class 12: what the tool says matches what it does.

1. `--series`: the docs say which commands read the series (all but `probe`, `init` and
   `version`); every one of them takes `--series`, the two others do not and never read
   one. Checked against every registered command's `--help`.
2. Suggested next steps are commands that run: an audit's `plan --only ...` is built by
   `selection.plan` itself (each patch once, dependencies in, series order), never names
   an already-applied patch as the fix to add (a fix on disk the servers did not load is
   a restart), and RUNNING the suggested argv through the CLI selects exactly what it
   names.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest
from tests.audit_facts import synth
from tests.unit.test_audit_observed import traced

from patchset.auditor import api
from patchset.cli import main
from patchset.cli.app import command_tree

CLAMP = "nvfp4-cutlass-swiglu-clamp"
README = Path(__file__).resolve().parents[2] / "docs" / "howto" / "commands.md"


# ---------------------------------------------------------------- 1. --series

def not_reading_the_series() -> set[str]:
    """The commands the docs say never read the series (docs/howto/commands.md)."""
    text = " ".join(README.read_text().split())
    found = re.search(r"Every command that reads the series \(all but ((?:`[a-z]+`(?:, | "
                      r"and )?)+), which never do\)", text)
    assert found, "the --series sentence of docs/howto/commands.md is gone"
    return set(re.findall(r"`([a-z]+)`", found.group(1)))


def all_commands() -> list[str]:
    return list(command_tree().commands)


def help_of(capsys, command: str) -> str:
    code = main([command, "--help"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_every_command_that_reads_the_series_takes_series(capsys) -> None:
    exempt = not_reading_the_series()
    commands = all_commands()
    assert exempt == {"probe", "init", "version"} and exempt <= set(commands)
    assert len(commands) >= 19
    for command in commands:
        takes = "--series" in help_of(capsys, command)
        assert takes == (command not in exempt), command


def test_probe_never_reads_the_series(tmp_path: Path, monkeypatch, capsys) -> None:
    """A broken patches.yaml in the working directory (and in $PATCHSET_SERIES) does not
    stop `probe`: an endpoint that is not there is exit 3, not a manifest error."""
    (tmp_path / "patches.yaml").write_text("version: [\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATCHSET_SERIES", str(tmp_path / "patches.yaml"))
    code = main(["probe", "--url", "http://127.0.0.1:9", "--kind", "recall",
                 "--timeout", "2", "--json"])
    _, err = capsys.readouterr()
    assert code == 3 and "patches.yaml" not in err, err
    assert main(["list"]) == 2                       # the same file, read: refused
    assert "patches.yaml" in capsys.readouterr().err


# ---------------------------------------------------------------- 2. suggested commands

@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory):
    return synth.real_series(tmp_path_factory.mktemp("series"))


def steps_for(series, desc: dict, symptom: str = "context-loss") -> list:
    return api.evaluate(series, [synth.facts(desc, series)], symptom).symptom.next_steps


def plan_steps(steps: list) -> list:
    return [s for s in steps if s.command.startswith("patchset plan ")]


def run_suggested(series, command: str, capsys) -> tuple[str, ...]:
    """Run a suggested `patchset plan --only NAMES HOST` as given (the host dropped: no
    host is reachable here; `plan` checks the selection before any host) and return
    what it selected; it must be exactly the NAMES the command shows."""
    argv = shlex.split(command)
    assert argv[:3] == ["patchset", "plan", "--only"] and len(argv) == 5, argv
    names = argv[3].split(",")
    assert len(names) == len(set(names)), f"a patch named twice: {command}"
    code = main(["plan", "--only", argv[3], "--json", "--series", series.manifest])
    out, err = capsys.readouterr()
    assert code == 0, err
    selected = tuple(json.loads(out)["selected"])
    assert selected == tuple(names), (command, selected)
    return selected


def test_the_seeds_suggested_plan_runs_and_adds_the_fix(series, capsys) -> None:
    seed = synth.load("seed.yaml")
    [step] = plan_steps(steps_for(series, seed))
    selected = run_suggested(series, step.command, capsys)
    assert set(selected) == set(seed["tree"]["applied"]) | {CLAMP}


@pytest.mark.parametrize("symptom", ["context-loss", "decode-quality"])
def test_an_applied_fix_is_never_suggested_again(series, capsys, symptom) -> None:
    """The clamp applied on disk after the servers started: the hazard still fires in
    them. The step is a restart of those servers, not `plan --only ...,clamp,clamp`."""
    seed = synth.load("seed.yaml")
    loaded = list(seed["tree"]["applied"])
    on_disk = copy.deepcopy(seed)
    on_disk["tree"]["applied"].append(CLAMP)
    on_disk["tree"]["updated"] = "2026-11-29T09:00:00Z"
    steps = steps_for(series, traced(on_disk, series, [], work=False, loaded=loaded), symptom)
    for step in plan_steps(steps):
        run_suggested(series, step.command, capsys)
        assert CLAMP not in step.command, step
    [restart] = [s for s in steps if s.kind == "restart" and CLAMP in s.title]
    assert restart.title == (f"{CLAMP} is applied on gpu1 but not loaded: restart "
                             "sglang-decode.service, sglang-prefill.service")
    assert restart.command.endswith(
        "systemctl restart sglang-decode.service sglang-prefill.service")


def test_a_suggested_selection_pulls_in_dependencies_in_series_order(series, capsys) -> None:
    """A host without the fix's dependency chain: the command names what `plan` takes."""
    from patchset.auditor.rank import suggested_plan
    command = suggested_plan(series, ["mhc-bf16", "indexer-bf16-gemm", "mhc-bf16"], "gpu1")
    assert command == "patchset plan --only triton-dsa-indexer,indexer-bf16-gemm,mhc-bf16 gpu1"
    run_suggested(series, command, capsys)
    assert suggested_plan(series, ["gone-from-the-series", "mhc-bf16"], "gpu 1") == \
        "patchset plan --only mhc-bf16 'gpu 1'"
