"""`patchset rebase --check START..END` over an upstream history made of real release
files: the pinned 0.5.14 tree, then one commit that changes nothing the series touches,
one that brings 0.5.15's MoE files (the swiglu-clamp patch conflicts there), one that
takes mhc-bf16 upstream. Each break is charged to the commit that made it; nothing is
written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tests.hostutil import cli
from tests.unit.test_rebase import CUTLASS, MODELOPT, ROOT, new_base, real_copy, snapshot  # noqa: F401

from patchset.series.manifest import load_series

GIT_ENV = {"GIT_AUTHOR_NAME": "up", "GIT_AUTHOR_EMAIL": "up@x", "GIT_COMMITTER_NAME": "up",
           "GIT_COMMITTER_EMAIL": "up@x", "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null"}


@pytest.fixture(autouse=True)
def _home(patchset_home: Path) -> Path:
    return patchset_home


def git(repo: Path, *args: str, data: bytes | None = None) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, input=data, check=True,
                          capture_output=True).stdout.decode().strip()


def upstream_history(tmp_path: Path, pinned_base, new_base) -> tuple[Path, list[str]]:  # noqa: F811
    repo = tmp_path / "upstream"
    subprocess.run(["git", "clone", "-q", str(pinned_base.repo), str(repo)], env=GIT_ENV,
                   check=True)
    git(repo, "checkout", "-q", "-B", "main", pinned_base.commit)
    git(repo, "tag", "v0.5.14")
    (repo / "UNRELATED.md").write_text("docs only\n")
    git(repo, "add", "UNRELATED.md")
    git(repo, "commit", "-qm", "docs: nothing the series touches")
    for path in (CUTLASS, MODELOPT):
        data = subprocess.run(["git", "cat-file", "blob", f"{new_base.commit}:{path}"],
                              cwd=new_base.repo, capture_output=True, check=True).stdout
        (repo / path).write_bytes(data)
    git(repo, "commit", "-qam", "moe: 0.5.15's cutlass and modelopt files")
    mhc = (ROOT / "patches" / "mhc-bf16.patch").read_text()
    git(repo, "apply", "-p1", "-", data=mhc.encode())
    git(repo, "commit", "-qam", "models: mhc in bf16 (upstream takes it)")
    commits = git(repo, "rev-list", "--reverse", "v0.5.14..main").split()
    return repo, commits


def test_each_break_is_charged_to_the_commit_that_made_it(pinned_base, new_base, tmp_path,  # noqa: F811
                                                          capsys) -> None:
    repo, (docs, moe, mhc) = upstream_history(tmp_path, pinned_base, new_base)
    manifest = real_copy(tmp_path / "series")
    text = manifest.read_text().replace("https://github.com/sgl-project/sglang.git",
                                        f"file://{repo}")
    manifest.write_text(text)
    assert load_series(manifest).upstream.git.url == f"file://{repo}"
    before = snapshot(manifest.parent)
    code, out, err = cli(capsys, "rebase", "--check", "v0.5.14..main", "--json", "--series",
                         str(manifest))
    report = json.loads(out)
    assert code == 1 and report["exit_code"] == 1, err
    assert report["commits"] == [docs, moe, mhc]
    by = {(b["commit"], b["patch"], b["what"]) for b in report["breaks"]}
    assert (moe, "nvfp4-cutlass-swiglu-clamp", "conflict") in by
    assert (mhc, "mhc-bf16", "upstream") in by
    assert not any(b["commit"] == docs for b in report["breaks"])
    assert report["subjects"][mhc] == "models: mhc in bf16 (upstream takes it)"
    final = {p["name"]: p["outcome"] for p in report["final"]}
    assert final["mhc-bf16"] == "upstream" and final["default-thinking-reasoning"] == "clean"
    assert snapshot(manifest.parent) == before                  # nothing written

    code, out, _ = cli(capsys, "rebase", "--check", "v0.5.14..main", "--series", str(manifest),
                       "--offline")                              # from the cached history
    assert code == 1 and f"{moe[:12]} moe: 0.5.15" in out and "mhc-bf16: upstream" in out
    code, _, err = cli(capsys, "rebase", "--check", "main..v0.5.14", "--series", str(manifest))
    assert code == 2 and "'main' is not an ancestor of 'v0.5.14'" in err
    code, _, err = cli(capsys, "rebase", "--check", "main..main", "--series", str(manifest))
    assert code == 2 and "no commit between them" in err


@pytest.mark.parametrize("argv, words", [
    (["--check", "v0.5.14"], "START..END"),
    (["--check", "--upload-pack=x..main"], "--check"),
    (["--check", "a..b", "--onto", "0.5.15"], "one of them"),
    ([], "one of them"),
])
def test_bad_check_input_is_one_line_exit_2(argv, words, tmp_path, capsys) -> None:
    manifest = real_copy(tmp_path / "series")
    code, _, err = cli(capsys, "rebase", *argv, "--series", str(manifest))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_onto_an_upstream_commit_moves_the_pin_there(pinned_base, new_base, tmp_path,  # noqa: F811
                                                     capsys) -> None:
    """`--onto BRANCH` pins the branch's commit (a commit has no wheel: `pypi:` goes), the
    layout and the rest of the manifest kept as written, and the result checks."""
    repo, (docs, _moe, _mhc) = upstream_history(tmp_path, pinned_base, new_base)
    git(repo, "branch", "docs-only", docs)
    manifest = real_copy(tmp_path / "series")
    manifest.write_text(manifest.read_text().replace(
        "https://github.com/sgl-project/sglang.git", f"file://{repo}"))
    code, out, err = cli(capsys, "rebase", "--onto", "docs-only", "--json", "--series",
                         str(manifest))
    assert code == 0, err
    result = json.loads(out)
    assert {p["outcome"] for p in result["patches"]} == {"clean"}
    pin = load_series(manifest).upstream
    assert pin.git.ref == docs and pin.pypi is None and pin.git_prefix == "python/"
    assert pin.version == f"0.5.14+g{docs[:12]}"
    text = manifest.read_text()
    assert "pypi:" not in text and "# The series" in text and "layout:" in text
    code, _, err = cli(capsys, "check", "--series", str(manifest))
    assert code == 0, err


# ---------------------------------------------------------------- a small upstream

FOO = "import os\n\n\ndef forward(x):\n    return x + 1\n\n\ndef other(y):\n    return y * 2\n"


def small_upstream(tmp_path: Path, capsys, monkeypatch) -> dict:
    """An upstream of three files, a series of one patch (forward() returns x + 2) pinned
    at its first commit by `init`, then B (forward() rewritten: the patch conflicts) and C
    (docs only) on main; tags `pin` and `b-tag`; a branch `side` off the pin."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    up = tmp_path / "upstream"
    pkg = up / "python" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    for path, text in (("__init__.py", ""), ("version.py", '__version__ = "0.5.14"\n'),
                       ("srt/__init__.py", ""), ("srt/foo.py", FOO)):
        (pkg / path).write_text(text)
    (up / "README.md").write_text("upstream\n")
    git(up, "init", "-q", "-b", "main")
    git(up, "add", "-A")
    git(up, "commit", "-qm", "A: base")
    git(up, "tag", "pin")
    pin = git(up, "rev-parse", "HEAD")
    series = tmp_path / "series"
    code, _, err = cli(capsys, "init", str(series), "--git", f"file://{up}", "--ref", "main")
    assert code == 0, err
    foo = pkg / "srt" / "foo.py"
    foo.write_text(FOO.replace("x + 1", "x + 2"))
    diff = git(up, "diff", "--full-index", "--no-color", "--no-renames")
    git(up, "checkout", "-q", "--", ".")
    (series / "patches" / "fast.patch").write_text(
        "Description: forward adds 2\nAuthor: T <t@example.invalid>\nForwarded: no\n"
        "Last-Update: 2026-01-01\nPatchset-Name: fast\n\n" + diff + "\n")
    manifest = series / "patches.yaml"
    manifest.write_text(manifest.read_text().replace("series: []", (
        "series:\n  - name: fast\n    file: patches/fast.patch\n    summary: forward adds 2\n"
        "    tier: safe\n    path: both\n    upstream_status: pending\n")))
    code, _, err = cli(capsys, "check", "--series", str(manifest))
    assert code == 0, err
    foo.write_text(FOO.replace("x + 1", "x + 100"))
    git(up, "commit", "-qam", "B: forward adds 100")
    b = git(up, "rev-parse", "HEAD")
    git(up, "tag", "b-tag")
    (up / "README.md").write_text("docs\n")
    git(up, "commit", "-qam", "C: docs only")
    c = git(up, "rev-parse", "HEAD")
    git(up, "branch", "side", pin)
    git(up, "checkout", "-q", "side")
    (up / "SIDE.md").write_text("side\n")
    git(up, "add", "SIDE.md")
    git(up, "commit", "-qm", "S: side")
    git(up, "checkout", "-q", "main")
    return {"up": up, "manifest": manifest, "pin": pin, "b": b, "c": c}


