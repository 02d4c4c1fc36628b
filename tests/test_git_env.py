"""No inherited git variable can point a git call of patchset at another repository:
apply, status and revert on a local git tree with GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE
and injected config aimed at a decoy repository change the tree as asked and leave the
decoy byte for byte as it was."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hostile import snapshot

from patchset.connect.local import LocalTransport
from patchset import api
from patchset.agent import gitenv
from patchset.manifest import load_series
from patchset.selection import Selection, plan
from patchset.upstream import materialize


@pytest.fixture()
def decoy(tmp_path: Path, monkeypatch) -> Path:
    repo = tmp_path / "decoy"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True,
                   env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    (repo / "precious.txt").write_text("mine\n")
    for name, value in {"GIT_DIR": str(repo / ".git"), "GIT_WORK_TREE": str(repo),
                        "GIT_INDEX_FILE": str(repo / ".git" / "index"),
                        "GIT_OBJECT_DIRECTORY": str(repo / ".git" / "objects"),
                        "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.hooksPath",
                        "GIT_CONFIG_VALUE_0": str(tmp_path / "hooks"),
                        "GIT_CONFIG_PARAMETERS": "'user.name'='decoy'"}.items():
        monkeypatch.setenv(name, value)
    return repo


def test_apply_status_revert_ignore_a_redirecting_environment(decoy: Path, series_dir: Path,
                                                              pinned_base, tmp_path: Path
                                                              ) -> None:
    before = snapshot(decoy)
    tree = materialize(pinned_base, tmp_path / "tree", layout="git")
    series = load_series(series_dir / "patches.yaml")
    chosen = plan(series, Selection(tier="safe"))
    [applied] = api.apply(series, chosen, [LocalTransport(tree)])
    assert applied.ok, applied.error
    status = api.status(series, LocalTransport(tree))
    assert status.error is None and not status.has_findings(), status.to_json()
    assert [a["name"] for a in status.record.applied] == [p.name for p in chosen.patches]
    reverted = api.revert(series, [chosen.patches[-1].name], LocalTransport(tree))
    assert reverted.ok, reverted.error
    clean = subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True,
                           text=True, env=gitenv.git_env(), check=True).stdout
    assert clean == "" and snapshot(decoy) == before


def test_the_policy_drops_every_redirecting_variable(decoy: Path) -> None:
    env = gitenv.git_env()
    assert not [k for k in env if k.startswith(("GIT_DIR", "GIT_WORK", "GIT_INDEX",
                                                "GIT_OBJECT", "GIT_CONFIG_KEY",
                                                "GIT_CONFIG_VALUE", "GIT_CONFIG_PARAM",
                                                "GIT_CONFIG_COUNT"))]
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["PATH"]
