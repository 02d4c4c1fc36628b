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
from hostutil import cli
from test_rebase import CUTLASS, MODELOPT, ROOT, new_base, real_copy, snapshot  # noqa: F401

from patchset.manifest import load_series

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
