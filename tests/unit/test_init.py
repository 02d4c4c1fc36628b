"""`patchset init`: a valid manifest for a release (resolved from the real package index,
or offline from the cache) or for an upstream git commit (layout read from the tree);
never an overwrite, bad input exit 2 with nothing written."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from patchset.cli import main
from patchset.errors import Exit
from patchset.series.manifest import load_series

ROOT = Path(__file__).resolve().parents[2]


def init(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["init", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_release_resolves_to_the_projects_own_pin(tmp_path: Path, capsys, monkeypatch) -> None:
    """Against the real package index, with a fresh cache: the wheel's file name and
    sha256 are the ones patches.yaml pins (checked there by every provision)."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    code, out, _ = init(capsys, str(tmp_path / "s"), "--pin", "sglang==0.5.14", "--json")
    assert code == Exit.OK, out
    made = load_series(tmp_path / "s" / "patches.yaml").upstream
    ours = load_series(ROOT / "patches.yaml").upstream
    assert made == ours
    assert (tmp_path / "s" / "patches").is_dir() and json.loads(out)["how"] == "release"
    assert load_series(tmp_path / "s" / "patches.yaml").patches == ()


def test_offline_from_a_cached_wheel_and_not_without_one(tmp_path: Path, capsys, monkeypatch,
                                                         pinned_wheel: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copy(pinned_wheel, cache / "wheels" / pinned_wheel.name)
    monkeypatch.setenv("PATCHSET_CACHE", str(cache))
    code, _, err = init(capsys, str(tmp_path / "s"), "--pin", "sglang==0.5.14", "--offline")
    assert code == Exit.OK, err
    pin = load_series(tmp_path / "s" / "patches.yaml").upstream
    assert pin.pypi == load_series(ROOT / "patches.yaml").upstream.pypi
    code, _, err = init(capsys, str(tmp_path / "t"), "--pin", "sglang==0.5.13", "--offline")
    assert code != Exit.OK and "offline" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t" / "patches.yaml").exists()


def fork(tmp_path: Path, version: str = "0.5.14") -> tuple[Path, str]:
    repo = tmp_path / "upstream"
    pkg = repo / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    env = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u",
           "GIT_COMMITTER_EMAIL": "u@x", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout.strip()
    return repo, commit


def test_a_git_commit_is_pinned_with_its_layout_and_version(tmp_path: Path, capsys,
                                                            monkeypatch) -> None:
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    repo, commit = fork(tmp_path)
    code, out, err = init(capsys, str(tmp_path / "s"), "--git", f"file://{repo}", "--ref",
                          "main", "--json")
    assert code == Exit.OK, err
    pin = load_series(tmp_path / "s" / "patches.yaml").upstream
    assert pin.git.ref == commit and pin.git_prefix == "python/" and pin.pypi is None
    assert pin.version == f"0.5.14+g{commit[:12]}" and json.loads(out)["how"] == "git commit"
    monkeypatch.chdir(tmp_path / "s")
    assert main(["check"]) == Exit.OK


def test_a_branch_is_pinned_at_its_commit_now_not_at_a_cached_one(tmp_path: Path, capsys,
                                                                  monkeypatch) -> None:
    """The tree of a ref is cached under the ref: a second init of a branch that moved
    upstream must pin where it is now (it pinned the cached, older commit)."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    repo, first = fork(tmp_path)
    url = f"file://{repo}"
    assert init(capsys, str(tmp_path / "a"), "--git", url, "--ref", "main")[0] == Exit.OK
    env = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u",
           "GIT_COMMITTER_EMAIL": "u@x", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "moved"], cwd=repo, env=env,
                   check=True)
    moved = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert init(capsys, str(tmp_path / "b"), "--git", url, "--ref", "main")[0] == Exit.OK
    assert load_series(tmp_path / "a" / "patches.yaml").upstream.git.ref == first
    assert load_series(tmp_path / "b" / "patches.yaml").upstream.git.ref == moved != first


@pytest.mark.parametrize("argv, words", [
    (["--pin", "sglang>=0.5"], "--pin"),
    (["--pin", "--index-url=http://evil"], "--pin"),
    (["--pin", "sglang==0.5.14", "--git", "https://github.com/x/y.git"], "one or the other"),
    (["--git", "ext::sh -c touch% /tmp/pwned", "--ref", "main"], "--git"),
    (["--git", "https://github.com/x/y.git", "--ref", "-x"], "--ref"),
    ([], "--pin NAME==VERSION"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path: Path, capsys, argv,
                                                          words) -> None:
    code, _, err = init(capsys, str(tmp_path / "s"), *argv)
    assert code == Exit.BAD_INPUT and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s" / "patches.yaml").exists()


def test_an_existing_manifest_is_never_overwritten(tmp_path: Path, capsys) -> None:
    (tmp_path / "patches.yaml").write_text("hand written\n")
    code, _, err = init(capsys, str(tmp_path), "--pin", "sglang==0.5.14", "--offline")
    assert code == Exit.BAD_INPUT and "already exists" in err
    assert (tmp_path / "patches.yaml").read_text() == "hand written\n"
    (tmp_path / "patches.yaml").unlink()
    (tmp_path / "patches.yaml").symlink_to(tmp_path / "elsewhere")     # a dangling link too
    code, _, err = init(capsys, str(tmp_path), "--pin", "sglang==0.5.14", "--offline")
    assert code == Exit.BAD_INPUT and not (tmp_path / "elsewhere").exists()


def test_a_directory_that_cannot_hold_it_is_one_line_exit_2(tmp_path: Path, capsys,
                                                            pinned_wheel: Path,
                                                            monkeypatch) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copy(pinned_wheel, cache / "wheels" / pinned_wheel.name)
    monkeypatch.setenv("PATCHSET_CACHE", str(cache))
    (tmp_path / "afile").write_text("x\n")
    code, _, err = init(capsys, str(tmp_path / "afile" / "s"), "--pin", "sglang==0.5.14",
                        "--offline")
    assert code == Exit.BAD_INPUT and "cannot write the new series" in err
    assert len(err.strip().splitlines()) == 1 and (tmp_path / "afile").read_text() == "x\n"


@pytest.mark.parametrize("kind", ["file", "dangling link", "link to a directory", "fifo"])
def test_a_patches_that_is_not_a_real_directory_is_refused_before_anything_is_written(
        tmp_path: Path, capsys, monkeypatch, kind: str) -> None:
    """`patches` is looked at before the manifest is written: exit 2 naming it, and the
    directory holds what it held (a re-run fails the same way, not "already exists")."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    repo, _ = fork(tmp_path)
    series = tmp_path / "s"
    series.mkdir()
    patches = series / "patches"
    if kind == "file":
        patches.write_text("not a directory\n")
    elif kind == "dangling link":
        patches.symlink_to(tmp_path / "nowhere")
    elif kind == "link to a directory":
        (tmp_path / "elsewhere").mkdir()
        patches.symlink_to(tmp_path / "elsewhere")
    else:
        os.mkfifo(patches)
    for _ in range(2):
        code, _, err = init(capsys, str(series), "--git", f"file://{repo}", "--ref", "main")
        assert code == Exit.BAD_INPUT and f"{patches}: exists and is not a directory" in err
        assert len(err.strip().splitlines()) == 1
        assert sorted(os.listdir(series)) == ["patches"]
    assert not (tmp_path / "nowhere").exists()
    assert kind != "link to a directory" or not os.listdir(tmp_path / "elsewhere")


def test_a_failure_while_writing_leaves_nothing_behind(tmp_path: Path, capsys,
                                                       monkeypatch) -> None:
    """The manifest's link is the last step; when it fails, patches/, the staged file and
    the directories init created are gone again."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    repo, _ = fork(tmp_path)

    def refuse(*_args, **_kw):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(os, "link", refuse)
    code, _, err = init(capsys, str(tmp_path / "new" / "s"), "--git", f"file://{repo}",
                        "--ref", "main")
    assert code == Exit.BAD_INPUT and "Read-only file system" in err
    assert not (tmp_path / "new").exists()
    (tmp_path / "t").mkdir()
    code, _, err = init(capsys, str(tmp_path / "t"), "--git", f"file://{repo}", "--ref", "main")
    assert code == Exit.BAD_INPUT and os.listdir(tmp_path / "t") == []
    monkeypatch.undo()
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    code, _, err = init(capsys, str(tmp_path / "t"), "--git", f"file://{repo}", "--ref", "main")
    assert code == Exit.OK, err
    assert sorted(os.listdir(tmp_path / "t")) == ["patches", "patches.yaml"]


@pytest.mark.parametrize("flag, value", [
    ("--platform", "-x"), ("--platform", "a b"), ("--platform", "--index-url=http://evil"),
    ("--python-version", "../../x"), ("--python-version", "3"), ("--python-version", "-3.11"),
])
def test_a_bad_python_version_or_platform_is_exit_2_before_the_network(
        tmp_path: Path, capsys, monkeypatch, flag: str, value: str) -> None:
    """Their form is checked up front (offline, an unchecked value gave exit 4 'not
    fetched'; online it would have reached pip): exit 2 naming the flag, nothing written."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    code, _, err = init(capsys, str(tmp_path / "s"), "--pin", "sglang==0.5.14", "--offline",
                        f"{flag}={value}")
    assert code == Exit.BAD_INPUT and flag in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "s").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("platform", ["x86_64", "manylinux_2_34", "linux"])