def check(capsys, fx: dict, spec: str, *extra: str) -> tuple[int, dict | None, str]:
    """(exit code, the --json report or None, stderr without the progress lines)."""
    code, out, err = cli(capsys, "rebase", "--check", spec, "--json", "--series",
                         str(fx["manifest"]), *extra)
    err = "".join(line for line in err.splitlines(keepends=True)
                  if not line.rstrip().endswith("..."))
    return code, (json.loads(out) if out.strip() else None), err


def test_the_baseline_is_start_and_a_break_already_there_is_not_charged_to_the_range(
        tmp_path, capsys, monkeypatch) -> None:
    """b-tag..main: B (the conflict) is START, so C (docs only) breaks nothing; the
    conflict is reported as already on START, the exit still 1."""
    fx = small_upstream(tmp_path, capsys, monkeypatch)
    before = snapshot(fx["manifest"].parent)
    code, report, err = check(capsys, fx, "b-tag..main")
    assert code == 1 and report["exit_code"] == 1, err
    assert report["commits"] == [fx["c"]] and report["breaks"] == []
    assert report["start"] == fx["b"]
    assert [(b["commit"], b["patch"], b["what"]) for b in report["at_start"]] == \
        [(fx["b"], "fast", "conflict")]
    assert report["subjects"][fx["b"]] == "B: forward adds 100"
    code, out, err = cli(capsys, "rebase", "--check", "b-tag..main", "--series",
                         str(fx["manifest"]))
    assert code == 1 and f"already at START {fx['b'][:12]} B: forward adds 100: fast: " \
        "conflict" in out and "nothing breaks the series; 1 already on START" in err
    code, report, err = check(capsys, fx, "pin..main")          # from the pin: B is charged
    assert code == 1 and report["at_start"] == [], err
    assert [(b["commit"], b["what"]) for b in report["breaks"]] == [(fx["b"], "conflict")]
    assert snapshot(fx["manifest"].parent) == before


