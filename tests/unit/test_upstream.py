"""Provisioning the pinned upstream: determinism, offline use, verification, git path,
fallback, concurrency and materialized layouts. Uses the real 0.5.14 wheel."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from patchset.pin import upstream
from patchset.errors import Unreachable, UpstreamError
from patchset.pin.model import GitPin, UpstreamPin
from patchset.pin.upstream import BaseTree, blob_ids, materialize, provision

# The wheel is fixed by its sha256, so the commit built from it is fixed too.
WHEEL_COMMIT = "3570f4785cd75e96190ef2c0ee13fc29f2445e98"
DSV4 = "sglang/srt/models/deepseek_v4.py"
ROOT = Path(__file__).resolve().parents[2]


class RecordingProgress:
    """Progress that records (description, total, advanced) per task."""

    def __init__(self) -> None:
        self.tasks: list[list] = []

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        record = [description, total, 0]
        self.tasks.append(record)

        def advance(n: int) -> None:
            record[2] += n

        yield advance


def git(cwd: Path, *args: str) -> str:
    """Run git in cwd, free of the caller's GIT_* environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    out = subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def blob_id(data: bytes) -> str:
    """Git blob id of some bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def wheel_only(pin: UpstreamPin) -> UpstreamPin:
    """The pin without git, so the wheel path is taken on any machine."""
    return dataclasses.replace(pin, git=None)


def seeded_cache(tmp: Path, wheel: Path) -> Path:
    """A fresh cache dir holding a private copy of the verified wheel (the shared one is
    never touched)."""
    (tmp / "wheels").mkdir(parents=True)
    shutil.copyfile(wheel, tmp / "wheels" / wheel.name)
    return tmp


def hostile_env(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    """Environment and git config that would change a naive commit id or checkout."""
    home = tmp / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Someone\n[core]\n\tautocrlf = true\n"
        "[init]\n\tdefaultBranch = trunk\n[i18n]\n\tcommitEncoding = latin1\n"
    )
    for key, value in {
        "HOME": str(home),
        "GIT_AUTHOR_NAME": "x",
        "GIT_COMMITTER_DATE": "2001-01-01",
        "GIT_DIR": str(tmp / "nowhere"),
        "GIT_INDEX_FILE": str(tmp / "idx"),
        "TZ": "Asia/Tokyo",
        "LANG": "de_DE.UTF-8",
        "LC_ALL": "de_DE.UTF-8",
    }.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def wheel_build(
    pinned_pin: UpstreamPin, pinned_wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[BaseTree, RecordingProgress]:
    """The pin built from the wheel alone in a private cache, with its progress record."""
    progress = RecordingProgress()
    cache = seeded_cache(tmp_path_factory.mktemp("wheel-build"), pinned_wheel)
    return provision(wheel_only(pinned_pin), cache=cache, progress=progress, offline=True), progress


def test_wheel_commit_is_deterministic_across_caches_and_environments(
    wheel_build: tuple[BaseTree, RecordingProgress],
    pinned_pin: UpstreamPin,
    pinned_wheel: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, _progress = wheel_build
    hostile_env(monkeypatch, tmp_path)
    old_umask = os.umask(0o077)
    try:
        second = provision(
            wheel_only(pinned_pin), cache=seeded_cache(tmp_path / "b", pinned_wheel), offline=True
        )
    finally:
        os.umask(old_umask)
    assert first.commit == second.commit == WHEEL_COMMIT
    assert (first.source, first.ref) == ("pypi", "patchset/base/sglang-0.5.14")
    assert first.repo != second.repo


def test_wheel_commit_holds_exactly_the_wheel_files(
    wheel_build: tuple[BaseTree, RecordingProgress], pinned_pin: UpstreamPin, pinned_wheel: Path
) -> None:
    base, progress = wheel_build
    tree = {}
    for line in git(base.repo, "ls-tree", "-r", base.commit).splitlines():
        meta, path = line.split("\t", 1)
        mode, _kind, oid = meta.split()
        tree[path] = (mode, oid)
    expected = {}
    with zipfile.ZipFile(pinned_wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or info.filename.split("/")[0].endswith(".dist-info"):
                continue
            mode = "100755" if (info.external_attr >> 16) & 0o111 else "100644"
            expected["python/" + info.filename] = (mode, blob_id(zf.read(info)))
    assert tree == expected
    assert git(base.repo, "status", "--porcelain") == ""
    assert git(base.repo, "log", "-1", "--format=%an <%ae> %at %s", base.commit) == (
        "patchset <patchset@invalid> 1782447798 sglang 0.5.14 from"
        f" {pinned_wheel.name} sha256 {pinned_pin.pypi.sha256}"
    )
    unpack = [t for t in progress.tasks if t[0].startswith("unpack ")]
    verify = [t for t in progress.tasks if t[0].startswith("verify ")]
    assert unpack[0][1] == unpack[0][2] == len(expected)
    assert verify[0][1] == verify[0][2] == pinned_wheel.stat().st_size


def test_cached_pin_needs_no_network(
    pinned_pin: UpstreamPin, pinned_base: BaseTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("network used for a cached pin")

    monkeypatch.setattr(upstream, "_pip_download", no_network)
    monkeypatch.setattr(upstream, "_from_git", no_network)
    started = time.monotonic()
    assert provision(pinned_pin) == pinned_base
    assert provision(pinned_pin, offline=True) == pinned_base
    assert time.monotonic() - started < 1.0


def test_offline_without_cache_says_so(pinned_pin: UpstreamPin, tmp_path: Path) -> None:
    with pytest.raises(
        UpstreamError, match=r"offline and .*\.whl is not in .*run once with network"
    ):
        provision(pinned_pin, cache=tmp_path, offline=True)
    assert not (tmp_path / "repos").exists() or not any((tmp_path / "repos").iterdir())


def test_sha256_mismatch_is_reported_and_the_cached_file_kept(
    pinned_pin: UpstreamPin, pinned_wheel: Path, tmp_path: Path
) -> None:
    """A pin that disagrees with the cached wheel is refused (exit 2, both hashes); the
    good file is kept (it used to be deleted) and nothing is added to the cache."""
    bad = "0" * 64
    pin = dataclasses.replace(
        wheel_only(pinned_pin), pypi=dataclasses.replace(pinned_pin.pypi, sha256=bad)
    )
    cache = seeded_cache(tmp_path, pinned_wheel)
    with pytest.raises(UpstreamError) as err:
        provision(pin, cache=cache, offline=True)
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 2
    assert (
        f"the pin says {bad}, the cached file is {pinned_pin.pypi.sha256}" in message
        and pinned_wheel.name in message
    )
    assert (cache / "wheels" / pinned_wheel.name).read_bytes() == pinned_wheel.read_bytes()
    assert sorted(p.name for p in cache.iterdir()) == ["wheels"]


def fake_pip(tmp_path: Path, body: str) -> tuple[str, ...]:
    """A pip stand-in: a script run as `python script download ... -d DIR req`."""
    script = tmp_path / "fake_pip.py"
    script.write_text(
        "import shutil, sys\nargs = sys.argv[1:]\ndest = args[args.index('-d') + 1]\n" + body
    )
    return (sys.executable, str(script))


def test_download_goes_through_pip_and_is_verified(
    pinned_pin: UpstreamPin, pinned_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        upstream, "PIP", fake_pip(tmp_path, f"shutil.copy({str(pinned_wheel)!r}, dest)\n")
    )
    cache = tmp_path / "cache"
    base = provision(wheel_only(pinned_pin), cache=cache)
    assert base.commit == WHEEL_COMMIT
    assert (cache / "wheels" / pinned_wheel.name).exists()
    assert not any((cache / "tmp").iterdir())


def test_corrupt_download_never_enters_the_cache(
    pinned_pin: UpstreamPin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = pinned_pin.pypi.file
    monkeypatch.setattr(
        upstream, "PIP", fake_pip(tmp_path, f"open(dest + '/{name}', 'wb').write(b'junk')\n")
    )
    with pytest.raises(UpstreamError, match=f"sha256 mismatch for .*{name}: expected"):
        provision(wheel_only(pinned_pin), cache=tmp_path / "cache")
    assert not (tmp_path / "cache" / "wheels" / name).exists()


@pytest.mark.parametrize(
    ("pip", "pattern"),
    [
        (
            ("/nonexistent/python",),
            r"cannot run pip \(/nonexistent/python\).*install pip or copy the wheel",
        ),
        (None, r"pip download sglang==0.5.14 failed: ERROR: no such index; check the network"),
    ],
)
def test_pip_failures_are_one_line_errors(
    pinned_pin: UpstreamPin,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pip: tuple[str, ...] | None,
    pattern: str,
) -> None:
    failing = fake_pip(tmp_path, "sys.stderr.write('ERROR: no such index\\n'); sys.exit(1)\n")
    monkeypatch.setattr(upstream, "PIP", pip or failing)
    with pytest.raises(UpstreamError, match=pattern) as err:
        provision(wheel_only(pinned_pin), cache=tmp_path / "cache")
    assert "\n" not in str(err.value)


def make_bare_upstream(tmp_path: Path) -> tuple[Path, str]:
    """A bare repo shaped like sglang's (python/sglang/...) with an annotated tag v0.5.14."""
    work = tmp_path / "upstream-work"
    (work / "python" / "sglang" / "srt" / "models").mkdir(parents=True)
    (work / "python" / "sglang" / "srt" / "models" / "deepseek_v4.py").write_text("x = 1\n")
    (work / "README.md").write_text("upstream\n")
    (work / "python" / ".gitattributes").write_text(
        "*.py export-subst ident text eol=crlf\n*.txt export-ignore\n"
    )
    (work / "python" / "sglang" / "version.py").write_text("commit = '$Format:%H$'  # $Id$\n")
    (work / "python" / "sglang" / "notes.txt").write_text("kept\n")
    git(tmp_path, "init", "-q", str(work))
    git(work, "add", ".")
    git(work, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "release")
    git(work, "-c", "user.name=u", "-c", "user.email=u@x", "tag", "-a", "v0.5.14", "-m", "v0.5.14")
    (work / "README.md").write_text("later\n")
    git(work, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qam", "after the tag")
    bare = tmp_path / "upstream.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    return bare, git(work, "rev-parse", "v0.5.14^{commit}")


def test_git_path_uses_upstreams_commit(pinned_pin: UpstreamPin, tmp_path: Path) -> None:
    bare, tagged = make_bare_upstream(tmp_path)
    pin = dataclasses.replace(pinned_pin, git=GitPin(url=bare.as_uri(), ref="v0.5.14"), pypi=None)
    base = provision(pin, cache=tmp_path / "cache")
    assert (base.commit, base.source) == (tagged, "git")
    assert git(base.repo, "rev-parse", f"{base.ref}^{{commit}}") == tagged
    assert (base.repo / "python" / DSV4).read_text() == "x = 1\n"
    assert git(base.repo, "status", "--porcelain") == ""
    assert provision(pin, cache=tmp_path / "cache", offline=True) == base
    flat = materialize(base, tmp_path / "flat", layout="wheel")  # blob bytes, attributes ignored
    assert sorted(p.name for p in (flat / "sglang").iterdir()) == ["notes.txt", "srt", "version.py"]
    assert (flat / "sglang" / "version.py").read_bytes() == b"commit = '$Format:%H$'  # $Id$\n"


def test_git_path_accepts_a_commit_id_as_ref(pinned_pin: UpstreamPin, tmp_path: Path) -> None:
    bare, tagged = make_bare_upstream(tmp_path)
    pin = dataclasses.replace(pinned_pin, git=GitPin(url=bare.as_uri(), ref=tagged), pypi=None)
    assert provision(pin, cache=tmp_path / "cache").commit == tagged


def test_unreachable_git_falls_back_to_the_wheel_fast(
    pinned_pin: UpstreamPin, pinned_wheel: Path, tmp_path: Path
) -> None:
    pin = dataclasses.replace(
        pinned_pin, git=GitPin(url="https://127.0.0.1:9/x.git", ref="v0.5.14")
    )
    started = time.monotonic()
    base = provision(pin, cache=seeded_cache(tmp_path, pinned_wheel))
    assert time.monotonic() - started < upstream.GIT_PROBE_TIMEOUT_S
    assert (base.source, base.commit) == ("pypi", WHEEL_COMMIT)
    meta = json.loads((base.repo / ".git" / upstream.META_FILE).read_text())
    assert "127.0.0.1:9" in meta["fallback_reason"]


def test_unreachable_git_without_pypi_is_an_error(pinned_pin: UpstreamPin, tmp_path: Path) -> None:
    pin = dataclasses.replace(
        pinned_pin, git=GitPin(url="https://127.0.0.1:9/x.git", ref="v0.5.14"), pypi=None
    )
    with pytest.raises(Unreachable, match=r"cannot reach https://127.0.0.1:9/x.git \(git "
                       r"ls-remote: .*\); check the url"):      # exit 3: no answer
        provision(pin, cache=tmp_path)


def test_concurrent_provisions_build_once_and_agree(
    pinned_pin: UpstreamPin, pinned_wheel: Path, tmp_path: Path
) -> None:
    cache = seeded_cache(tmp_path / "cache", pinned_wheel)
    code = (
        "import json, sys; from patchset.pin.upstream import provision; from patchset.pin.model import *;"
        "pin = eval(sys.argv[1]); print(provision(pin, cache=sys.argv[2], offline=True).commit)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, repr(wheel_only(pinned_pin)), str(cache)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert [out.strip() for out, _err in results] == [WHEEL_COMMIT, WHEEL_COMMIT], results
    assert len(list((cache / "repos").iterdir())) == 1
    assert not any((cache / "tmp").iterdir())


def test_materialize_git_layout(
    pinned_base: BaseTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import git as gitpython

    dest = materialize(pinned_base, tmp_path / "tree")
    path = f"python/{DSV4}"
    assert git(dest, "rev-parse", "HEAD") == pinned_base.commit
    assert git(dest, "status", "--porcelain") == ""
    expected = (gitpython.Repo(pinned_base.repo).commit(pinned_base.commit).tree / path).hexsha
    assert blob_ids(pinned_base, [path, "python/missing.py"]) == {
        path: expected,
        "python/missing.py": None,
    }
    assert git(dest, "hash-object", path) == expected == blob_id((dest / path).read_bytes())
    monkeypatch.setenv("HOME", str(tmp_path))  # no global identity: the local one must do
    (dest / path).write_text("changed\n")
    git(dest, "commit", "-qam", "a patch")
    assert git(dest, "rev-parse", "HEAD^") == pinned_base.commit


def test_materialize_wheel_layout(pinned_base: BaseTree, tmp_path: Path) -> None:
    wheel_dest = materialize(pinned_base, tmp_path / "wheel-tree", layout="wheel")
    assert not (wheel_dest / ".git").exists() and not (wheel_dest / "python").exists()
    assert (wheel_dest / "sglang" / "__init__.py").exists()
    data = (wheel_dest / DSV4).read_bytes()
    assert blob_id(data) == blob_ids(pinned_base, [f"python/{DSV4}"])[f"python/{DSV4}"]
    executable = git(
        pinned_base.repo, "ls-tree", "-r", pinned_base.commit, "python/sglang/srt/layers/"
    )
    for line in executable.splitlines():
        mode, path = line.split()[0], line.split("\t", 1)[1]
        assert os.access(wheel_dest / path.removeprefix("python/"), os.X_OK) == (mode == "100755")


def test_materialize_refuses_a_non_empty_dest_and_accepts_an_empty_one(
    pinned_base: BaseTree, tmp_path: Path
) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine\n")
    with pytest.raises(UpstreamError, match=r"full exists and is not empty"):
        materialize(pinned_base, tmp_path / "full", layout="wheel")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert (materialize(pinned_base, tmp_path / "empty", layout="wheel") / DSV4).exists()
    with pytest.raises(UpstreamError, match=r"unknown layout 'zip'; use one of: git, wheel"):
        materialize(pinned_base, tmp_path / "other", layout="zip")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full"]


def test_cache_root_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "explicit"))
    assert upstream.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("PATCHSET_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert upstream.cache_root() == tmp_path / "xdg" / "patchset"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert upstream.cache_root() == tmp_path / ".cache" / "patchset"


def test_importing_upstream_does_not_import_git() -> None:
    code = "import sys, patchset.pin.upstream; print('git' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"
