"""No inherited git variable can point a git call of patchset at another repository:
apply, status and revert on a local git tree, an import, `rebase --check` and
`init --git`, with GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE and injected config aimed at a
decoy repository, do what they are asked and leave the decoy byte for byte as it was. Every
git child goes through patchset/agent/lib/gitenv.py's run_git (or its environment, where git's
output is streamed), in one of its named modes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from tests.hostile import snapshot

from patchset.connect.local import LocalTransport
from patchset import api
from patchset.agent.lib import gitenv
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, plan
from patchset.pin.upstream import materialize
from tests.unit.test_interop import empty_series  # noqa: F401 - a fixture
from tests.unit.test_rebase import new_base  # noqa: F401 - a fixture


DECOY_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


@pytest.fixture()
def decoy(tmp_path: Path, monkeypatch) -> Path:
    return _decoy(tmp_path, monkeypatch)


@pytest.fixture()
def arm(tmp_path: Path, monkeypatch) -> Callable[[], Path]:
    """The decoy's variables set when the test says (its fixtures' own git runs first)."""
    return lambda: _decoy(tmp_path, monkeypatch)


def _decoy(tmp_path: Path, monkeypatch) -> Path:
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
    assert [a.name for a in status.record.applied] == [p.name for p in chosen.patches]
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


@pytest.mark.parametrize("mode", gitenv.MODES)
def test_every_mode_drops_what_redirects_git(decoy: Path, mode: str, tmp_path: Path) -> None:
    before = snapshot(decoy)
    env = gitenv.git_env(mode=mode)
    assert not [k for k in DECOY_ENV if k in env] and "GIT_CONFIG_COUNT" not in env
    work = tmp_path / "work"
    assert gitenv.run_git(["init", "-q", str(work)], tmp_path, mode=mode).returncode == 0
    top = gitenv.run_git(["rev-parse", "--show-toplevel"], work, mode=mode)
    assert top.stdout.decode().strip() == str(work) and snapshot(decoy) == before
    assert (gitenv.git_env(mode=gitenv.LOCAL)["GIT_CONFIG_GLOBAL"] == "/dev/null"
            and "GIT_CONFIG_GLOBAL" not in gitenv.git_env(mode=gitenv.NETWORK))
    with pytest.raises(ValueError):
        gitenv.git_env(mode="elsewhere")


def test_init_git_ignores_a_redirecting_environment(arm, tmp_path: Path, capsys,
                                                   monkeypatch) -> None:
    from tests.unit.test_init import fork, init
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    repo, commit = fork(tmp_path)
    decoy = arm()
    before = snapshot(decoy)
    code, out, err = init(capsys, str(tmp_path / "s"), "--git", f"file://{repo}", "--ref",
                          "main", "--json")
    assert code == 0, err
    assert load_series(tmp_path / "s" / "patches.yaml").upstream.git.ref == commit
    assert snapshot(decoy) == before


def test_import_ignores_a_redirecting_environment(arm, tmp_path: Path, series_dir: Path,
                                                  empty_series: Path, capsys) -> None:
    from tests.unit.test_interop import run
    manifest = empty_series
    quilt = tmp_path / "q"
    quilt.mkdir()
    (quilt / "chat.patch").write_text((series_dir / "patches" / "chat-a.patch").read_text())
    (quilt / "series").write_text("chat.patch\n")
    decoy = arm()
    before = snapshot(decoy)
    code, out, err = run(capsys, "import", "--quilt", str(quilt), "--offline", "--json",
                         "--author", "Jane <jane@example.invalid>", "--tier", "safe",
                         "--path", "decode", "--series", str(manifest))
    assert code == 0, err
    assert [p.name for p in load_series(manifest).patches] == \
        [e["name"] for e in json.loads(out)["patches"]]
    assert snapshot(decoy) == before


def test_rebase_check_ignores_a_redirecting_environment(arm, pinned_base, new_base,  # noqa: F811
                                                        tmp_path: Path, patchset_home: Path,
                                                        capsys) -> None:
    from tests.hostutil import cli
    from tests.unit.test_rebase import real_copy
    from tests.unit.test_rebase_check import upstream_history
    repo, commits = upstream_history(tmp_path, pinned_base, new_base)
    manifest = real_copy(tmp_path / "series")
    manifest.write_text(manifest.read_text().replace(
        "https://github.com/sgl-project/sglang.git", f"file://{repo}"))
    decoy = arm()
    before = snapshot(decoy)
    code, out, err = cli(capsys, "rebase", "--check", "v0.5.14..main", "--json", "--series",
                         str(manifest))
    assert code == 1 and json.loads(out)["commits"] == commits, err
    assert snapshot(decoy) == before


def git_spawns(paths) -> list[str]:
    """Every `subprocess.X(["git", ...])` outside gitenv.py: a git child that skips the one
    runner (and with it the environment policy)."""
    import ast
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "subprocess" and node.args
                    and isinstance(node.args[0], ast.List) and node.args[0].elts
                    and isinstance(node.args[0].elts[0], ast.Constant)
                    and str(node.args[0].elts[0].value).rsplit("/", 1)[-1] == "git"):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_every_git_child_of_the_product_goes_through_the_one_runner(tmp_path: Path) -> None:
    import patchset
    root = Path(patchset.__file__).resolve().parent.parent
    product = [p for top in ("patchset", *patchset.LAYERS) for p in (root / top).rglob("*.py")
               if p.name != "gitenv.py"]
    assert git_spawns(product) == []
    planted = tmp_path / "planted.py"
    planted.write_text("import subprocess\nsubprocess.run(['git', 'status'])\n")
    assert git_spawns([planted]) == ["planted.py:2"]