def test_start_must_be_an_ancestor_of_end(tmp_path, capsys, monkeypatch) -> None:
    fx = small_upstream(tmp_path, capsys, monkeypatch)
    for spec in ("side..main", "main..pin", "b-tag..side"):
        code, report, err = check(capsys, fx, spec)
        start, end = spec.split("..")
        assert code == 2 and report is None, (spec, err)
        assert f"'{start}' is not an ancestor of '{end}'" in err
        assert len(err.strip().splitlines()) == 1


def test_offline_resolves_exactly_the_range_given(tmp_path, capsys, monkeypatch) -> None:
    """Two ranges fetched; offline, each gives its own commits (not the last fetched), a
    reversed range is refused, and an end never fetched is exit 2 naming it."""
    fx = small_upstream(tmp_path, capsys, monkeypatch)
    assert check(capsys, fx, "pin..main")[1]["commits"] == [fx["b"], fx["c"]]
    assert check(capsys, fx, "b-tag..main")[1]["commits"] == [fx["c"]]
    code, report, err = check(capsys, fx, "pin..main", "--offline")
    assert code == 1 and report["commits"] == [fx["b"], fx["c"]], err
    assert report["start"] == fx["pin"]
    code, report, err = check(capsys, fx, "b-tag..main", "--offline")
    assert code == 1 and report["commits"] == [fx["c"]] and report["start"] == fx["b"], err
    code, report, err = check(capsys, fx, "main..pin", "--offline")
    assert code == 2 and "'main' is not an ancestor of 'pin'" in err
    code, report, err = check(capsys, fx, "pin..no-such-tag", "--offline")
    assert code == 2 and report is None and "end 'no-such-tag': not fetched" in err
    code, report, err = check(capsys, fx, "side..main", "--offline")
    assert code == 2 and "start 'side': not fetched" in err


