"""Hostile pins and patches, through the CLI and at the git/pip call sites.

6. A git url or ref, or a pip requirement, can never become an option: refused at load
   (`file:line: upstream.FIELD`, exit 2) and, with the loader bypassed, still unable to
   reach git or pip as one (`--`, glued flags). A planted command never runs.
7. Pin trust: a sha256 the cached wheel disagrees with is refused with both hashes and the
   good file kept; no cached base, default tree or bundle made for another pin is used.
8. A patch that does not apply: one refusal, one exit code (4) from `plan`, `apply
   --dry-run` and `apply` (a finding, 1, from `check`), scratch state gone at once, and
   blob ids long enough to differ.

Every case asserts the exit code, one error line of the documented shape, no traceback,
and byte-identical tree, state, manifest and cache. The real ~/.cache/patchset is only
read through the shared fixtures (pinned_base, pinned_wheel); every cache a command here
may write is a tmp dir (PATCHSET_CACHE), and PATCHSET_HOME is per test.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from patchset.agent.lib.records import BaseSource, GitSource
from patchset.pin import pinrules, upstream
from patchset.agent import engine
from patchset.agent.lib import wire
from patchset.cli import main
from patchset.errors import UpstreamError, UsageError
from patchset.pin.model import GitPin
from patchset.progress import NullProgress
from tests.seriesfactory import CHAT, INDEXER

MARK = "pwned"   # the file a planted command would create


# ---------------------------------------------------------------- helpers

def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    """stderr holds exactly one non-progress line, and no traceback."""
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.endswith(" ...")]
    assert len(lines) == 1, err
    return lines[0]


# .git/index is git's stat cache (any `git status` may refresh it); the lock files are
# the target's lock, taken by every locked op (also a dry run) and never removed.
SKIP = {".git/index", ".patchset", ".patchset/lock", ".patchset/lock.json"}


def snapshot(root: Path) -> dict[str, str]:
    """Every file's sha256 (and every dir and link) under `root`."""
    if not root.exists():
        return {"(absent)": ""}
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel in SKIP:
            continue
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def line_of(manifest: Path, needle: str) -> int:
    return next(n for n, text in enumerate(manifest.read_text().split("\n"), 1)
                if needle in text)


def set_pin(manifest: Path, section: str | None, key: str, value) -> None:
    data = yaml.safe_load(manifest.read_text())
    (data["upstream"][section] if section else data["upstream"])[key] = value
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture()
def env(series_dir: Path, patchset_home: Path, tmp_path: Path, monkeypatch) -> dict:
    """cwd = a series; a private empty cache and home; the planted marker's path."""
    monkeypatch.chdir(series_dir)
    cache = tmp_path / "cache"
    monkeypatch.setenv("PATCHSET_CACHE", str(cache))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))   # leftovers would show here
    return {"series": series_dir, "manifest": series_dir / "patches.yaml", "cache": cache,
            "home": patchset_home, "mark": tmp_path / MARK, "scratch": scratch,
            "tmp": tmp_path}


def planted(value, mark: Path):
    return value.replace("{m}", str(mark)) if isinstance(value, str) else value


# ---------------------------------------------------------------- 6. never an option