def test_offline_a_cached_wheel_is_taken_only_for_its_exact_platform_tag(
        tmp_path: Path, capsys, monkeypatch, pinned_wheel: Path, platform: str) -> None:
    """A part of the wheel's platform tag is not that platform: the manylinux_2_34_x86_64
    wheel is never pinned (and recorded) as the wheel for `--platform x86_64`."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copy(pinned_wheel, cache / "wheels" / pinned_wheel.name)
    monkeypatch.setenv("PATCHSET_CACHE", str(cache))
    code, _, err = init(capsys, str(tmp_path / "s"), "--pin", "sglang==0.5.14", "--offline",
                        "--platform", platform)
    assert code != Exit.OK and "offline" in err, err
    assert not (tmp_path / "s").exists() and not list((cache / "tofu").glob("*.json"))


def test_wheel_tags_are_compared_whole() -> None:
    from patchset.pin.model import PypiPin
    from patchset.pin.upstream import _wheel_fits
    want = PypiPin("sglang==0.5.14", "", "", "3.11", "manylinux_2_34_x86_64")
    fits = ["sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl",
            "sglang-0.5.14-1-cp311-cp311-manylinux_2_34_x86_64.whl",
            "sglang-0.5.14-cp311-cp311-manylinux_2_17_x86_64.manylinux_2_34_x86_64.whl",
            "sglang-0.5.14-py3-none-any.whl"]
    misfits = ["sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64_extra.whl",
               "sglang-0.5.14-cp311-cp311-x_manylinux_2_34_x86_64.whl",
               "sglang-0.5.14-cp312-cp312-manylinux_2_34_x86_64.whl",
               "sglang-0.5.140-cp311-cp311-manylinux_2_34_x86_64.whl",
               "sglang_router-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl",
               "sglang-0.5.14-cp311-manylinux_2_34_x86_64.whl"]
    assert [f for f in fits if _wheel_fits(f, "sglang", "0.5.14", want)] == fits
    assert [f for f in misfits if _wheel_fits(f, "sglang", "0.5.14", want)] == []


def test_a_ref_upstream_does_not_have_is_exit_2_and_no_answer_is_exit_3(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """The repository answered "no such ref": bad input naming --ref (was exit 4 with
    a message about the network and a pypi fallback); no answer at all: exit 3."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    repo, _ = fork(tmp_path)
    for ref, words in (("nosuch", "no such branch, tag or commit"),
                       ("0" * 40, "no such commit")):
        code, _, err = init(capsys, str(tmp_path / "s"), "--git", f"file://{repo}", "--ref", ref)
        err = "".join(ln for ln in err.splitlines(True) if not ln.rstrip().endswith("..."))
        assert code == Exit.BAD_INPUT and len(err.strip().splitlines()) == 1, err
        assert f"--ref {ref!r}: {words} at file://{repo}" in err
    code, _, err = init(capsys, str(tmp_path / "s"), "--git", f"file://{tmp_path}/nowhere",
                        "--ref", "main")
    err = "".join(ln for ln in err.splitlines(True) if not ln.rstrip().endswith("..."))
    assert code == Exit.UNREACHABLE and len(err.strip().splitlines()) == 1, err
    assert f"cannot reach file://{tmp_path}/nowhere" in err and "does not appear" in err
    assert not (tmp_path / "s").exists()