@pytest.mark.parametrize("spec, named", [("nosuch..main", "start 'nosuch'"),
                                         ("pin..nosuch", "end 'nosuch'")])
def test_a_range_end_upstream_does_not_have_is_exit_2_naming_it(tmp_path, capsys, monkeypatch,
                                                                 spec, named) -> None:
    fx = small_upstream(tmp_path, capsys, monkeypatch)
    code, report, err = check(capsys, fx, spec)
    assert code == 2 and report is None and len(err.strip().splitlines()) == 1, err
    assert f"{named}: no such branch, tag or commit at file://{fx['up']}" in err


def test_an_unreachable_upstream_is_exit_3(tmp_path, capsys, monkeypatch) -> None:
    fx = small_upstream(tmp_path, capsys, monkeypatch)
    gone = tmp_path / "moved"
    fx["up"].rename(gone)
    code, report, err = check(capsys, fx, "pin..main")
    assert code == 3 and report is None and len(err.strip().splitlines()) == 1, err
    assert f"cannot reach file://{fx['up']}" in err


def test_a_manifest_ref_upstream_does_not_have_is_exit_2_at_its_line(tmp_path, capsys,
                                                                    monkeypatch) -> None:
    """A git-only pin whose ref the repository does not have: `file:line: upstream.git.ref`
    and exit 2 (was exit 4, 'no pypi fallback'), the manifest unchanged."""
    fx = small_upstream(tmp_path, capsys, monkeypatch)
    manifest = fx["manifest"]
    manifest.write_text(manifest.read_text().replace(f'ref: "{fx["pin"]}"', 'ref: "nosuch"'))
    line = next(i for i, text in enumerate(manifest.read_text().splitlines(), 1)
                if 'ref: "nosuch"' in text)
    before = manifest.read_bytes()
    code, _, err = cli(capsys, "check", "--series", str(manifest))
    err = "".join(ln for ln in err.splitlines(True) if not ln.rstrip().endswith("..."))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{manifest}:{line}: upstream.git.ref: 'nosuch': no such branch" in err
    assert manifest.read_bytes() == before


def test_onto_a_commit_upstream_does_not_have_is_exit_2_naming_it(tmp_path, capsys,
                                                                   monkeypatch) -> None:
    fx = small_upstream(tmp_path, capsys, monkeypatch)
    before = snapshot(fx["manifest"].parent)
    code, _, err = cli(capsys, "rebase", "--onto", "nosuch", "--series", str(fx["manifest"]))
    err = "".join(ln for ln in err.splitlines(True) if not ln.rstrip().endswith("..."))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--onto 'nosuch': no such branch, tag or commit at file://{fx['up']}" in err
    assert snapshot(fx["manifest"].parent) == before