URLS = [
    ("upload-pack", "--upload-pack=touch {m}"),
    ("upload-pack-short", "-utouch {m}"),
    ("config", "--config=core.sshCommand=touch {m}"),
    ("proxycommand", "-oProxyCommand=touch {m}"),
    ("ssh-host-option", "ssh://-oProxyCommand=touch%20{m}/x.git"),
    ("ssh-user-option", "ssh://-oProxyCommand=touch@host/x.git"),
    ("ssh-no-path", "ssh://host"),
    ("scp-host-option", "-oProxyCommand=touch:x.git"),
    ("scp-user-host-option", "git@-oProxyCommand=touch:x.git"),
    ("scp-path-option", "host:--upload-pack=touch {m}"),
    ("ext-helper", "ext::sh -c touch% {m}"),
    ("ext-helper-no-space", "ext::/usr/bin/touch"),
    ("fd-helper", "fd::17"),
    ("host-helper", "host::x"),
    ("newline-then-option", "https://github.com/sgl-project/sglang.git\n--upload-pack=touch {m}"),
    ("trailing-newline", "https://github.com/sgl-project/sglang.git\n"),
    ("carriage-return", "https://github.com/x\r"),
    ("nul", "https://github.com/\x00x"),
    ("line-separator", "https://github.com/x\u2028y"),
    ("escaped-newline", "https://github.com/x%0a--upload-pack=touch"),
    ("space", "https://github.com/x y.git"),
    ("shell-meta", "https://github.com/x;touch {m}"),
    ("backquote", "https://github.com/`touch {m}`"),
    ("quote", "https://github.com/x'"),
    ("query", "https://github.com/x.git?upload-pack=touch"),
    ("relative-path", "relative/repo.git"),
    ("dot-path", "./repo.git"),
    ("unknown-scheme", "ftp://host/x.git"),
    ("file-with-host", "file://host/x.git"),
    ("empty", ""),
    ("number", 12),
    ("list", ["https://github.com/x"]),
]
REFS = [
    ("output", "--output={m}"),
    ("upload-pack", "--upload-pack=touch {m}"),
    ("short-option", "-c"),
    ("force-refspec", "+refs/heads/x:refs/heads/y"),
    ("refspec", "v0.5.14:refs/heads/main"),
    ("glob", "refs/*"),
    ("newline-then-option", "v0.5.14\n--output={m}"),
    ("trailing-newline", "v0.5.14\n"),
    ("tab", "v0.5.14\t"),
    ("dotdot", "v0.5..14"),
    ("lock", "v0.5.14.lock"),
    ("at", "@"),
    ("reflog", "main@{1}"),
    ("negative", "^v0.5.14"),
    ("tilde", "v0.5.14~1"),
    ("caret", "v0.5.14^{}"),
    ("bracket", "v[0]"),
    ("backslash", "v0\\5"),
    ("hidden", ".hidden"),
    ("empty-component", "refs//tags/x"),
    ("trailing-slash", "refs/tags/"),
    ("trailing-dot", "v0.5."),
    ("space", "v 0.5.14"),
    ("empty", ""),
    ("number", 5),
]
REQUIREMENTS = [
    ("index-url", "--index-url=file://{m}"),
    ("requirements-file", "-r{m}"),
    ("log", "--log={m}"),
    ("editable", "-e git+https://github.com/x"),
    ("trailing-option", "sglang==0.5.14 --pre"),
    ("index-option", "sglang==0.5.14 -i http://evil.invalid"),
    ("newline-then-option", "sglang==0.5.14\n--log={m}"),
    ("trailing-newline", "sglang==0.5.14\n"),
    ("no-version", "sglang"),
    ("range", "sglang>=0.5.14"),
    ("arbitrary-equality", "sglang===0.5.14"),
    ("url", "sglang @ file://{m}"),
    ("bare-url", "https://evil.invalid/sglang-0.5.14-py3-none-any.whl"),
    ("extras", "sglang[all]==0.5.14"),
    ("marker", "sglang==0.5.14; python_version>'3'"),
    ("local-path", "./sglang"),
    ("negative-version", "sglang==-1"),
    ("space", "sglang == 0.5.14"),
    ("empty", ""),
]
CASES = ([("git", "url", *c) for c in URLS] + [("git", "ref", *c) for c in REFS]
         + [("pypi", "requirement", *c) for c in REQUIREMENTS])

COMMANDS = [
    ("check",),
    ("check", "--offline"),
    ("provision",),
    ("plan", "--tier", "safe", "localhost"),
    ("apply", "--tier", "safe", "localhost"),
    ("apply", "--dry-run", "--tier", "safe", "localhost"),
    ("status",),
    ("rebase", "--onto", "0.5.15", "--dry-run"),
]


@pytest.mark.parametrize(("section", "key", "case", "value"), CASES,
                         ids=[f"{s}.{k}-{c}" for s, k, c, _ in CASES])
