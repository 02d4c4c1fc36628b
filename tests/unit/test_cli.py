"""The CLI as users run it: exit codes, stdout vs stderr, JSON, lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from patchset.agent.lib.records import STATE_FORMAT
from patchset.cli import main
from tests.seriesfactory import CHAT


@pytest.fixture()
def in_series(series_dir: Path, patchset_home: Path, monkeypatch) -> Path:
    monkeypatch.chdir(series_dir)
    return series_dir


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_does_not_import_heavy_libraries() -> None:
    code = ("import sys; from patchset.cli import main; main(['--help']); "
            "print(sorted(m for m in ('paramiko', 'fabric', 'git') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_list_json_and_filters(in_series: Path, capsys) -> None:
    code, out, err = run(capsys, "list", "--json", "--tier", "moderate", "--path", "decode")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert [p["name"] for p in data] == ["chat-a", "idx-c"]
    assert data[1]["gate"] == {"env": "TRITON_INDEXER", "on": "1"}
    assert len(data[0]["sha256"]) == 64
    code, out, _ = run(capsys, "list")
    assert code == 0 and "idx-d" in out and "TRITON_INDEXER=1" in out


def test_show_prints_header_diffstat_and_diff(in_series: Path, capsys) -> None:
    code, out, _ = run(capsys, "show", "idx-d")
    assert code == 0
    assert "Description: test patch idx-d" in out
    assert "python/sglang/srt/models/deepseek_v4.py | +1 -0" in out
    assert "2 file(s) changed, 2 insertions(+), 0 deletions(-)" in out
    assert "+# patch idx-d" in out
    code, _, err = run(capsys, "show", "ghost")
    assert code == 2 and "no patch named 'ghost'" in err


def test_check_json_passes_on_the_pin(in_series: Path, capsys) -> None:
    code, out, _ = run(capsys, "check", "--json", "--exhaustive")
    data = json.loads(out)
    assert code == 0 and data["ok"] is True
    assert len(data["preimages"]) == 3 and all(p["recorded"] == p["found"]
                                               for p in data["preimages"])
    assert len(data["selections"]) == 15


def test_check_fails_when_a_patch_does_not_apply(in_series: Path, capsys) -> None:
    patch = in_series / "patches" / "chat-e.patch"
    patch.write_text(patch.read_text().replace(" # patch chat-a", " # patch chat-z"))
    code, out, _ = run(capsys, "check")
    assert code == 1
    assert "FAIL chat-a,chat-e: patch chat-e does not apply" in out


def test_main_job_apply_status_revert_on_default_target(in_series: Path, patchset_home: Path,
                                                        capsys) -> None:
    code, _, err = run(capsys, "status")
    assert code == 2 and "no tree at" in err and "patchset apply --tier safe localhost" in err
    code, _, err = run(capsys, "apply", "--tier", "safe", "localhost")
    assert code == 0, err
    assert "localhost: apply done, applied: chat-a" in err
    tree = patchset_home / "targets" / "sglang-0.5.14"
    assert "# patch chat-a" in (tree / CHAT).read_text()
    code, out, _ = run(capsys, "status", "--json")
    [st] = json.loads(out)
    assert code == 0 and [a["name"] for a in st["applied"]] == ["chat-a"]
    assert st["state_version"] == STATE_FORMAT and st["base"]["commit"]
    code, _, err = run(capsys, "apply", "--tier", "risky", "localhost")
    assert code == 0
    code, _, err = run(capsys, "revert", "chat-a")
    assert code == 2 and "chat-e depend(s) on chat-a" in err
    code, out, err = run(capsys, "revert", "chat-a", "--with-dependents", "--json")
    assert code == 0 and json.loads(out)[0]["reverted"] == ["chat-a", "chat-e"]
    (tree / CHAT).write_text("hand edit\n")
    code, out, _ = run(capsys, "status")
    assert code == 1 and "uncommitted" in out and "serving_chat.py" in out


def test_apply_dry_run_changes_nothing(in_series: Path, tmp_path: Path, pinned_base,
                                       capsys) -> None:
    from patchset.pin.upstream import materialize
    tree = materialize(pinned_base, tmp_path / "t", layout="wheel")
    before = (tree / "sglang/srt/entrypoints/openai/serving_chat.py").read_bytes()
    code, _, err = run(capsys, "apply", "--dry-run", "--target", str(tree), "localhost")
    assert code == 0 and "would change" in err
    assert (tree / "sglang/srt/entrypoints/openai/serving_chat.py").read_bytes() == before
    assert not (tree / ".patchset").exists()       # a dry run writes nothing, not even a lock
    code, _, err = run(capsys, "plan", "--target", str(tree), "localhost")
    assert code == 0 and not (tree / ".patchset").exists()


def test_bad_input_exit_2_and_unknown_host(in_series: Path, capsys) -> None:
    code, _, err = run(capsys, "apply", "--tier", "unsafe", "localhost")
    assert code == 2 and err.strip() == ("patchset: error: --tier 'unsafe': expected one of "
                                         "safe, moderate, risky")
    code, _, err = run(capsys, "apply", "--target", "/nonexistent/tree", "localhost")
    assert code == 2 and "does not exist" in err
    code, _, err = run(capsys, "list", "--series", "/nonexistent/patches.yaml")
    assert code == 2 and "/nonexistent/patches.yaml: (file): not found" in err