def test_hostile_pin_value_is_refused_at_load_by_every_command(env, capsys, section, key,
                                                                case, value) -> None:
    manifest = env["manifest"]
    set_pin(manifest, section, key, planted(value, env["mark"]))
    line = line_of(manifest, f"{key}:")
    before = manifest.read_bytes()
    shape = re.compile(rf"patchset: error: patches\.yaml:{line}: upstream\.{section}\.{key}: "
                       r"\S.*")
    for argv in COMMANDS:
        code, out, err = run(capsys, *argv)
        message = one_line(err)
        assert code == 2, (argv, err)
        assert shape.fullmatch(message), (argv, message)
        assert out == ""
    assert not env["mark"].exists()
    assert manifest.read_bytes() == before
    assert not env["cache"].exists() and not env["home"].exists()
    assert not any(env["scratch"].iterdir())


def test_valid_pin_forms_load(env, capsys) -> None:
    """The documented forms are accepted (the refusals above are not blanket ones)."""
    from patchset.series.manifest import load_series
    manifest = env["manifest"]
    for url in ("https://github.com/sgl-project/sglang.git", "http://mirror.local:8080/s.git",
                "ssh://git@github.com/sgl-project/sglang.git", "ssh://host:2222/srv/s.git",
                "git://mirror.local/sglang.git", "file:///srv/git/sglang.git",
                "git@github.com:sgl-project/sglang.git", "mirror:sglang.git",
                "/srv/git/sglang.git", "https://[::1]:8443/sglang.git"):
        set_pin(manifest, "git", "url", url)
        assert load_series(manifest).upstream.git.url == url
    for ref in ("v0.5.14", "main", "refs/tags/v0.5.14", "release/0.5", "v1.0+local",
                "3570f4785cd75e96190ef2c0ee13fc29f2445e98"):
        set_pin(manifest, "git", "ref", ref)
        assert load_series(manifest).upstream.git.ref == ref
    for req in ("sglang==0.5.14", "sglang==0.5.15rc1", "sglang==0.5.14.post1",
                "Sg_Lang.x==1!2.0.dev3+local.1"):
        set_pin(manifest, "pypi", "requirement", req)
        assert load_series(manifest).upstream.pypi.requirement == req


def control_repo(tmp: Path) -> Path:
    """A local repo with a tag, for the git call sites."""
    repo = tmp / "upstream"
    (repo / "python" / "sglang").mkdir(parents=True)
    (repo / "python" / "sglang" / "x.py").write_text("x = 1\n")
    for args in (("init", "-q"), ("add", "."),
                 ("-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "r"),
                 ("tag", "v0.5.14")):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def test_the_planted_commands_are_real(tmp_path: Path) -> None:
    """Control: without `--`, git and pip do run what these values plant."""
    mark = tmp_path / MARK
    subprocess.run(["git", "ls-remote", f"--upload-pack=touch {mark}", str(tmp_path / "r")],
                   capture_output=True)
    assert mark.exists()
    log = tmp_path / "pip.log"
    subprocess.run([*upstream.PIP, "download", "--no-index", "-d", str(tmp_path / "d"),
                    f"--log={log}"], capture_output=True)
    assert log.exists()


@pytest.mark.parametrize("url", ["--upload-pack=touch {m}", "-utouch {m}",
                                 "--config=protocol.ext.allow=always",
                                 "ext::sh -c touch% {m}"])
def test_git_url_after_double_dash_never_runs_a_command(tmp_path: Path, pinned_pin,
                                                        monkeypatch, url) -> None:
    """The loader and runtime checks bypassed: `_from_git` still gives git the url as a
    repository (after `--`, remote helpers not allowed), so nothing runs."""
    mark = tmp_path / MARK
    monkeypatch.setattr(pinrules, "runtime_check", lambda pin: None)
    work = tmp_path / "work"
    work.mkdir()
    gp = GitPin(url=planted(url, mark), ref="v0.5.14")
    with pytest.raises(UpstreamError) as err:
        upstream._from_git(pinned_pin, gp, work, NullProgress())
    assert "\n" not in str(err.value)
    assert not mark.exists()


@pytest.mark.parametrize("ref", ["--upload-pack=touch {m}", "--output={m}", "-utouch {m}"])
def test_git_ref_after_double_dash_never_runs_a_command(tmp_path: Path, pinned_pin,
                                                        ref) -> None:
    mark = tmp_path / MARK
    repo = control_repo(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    gp = GitPin(url=repo.as_uri(), ref=planted(ref, mark))
    with pytest.raises(upstream.MissingRef):       # a ref pattern git found no ref for
        upstream._from_git(pinned_pin, gp, work, NullProgress())
    assert not mark.exists()


def test_a_code_built_hostile_pin_is_refused_before_the_cache_is_touched(
        tmp_path: Path, pinned_pin) -> None:
    mark = tmp_path / MARK
    cache = tmp_path / "cache"
    for pin in (dataclasses.replace(pinned_pin, git=GitPin(f"--upload-pack=touch {mark}",
                                                           "v0.5.14")),
                dataclasses.replace(pinned_pin, git=GitPin(pinned_pin.git.url,
                                                           f"--output={mark}")),
                dataclasses.replace(pinned_pin, pypi=dataclasses.replace(
                    pinned_pin.pypi, requirement=f"--log={mark}"))):
        for call in (lambda: upstream.provision(pin, cache=cache),
                     lambda: upstream.fetch_wheel(pin, cache=cache)):
            with pytest.raises(UpstreamError) as err:
                call()
            assert err.value.exit_code == 2 and "\n" not in str(err.value)
            assert re.match(r"upstream\.(git\.url|git\.ref|pypi\.requirement): ",
                            str(err.value))
    assert not mark.exists() and not cache.exists()


def test_pip_requirement_after_double_dash_is_never_an_option(tmp_path: Path, pinned_pin,
                                                              monkeypatch) -> None:
    """The checks bypassed: the real pip gets `-- --log=FILE` and reads it as a
    requirement (refused), never as its --log option."""
    mark = tmp_path / MARK
    monkeypatch.setattr(pinrules, "requirement_problem", lambda r: None)
    pp = dataclasses.replace(pinned_pin.pypi, requirement=f"--log={mark}")
    done = upstream._run_pip(pp, tmp_path / "d", "", UpstreamError)
    assert done.returncode != 0 and not mark.exists()
    pp = dataclasses.replace(pinned_pin.pypi, python_version=f"--log={mark}",
                             platform=f"--log={mark}")
    upstream._run_pip(dataclasses.replace(pp, requirement="sglang==0.0.0.dev0+nothere"),
                      tmp_path / "d", "", UpstreamError)
    assert not mark.exists()


def test_pip_is_refused_a_hostile_requirement_even_from_code(tmp_path: Path,
                                                             pinned_pin) -> None:
    mark = tmp_path / MARK
    pp = dataclasses.replace(pinned_pin.pypi, requirement=f"--log={mark}")
    with pytest.raises(UsageError) as err:
        upstream._run_pip(pp, tmp_path / "d", "", UpstreamError)
    assert err.value.exit_code == 2
    assert str(err.value).startswith("upstream.pypi.requirement: ")
    assert not mark.exists()


@pytest.mark.parametrize(("url", "ref"), [("--upload-pack=touch {m}", "v0.5.14"),
                                          ("ext::sh -c touch% {m}", "v0.5.14"),
                                          ("https://github.com/x.git", "--upload-pack=touch {m}"),
                                          ("https://github.com/x.git", "v1\n--output={m}")])
def test_engine_on_a_host_refuses_a_hostile_clone(tmp_path: Path, url, ref) -> None:
    """The engine (run on hosts) checks again: a request that skipped the controller's
    loader is a usage error, git never runs, no tree appears."""
    mark = tmp_path / MARK
    dest = tmp_path / "tree"
    request = wire.ApplyRequest(provision=True, target=str(dest), base=BaseSource(
        git=GitSource(url=planted(url, mark), ref=planted(ref, mark))))
    result = engine.serve(request, tmp_path)
    assert isinstance(result, wire.Failure) and result.kind == "usage"
    assert "\n" not in result.message
    assert not mark.exists() and not dest.exists()
    assert not list(tmp_path.glob(".tree.provisioning-*"))


def test_engine_clone_puts_the_url_after_double_dash(tmp_path: Path, monkeypatch) -> None:
    """The engine's check bypassed: git clone still reads the url as a repository."""
    mark = tmp_path / MARK
    monkeypatch.setattr(engine, "_refuse_option", lambda field, value: None)
    for url, ref in ((f"--upload-pack=touch {mark}", "v0.5.14"),
                     (control_repo(tmp_path).as_uri(), f"--upload-pack=touch {mark}")):
        assert engine._clone_base(BaseSource(git=GitSource(url=url, ref=ref)), tmp_path / "b",
                                  tmp_path / "clone") is None
    assert not mark.exists() and not (tmp_path / "clone").exists()


@pytest.mark.parametrize("rev", ["--output={m}", "-n1", "HEAD~1..--output={m}",
                                 "HEAD~1..HEAD\n--output={m}", "--end-of-options..HEAD"])
def test_import_git_range_is_never_an_option(env, capsys, rev) -> None:
    repo = control_repo(env["tmp"])
    (repo / "python" / "sglang" / "x.py").write_text("x = 2\n")
    subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qam",
                    "two"], cwd=repo, check=True)
    before = snapshot(env["series"])
    code, out, err = run(capsys, "import", "--git", str(repo), planted(rev, env["mark"]),
                         "--offline")
    message = one_line(err)
    assert code == 2 and message.startswith("patchset: error: "), err
    assert not env["mark"].exists() and snapshot(env["series"]) == before


# ---------------------------------------------------------------- 7. pin trust

@pytest.fixture(scope="module")
def good_cache(pinned_pin, pinned_wheel, tmp_path_factory) -> Path:
    """A private cache holding the pinned wheel and the base built from it (offline)."""
    cache = tmp_path_factory.mktemp("good-cache")
    (cache / "wheels").mkdir()
    shutil.copyfile(pinned_wheel, cache / "wheels" / pinned_wheel.name)
    upstream.provision(pinned_pin, cache=cache, offline=True)
    return cache


@pytest.fixture()
def trust(env, good_cache: Path, monkeypatch) -> dict:
    monkeypatch.setenv("PATCHSET_CACHE", str(good_cache))
    return dict(env, cache=good_cache)


def wrong_sha(sha: str, where: int = 63) -> str:
    return sha[:where] + ("0" if sha[where] != "0" else "1") + sha[where + 1:]


SHA_CASES = [("last-digit", 63), ("first-digit", 0), ("middle", 31)]


@pytest.mark.parametrize(("case", "where"), SHA_CASES, ids=[c for c, _ in SHA_CASES])
@pytest.mark.parametrize("argv", [("check",), ("check", "--offline"), ("provision",),
                                  ("provision", "--offline"),
                                  ("apply", "--tier", "safe", "localhost"),
                                  ("apply", "--dry-run", "--tier", "safe", "localhost")],
                         ids=lambda a: "-".join(a[:2]))
def test_a_sha256_the_cached_wheel_disagrees_with_is_refused_and_the_wheel_kept(
        trust, pinned_pin, capsys, argv, case, where) -> None:
    manifest, cache = trust["manifest"], trust["cache"]
    bad = wrong_sha(pinned_pin.pypi.sha256, where)
    set_pin(manifest, "pypi", "sha256", bad)
    line = line_of(manifest, "sha256:")
    before = (manifest.read_bytes(), snapshot(cache))
    code, out, err = run(capsys, *argv)
    message = one_line(err)
    assert code == 2, err
    wheel = cache / "wheels" / pinned_pin.pypi.file
    assert message == (
        f"patchset: error: patches.yaml:{line}: upstream.pypi.sha256: sha256 mismatch for "
        f"{wheel}: the pin says {bad}, the cached file is {pinned_pin.pypi.sha256}; kept it "
        "and changed nothing - correct upstream.pypi.sha256 (or delete the file if it is "
        "damaged)")
    assert (manifest.read_bytes(), snapshot(cache)) == before
    assert not trust["home"].exists()


def test_fetch_wheel_refuses_a_wrong_sha_and_keeps_the_file(pinned_pin, pinned_wheel,
                                                            tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copyfile(pinned_wheel, cache / "wheels" / pinned_wheel.name)
    before = snapshot(cache)
    pin = dataclasses.replace(pinned_pin, pypi=dataclasses.replace(
        pinned_pin.pypi, sha256=wrong_sha(pinned_pin.pypi.sha256)))
    for offline in (True, False):
        with pytest.raises(UpstreamError) as err:
            upstream.fetch_wheel(pin, cache=cache, offline=offline)
        assert err.value.exit_code == 2 and pinned_pin.pypi.sha256 in str(err.value)
        assert snapshot(cache) == before


def test_a_download_that_disagrees_is_refused_and_never_stored(env, pinned_pin, capsys,
                                                               monkeypatch) -> None:
    name = pinned_pin.pypi.file
    script = env["tmp"] / "fake_pip.py"
    script.write_text("import sys\nargs = sys.argv[1:]\ndest = args[args.index('-d') + 1]\n"
                      f"open(dest + '/{name}', 'wb').write(b'not the wheel')\n")
    monkeypatch.setattr(upstream, "PIP", (sys.executable, str(script)))
    set_pin(env["manifest"], "git", "url", "https://127.0.0.1:9/x.git")   # fails fast
    line = line_of(env["manifest"], "sha256:")
    code, _, err = run(capsys, "provision")
    message = one_line(err)
    assert code == 2
    got = hashlib.sha256(b"not the wheel").hexdigest()
    assert message.startswith(f"patchset: error: patches.yaml:{line}: upstream.pypi.sha256: "
                              f"sha256 mismatch for {name}: expected {pinned_pin.pypi.sha256}, "
                              f"got {got} from the package index; not stored")
    assert not list((env["cache"] / "wheels").iterdir())
    assert not (env["cache"] / "repos").exists() or not any((env["cache"] / "repos").iterdir())
    assert not any((env["cache"] / "tmp").iterdir())


def test_a_cached_base_is_used_only_for_the_whole_pin_it_was_built_for(
        good_cache: Path, pinned_pin) -> None:
    key = upstream._pin_key(pinned_pin)
    repo = good_cache / "repos" / key
    assert upstream._cached(repo, key, pinned_pin) is not None
    for other in (dataclasses.replace(pinned_pin, git_prefix="src/"),
                  dataclasses.replace(pinned_pin, git=GitPin(pinned_pin.git.url, "v0.5.13")),
                  dataclasses.replace(pinned_pin, pypi=dataclasses.replace(
                      pinned_pin.pypi, sha256=wrong_sha(pinned_pin.pypi.sha256)))):
        # even under the same directory name (a digest collision, a hand-made repo)
        assert upstream._cached(repo, key, other) is None


def test_a_base_recorded_for_another_pin_is_rebuilt_not_reused(pinned_pin, pinned_wheel,
                                                               tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copyfile(pinned_wheel, cache / "wheels" / pinned_wheel.name)
    base = upstream.provision(pinned_pin, cache=cache, offline=True)
    meta_file = base.repo / ".git" / upstream.META_FILE
    meta = json.loads(meta_file.read_text())
    meta["pin"]["git"]["ref"] = "v9.9.9"     # a repo made for some other pin, same name
    meta_file.write_text(json.dumps(meta))
    again = upstream.provision(pinned_pin, cache=cache, offline=True)
    assert again.commit == base.commit
    assert json.loads(meta_file.read_text())["pin"] == dataclasses.asdict(pinned_pin)


@pytest.mark.parametrize(("section", "key", "value"), [
    ("pypi", "sha256", None), ("git", "ref", "v0.5.14-fork"),
    ("git", "url", "https://example.invalid/sglang.git"),
    ("pypi", "platform", "manylinux_2_28_x86_64")])
@pytest.mark.parametrize("argv", [("apply", "--tier", "risky", "localhost"),
                                  ("apply", "--dry-run", "--tier", "risky", "localhost"),
                                  ("plan", "--tier", "risky", "localhost"),
                                  ("revert", "chat-a", "--with-dependents"),
                                  ("status",)], ids=lambda a: "-".join(a[:2]))
def test_the_default_tree_is_used_only_for_the_pin_it_was_provisioned_from(
        trust, pinned_pin, capsys, argv, section, key, value) -> None:
    code, _, err = run(capsys, "apply", "--tier", "safe", "localhost")
    assert code == 0, err
    tree = trust["home"] / "targets" / "sglang-0.5.14"
    recorded = json.loads((tree / ".git" / "patchset-pin.json").read_text())
    assert recorded["pin"] == dataclasses.asdict(pinned_pin)
    manifest = trust["manifest"]
    old = getattr(getattr(pinned_pin, section), key)
    new = wrong_sha(old) if value is None else value
    set_pin(manifest, section, key, new)
    line = line_of(manifest, f"{key}:")
    before = (manifest.read_bytes(), snapshot(trust["home"]), snapshot(trust["cache"]))
    code, out, err = run(capsys, *argv)
    message = one_line(err)
    assert code == 2, err
    if (section, key) == ("pypi", "sha256"):        # the cached wheel says so first
        assert f"the pin says {new}, the cached file is {old}" in message
    else:
        assert message == (
            f"patchset: error: patches.yaml:{line}: upstream.{section}.{key}: {tree} was "
            f"provisioned from {section}.{key} {old!r}, the manifest says {new!r}; nothing "
            f"was changed - correct the pin, or remove {tree} to provision it again")
    assert message.startswith(f"patchset: error: patches.yaml:{line}: upstream.{section}.{key}: ")
    assert (manifest.read_bytes(), snapshot(trust["home"]), snapshot(trust["cache"])) == before


def test_a_damaged_cached_bundle_is_rebuilt_not_shipped(pinned_base, tmp_path: Path) -> None:
    from patchset.pin.basebundle import base_bundle
    cache = tmp_path / "cache"
    planted_file = cache / "bundles" / f"{pinned_base.commit}.bundle"
    planted_file.parent.mkdir(parents=True)
    planted_file.write_bytes(b"# v2 git bundle\nnot a bundle\n")
    path = base_bundle(pinned_base, cache)
    heads = subprocess.run(["git", "bundle", "list-heads", str(path)], cwd=pinned_base.repo,
                           capture_output=True, text=True, check=True).stdout.split()
    assert path == planted_file and heads[0] == pinned_base.commit
    assert base_bundle(pinned_base, cache).read_bytes() == path.read_bytes()


# ---------------------------------------------------------------- 8. a patch that does not apply

def break_context(series: Path, name: str = "idx-c") -> None:
    """Break the patch's context, not its index lines: the manifest still loads."""
    patch = series / "patches" / f"{name}.patch"
    patch.write_text(patch.read_text().replace(" from __future__ import annotations",
                                               " from __future__ import braces", 1))


@pytest.fixture(params=["git", "wheel"])
def tree(request, pinned_base, tmp_path: Path) -> Path:
    from patchset.pin.upstream import materialize
    return materialize(pinned_base, tmp_path / f"tree-{request.param}", layout=request.param)


def refusals(capsys, tree: Path, *selection: str) -> dict[str, tuple[int, str]]:
    out = {}
    for verb, argv in (("plan", ("plan", *selection, "--target", str(tree), "localhost")),
                       ("dry-run", ("apply", "--dry-run", *selection, "--target", str(tree),
                                    "localhost")),
                       ("apply", ("apply", *selection, "--target", str(tree), "localhost"))):
        before = snapshot(tree)
        code, stdout, err = run(capsys, *argv)
        assert snapshot(tree) == before, verb
        assert not (tree / ".patchset" / "txn").exists()
        assert "would change" not in err + stdout
        out[verb] = (code, one_line(err))
    return out


def the_reason(line: str) -> str:
    return line.split(" FAILED: ", 1)[1]


@pytest.mark.parametrize("managed", [False, True], ids=["fresh", "managed"])
def test_a_patch_that_does_not_apply_is_one_refusal_from_plan_dry_run_and_apply(
        trust, tree: Path, capsys, managed: bool) -> None:
    env = trust
    if managed:
        assert run(capsys, "apply", "--tier", "safe", "--target", str(tree), "localhost")[0] == 0
    before = snapshot(tree)
    break_context(env["series"])
    got = refusals(capsys, tree)
    assert {code for code, _ in got.values()} == {4}
    reasons = {the_reason(line) for _, line in got.values()}
    assert len(reasons) == 1, got                  # the same words from all three
    [reason] = reasons
    assert reason.startswith("localhost: patch idx-c does not apply on the base with the "
                             "patches before it: ")
    assert "txn" not in reason and "indexer.py" in reason
    for verb, (_, line) in got.items():
        assert line.startswith(f"localhost: {'plan' if verb == 'plan' else 'apply'} FAILED: ")
    assert snapshot(tree) == before
    if not managed:   # only the target's lock, which every locked op takes
        assert set(os.listdir(tree / ".patchset")) <= {"lock", "lock.json"}
    assert not any(env["scratch"].iterdir())      # no dry-run scratch left behind
    code, out, _ = run(capsys, "check")
    assert code == 1 and "FAIL" in out and "patch idx-c does not apply on the base" in out
    assert not any(env["scratch"].iterdir())


def test_a_git_tree_keeps_its_exclude_file_when_the_first_apply_fails(env, pinned_base,
                                                                      tmp_path, capsys) -> None:
    from patchset.pin.upstream import materialize
    tree = materialize(pinned_base, tmp_path / "g", layout="git")
    exclude = tree / ".git" / "info" / "exclude"
    before = exclude.read_bytes() if exclude.exists() else None
    break_context(env["series"])
    code, _, err = run(capsys, "apply", "--target", str(tree), "localhost")
    assert code == 4 and "patch idx-c does not apply" in one_line(err)
    assert (exclude.read_bytes() if exclude.exists() else None) == before
    refs = subprocess.run(["git", "for-each-ref"], cwd=tree, capture_output=True,
                          text=True).stdout
    assert "refs/patchset" not in refs


def index_line(patch: Path) -> tuple[str, str]:
    pre, post = re.search(r"^index ([0-9a-f]{40})\.\.([0-9a-f]{40})", patch.read_text(),
                          re.M).groups()
    return pre, post


def test_a_post_image_mismatch_shows_ids_long_enough_to_differ(env, tree: Path,
                                                               capsys) -> None:
    """The recorded post-image differs from the real one only after 12 hex digits: the
    message must show both in full (a 12-hex prefix would print the same id twice)."""
    patch = env["series"] / "patches" / "chat-a.patch"
    _, post = index_line(patch)
    fake = post[:12] + ("0" if post[12] != "0" else "1") * 28
    patch.write_text(patch.read_text().replace(post, fake))
    got = refusals(capsys, tree, "--tier", "safe")
    assert {code for code, _ in got.values()} == {4}
    for _, line in got.values():
        assert (f"patch chat-a gives the wrong result: {CHAT} post-image is blob {post}, "
                f"the patch records blob {fake} ") in line


def test_a_pre_image_mismatch_shows_full_ids(env, tree: Path, capsys) -> None:
    """chat-e recorded against the base instead of chat-a's result (series out of order)."""
    a_pre, a_post = index_line(env["series"] / "patches" / "chat-a.patch")
    patch = env["series"] / "patches" / "chat-e.patch"
    e_pre, e_post = index_line(patch)
    assert e_pre == a_post
    patch.write_text(patch.read_text().replace(f"index {e_pre}..", f"index {a_pre}.."))
    got = refusals(capsys, tree, "--only", "chat-e")
    assert {code for code, _ in got.values()} == {4}
    for _, line in got.values():
        assert (f"patch chat-e does not apply: {CHAT} pre-image is blob {a_post}, the patch "
                f"records blob {a_pre} ") in line


def test_not_the_pinned_base_shows_full_ids(env, pinned_base, tmp_path: Path, capsys) -> None:
    from patchset.pin.upstream import materialize
    tree = materialize(pinned_base, tmp_path / "plain", layout="wheel")  # git: "uncommitted"
    disk = tree / INDEXER[len("python/"):]
    disk.write_text(disk.read_text() + "# local fork\n")
    found = hashlib.sha1(b"blob %d\0" % len(disk.read_bytes()) + disk.read_bytes()).hexdigest()
    got = refusals(capsys, tree)
    assert {code for code, _ in got.values()} == {4}
    for _, line in got.values():
        assert f"is not the pinned base: {INDEXER} is blob {found}, the pin has blob " in line
        assert re.search(r"the pin has blob [0-9a-f]{40} ", line)


def test_dry_run_and_plan_that_apply_change_nothing(env, tree: Path, capsys) -> None:
    """The happy path of the same build: would change, exit 0, the target unchanged."""
    before = snapshot(tree)
    code, _, err = run(capsys, "apply", "--dry-run", "--target", str(tree), "localhost")
    assert code == 0 and "would change" in err
    code, out, _ = run(capsys, "plan", "--target", str(tree), "localhost")
    assert code == 0 and "+chat-a" in out
    assert snapshot(tree) == before and not any(env["scratch"].iterdir())
