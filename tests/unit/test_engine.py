"""The engine on real 0.5.14 trees: atomic, idempotent, exact revert, dirty refusal, kills."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from patchset.connect.local import LocalTransport
from patchset import api
from patchset import transport as wire
from patchset.transport import raise_for
from patchset.agent.lib.records import STATE_FORMAT, TreeState
from patchset.agent import engine
from patchset.agent.lib import staleness
from patchset.agent.engine import EngineError, Staging
from patchset.agent.lib.gitenv import git_env
from patchset.errors import LockedError
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, plan
from patchset.pin.upstream import materialize
from tests.seriesfactory import CHAT, DSV4, INDEXER

TOUCHED = (CHAT, DSV4, INDEXER)
ROOT = Path(__file__).resolve().parents[2]          # the shipped series: patches.yaml


@pytest.fixture(params=["git", "wheel"])
def target(request, pinned_base, tmp_path: Path) -> Path:
    return materialize(pinned_base, tmp_path / f"tree-{request.param}", layout=request.param)


@pytest.fixture()
def git_target(pinned_base, tmp_path: Path) -> Path:
    return materialize(pinned_base, tmp_path / "tree-git", layout="git")


@pytest.fixture()
def series(series_dir: Path):
    return load_series(series_dir / "patches.yaml")


def disk(target: Path, path: str) -> Path:
    return target / path if (target / "python").is_dir() else target / path[len("python/"):]


def snapshot(target: Path) -> dict[str, bytes]:
    return {p: disk(target, p).read_bytes() for p in TOUCHED}


def do_apply(series, target: Path, **selection) -> api.HostResult:
    chosen = plan(series, Selection(**selection))
    [result] = api.apply(series, chosen, [LocalTransport(target)])
    return result


def head(target: Path) -> str | None:
    if not (target / ".git").exists():
        return None
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=target, capture_output=True,
                          text=True, check=True).stdout.strip()


def state(target: Path) -> dict | None:
    path = target / ".patchset" / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_apply_commits_with_trailers_and_records_state(series, git_target: Path) -> None:
    result = do_apply(series, git_target, tier="moderate")
    assert result.ok and result.changed, result.error
    assert result.after == ["chat-a", "dsv4-b", "idx-c"]
    log = subprocess.run(["git", "log", "--format=%B%x00", "-3"], cwd=git_target,
                         capture_output=True, text=True, check=True).stdout
    bodies = [b.strip() for b in log.split("\0") if b.strip()]
    assert [b.split(":")[0] for b in bodies] == ["idx-c", "dsv4-b", "chat-a"]
    sha = series.by_name()["idx-c"].sha256
    assert f"Patchset-Name: idx-c\nPatchset-Sha256: {sha}" in bodies[0]
    st = state(git_target)
    assert st["format"] == STATE_FORMAT == 2 and st["kind"] == "git"
    assert st["head"] == head(git_target) and st["updated"].endswith("Z")
    base_ref = subprocess.run(["git", "rev-parse", "refs/patchset/base"], cwd=git_target,
                              capture_output=True, text=True, check=True).stdout.strip()
    assert base_ref == st["base"]["commit"]
    assert [a["name"] for a in st["applied"]] == ["chat-a", "dsv4-b", "idx-c"]
    assert "# patch idx-c" in (git_target / INDEXER).read_text()
    assert subprocess.run(["git", "status", "--porcelain"], cwd=git_target, capture_output=True,
                          text=True).stdout == ""


def test_apply_twice_changes_nothing(series, target: Path) -> None:
    assert do_apply(series, target, tier="moderate").changed
    before = (snapshot(target), head(target), (target / ".patchset/state.json").read_bytes())
    again = do_apply(series, target, tier="moderate")
    assert again.ok and not again.changed
    assert (snapshot(target), head(target),
            (target / ".patchset/state.json").read_bytes()) == before


def test_revert_is_byte_identical_to_fresh_apply(series, target: Path, pinned_base,
                                                  tmp_path: Path) -> None:
    assert do_apply(series, target).changed
    result = api.revert(series, ["dsv4-b"], LocalTransport(target), with_dependents=True)
    assert result.ok, result.error
    assert result.reverted == ["dsv4-b", "idx-d"]
    assert result.after == ["chat-a", "idx-c", "chat-e"]
    layout = "git" if (target / ".git").exists() else "wheel"
    fresh = materialize(pinned_base, tmp_path / "fresh", layout=layout)
    assert do_apply(series, fresh, only=("chat-a", "idx-c", "chat-e")).changed
    assert snapshot(target) == snapshot(fresh)
    assert head(target) == head(fresh)   # deterministic commits: same ids too
    assert "# patch dsv4-b" not in disk(target, DSV4).read_text()


def test_revert_refuses_dependents_and_unknown(series, git_target: Path) -> None:
    do_apply(series, git_target)
    before = snapshot(git_target)
    result = api.revert(series, ["idx-c"], LocalTransport(git_target))
    assert not result.ok and result.exit_code == 2
    assert "idx-d depend(s) on idx-c" in result.error and "--with-dependents" in result.error
    assert snapshot(git_target) == before
    do_apply(series, git_target, tier="safe")
    result = api.revert(series, ["idx-c"], LocalTransport(git_target))
    assert "idx-c not applied" in result.error and "applied: chat-a" in result.error


def test_failure_in_the_middle_leaves_tree_and_state_untouched(series_dir: Path,
                                                               target: Path) -> None:
    series = load_series(series_dir / "patches.yaml")
    do_apply(series, target, tier="safe")
    before = (snapshot(target), head(target), state(target))
    # Break idx-c's context (not its index line): the manifest is still valid.
    patch = series_dir / "patches" / "idx-c.patch"
    patch.write_text(patch.read_text().replace(" from __future__ import annotations",
                                               " from __future__ import braces", 1))
    series = load_series(series_dir / "patches.yaml")
    result = do_apply(series, target)
    assert not result.ok and "patch idx-c does not apply" in result.error
    assert (snapshot(target), head(target), state(target)) == before
    assert not (target / ".patchset" / "journal.json").exists()


def test_post_image_mismatch_is_refused(series_dir: Path, git_target: Path) -> None:
    patch = series_dir / "patches" / "chat-a.patch"
    text = patch.read_text()
    post = text.split("index ")[1].split("..")[1][:40]
    patch.write_text(text.replace(post, "1" * 40))
    result = do_apply(load_series(series_dir / "patches.yaml"), git_target, tier="safe")
    assert not result.ok and "post-image" in result.error
    assert state(git_target) is None


def test_hand_edit_refused_with_diff_and_kept(series, target: Path) -> None:
    do_apply(series, target, tier="safe")
    chat = disk(target, CHAT)
    chat.write_text(chat.read_text() + "# my hand edit\n")
    edited = chat.read_bytes()
    result = do_apply(series, target, tier="moderate")
    assert not result.ok
    assert "entrypoints/openai/serving_chat.py" in result.error and "nothing was changed" in \
        result.error
    assert "+# my hand edit" in result.details
    assert chat.read_bytes() == edited
    st = api.status(series, LocalTransport(target))
    assert st.has_findings()
    found = st.record.dirty if (target / ".git").exists() else [d.path for d in st.record.drift]
    assert any("serving_chat.py" in f for f in found)


def test_changes_outside_the_series_are_left_alone(series, git_target: Path) -> None:
    """The dirty check covers the files the series writes; an edit or a staged change
    elsewhere neither blocks an apply nor is touched by it (the index of other files is
    not reset), and the index of the series' files is HEAD's after it."""
    readme = git_target / "python" / "sglang" / "__init__.py"
    readme.write_text(readme.read_text() + "local note\n")
    (git_target / "NOTES").write_text("staged\n")
    subprocess.run(["git", "add", "NOTES"], cwd=git_target, check=True)
    result = do_apply(series, git_target, tier="safe")
    assert result.ok, result.error
    assert do_apply(series, git_target, tier="moderate").ok
    status = subprocess.run(["git", "status", "--porcelain=v1", "--untracked-files=no"],
                            cwd=git_target, capture_output=True, text=True, check=True).stdout
    assert sorted(status.splitlines()) == [" M python/sglang/__init__.py", "A  NOTES"]
    assert readme.read_text().endswith("local note\n")


def test_not_the_pinned_base_is_refused(series, pinned_base, tmp_path: Path) -> None:
    tree = materialize(pinned_base, tmp_path / "plain", layout="wheel")
    dsv4 = disk(tree, DSV4)
    dsv4.write_text(dsv4.read_text() + "\n# local fork\n")
    result = do_apply(series, tree, tier="moderate")
    assert not result.ok and "is not the pinned base" in result.error
    assert "deepseek_v4.py" in result.error
    assert not (tree / ".patchset" / "state.json").exists()


def test_foreign_commit_is_refused_and_reported(series, git_target: Path) -> None:
    do_apply(series, git_target, tier="safe")
    (git_target / "NOTES").write_text("x\n")
    subprocess.run(["git", "add", "NOTES"], cwd=git_target, check=True)
    subprocess.run(["git", "commit", "-qm", "local tweak"], cwd=git_target, check=True)
    st = api.status(series, LocalTransport(git_target))
    assert len(st.record.foreign_commits) == 1 and "local tweak" in st.record.foreign_commits[0]
    result = do_apply(series, git_target, tier="moderate")
    assert not result.ok and "commits on top of the patchset series" in result.error


def test_lock_names_the_holder(series, git_target: Path) -> None:
    meta = git_target / ".patchset"
    meta.mkdir()
    with open(meta / "lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        (meta / "lock.json").write_text(json.dumps({"pid": 4242, "host": "gpu1", "op": "apply",
                                                    "since": "2026-11-29T00:00:00Z"}))
        chosen = plan(series, Selection(tier="safe"))
        [result] = api.apply(series, chosen, [LocalTransport(git_target)], lock_wait=0.3)
        assert not result.ok
        assert "locked by patchset apply (pid 4242 on gpu1" in result.error
        st = api.status(series, LocalTransport(git_target))
        assert "pid 4242" in st.record.locked_by
    assert do_apply(series, git_target, tier="safe").ok


def test_an_older_state_file_still_loads(series, git_target: Path) -> None:
    """A format-1 state (whole-second `updated`, as patchset wrote it before format 2)
    reads as the same record, status works on it, and the next change rewrites it in the
    current format; a newer format is refused, naming the file."""
    assert do_apply(series, git_target, tier="safe").ok
    path = git_target / ".patchset" / "state.json"
    v2 = json.loads(path.read_text())
    v1 = dict(v2, format=1, updated="2026-11-30T12:00:00Z")
    path.write_text(json.dumps(v1))
    old = TreeState.from_json(v1)
    assert old.format == 1 and old.names() == [a["name"] for a in v2["applied"]]
    assert old.to_json() == dict(v2, updated="2026-11-30T12:00:00Z")      # written as 2
    assert staleness.epoch(old.updated) == staleness.epoch("2026-11-30T12:00:00.000Z")
    st = api.status(series, LocalTransport(git_target))
    assert st.record.state_version == 1 and st.record.applied and not st.has_findings()
    assert do_apply(series, git_target, tier="moderate").ok
    assert json.loads(path.read_text())["format"] == STATE_FORMAT
    path.write_text(json.dumps(dict(v2, format=STATE_FORMAT + 1)))
    with pytest.raises(Exception, match=r"state\.json has state format 3; .*upgrade patchset"):
        raise_for("h", LocalTransport(git_target).call(api.make_request(series, "status")[0]))


def test_locked_error_type(series, git_target: Path) -> None:
    meta = git_target / ".patchset"
    meta.mkdir()
    with open(meta / "lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        request, files = api.make_request(series, "apply", series.patches[:1])
        with pytest.raises(LockedError):
            raise_for("h", LocalTransport(git_target).call(request, files))


# ---------------------------------------------------------------- kill -9 at every point

CRASH_POINTS = ["staged", "journal", "file:0", "file:1", "file:2", "ref", "state"]


def run_engine_subprocess(series, target: Path, bundle: Path, selection: Selection,
                          crash: str | None) -> subprocess.CompletedProcess:
    """The shipped path: the one bundle and the one bootstrap, as on a host."""
    chosen = plan(series, selection).patches
    request, files = api.make_request(series, "apply", chosen)
    bundle.mkdir(exist_ok=True)
    (bundle / "bundle.tar").write_bytes(wire.bundle(wire.stamp(request, str(target)), files))
    env = dict(os.environ, PATCHSET_TEST_CRASH_AT=crash or "")
    return subprocess.run([sys.executable, "-c", wire.BOOTSTRAP, str(bundle)], env=env,
                          capture_output=True, text=True)


@pytest.mark.parametrize("crash", CRASH_POINTS)
def test_kill_at_any_point_then_status_and_apply(series, target: Path, tmp_path: Path,
                                                 pinned_base, crash: str) -> None:
    do_apply(series, target, tier="safe")
    old = snapshot(target)
    layout = "git" if (target / ".git").exists() else "wheel"
    fresh = materialize(pinned_base, tmp_path / "fresh", layout=layout)
    do_apply(series, fresh)
    new = snapshot(fresh)

    proc = run_engine_subprocess(series, target, tmp_path / "bundle", Selection(), crash)
    if crash == "ref" and layout == "wheel":
        assert proc.returncode == 0   # no ref to move on a plain tree: ran to the end
    else:
        assert proc.returncode == -9, proc.stdout + proc.stderr
    current = snapshot(target)
    for path in TOUCHED:   # every file is either old or new, never in between
        assert current[path] in (old[path], new[path]), path

    st = api.status(series, LocalTransport(target))
    interrupted = proc.returncode == -9 and crash != "staged"   # killed after the journal
    assert (st.record.interrupted is not None) == interrupted
    if interrupted:
        assert st.record.interrupted.next == "the next apply or revert finishes it"

    result = do_apply(series, target)
    assert result.ok, result.error
    assert bool(result.recovered) == interrupted
    assert snapshot(target) == new
    assert head(target) == head(fresh)
    assert not api.status(series, LocalTransport(target)).has_findings()


def test_engine_is_stdlib_only(tmp_path: Path) -> None:
    """The agent ships to hosts with only python3 and git: no third-party imports, and no
    import of patchset itself (on a host it is `patchset_agent`, alone on sys.path)."""
    for name, data in wire.agent_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    modules = sorted(n[:-3].replace("/", ".").removesuffix(".__init__")
                     for n in wire.agent_files() if not n.endswith("__main__.py"))
    code = ("import sys; sys.path = [p for p in sys.path if 'site-packages' not in p "
            f"and p not in ('', '.')]; sys.path.insert(0, {str(tmp_path)!r}); "
            f"import importlib; [importlib.import_module(m) for m in {modules!r}]; "
            "assert not [m for m in sys.modules if m.split('.')[0] in "
            "('patchset', 'auditor', 'deploy', 'isolate')], sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_read_only_tree_is_a_clear_error(series, pinned_base, tmp_path: Path) -> None:
    """An unwritable tree (a read-only bind mount: the tests run as root) is one clear line."""
    tree = materialize(pinned_base, tmp_path / "ro", layout="wheel")
    chat = disk(tree, CHAT)
    before = chat.read_bytes()
    subprocess.run(["mount", "--bind", str(tree), str(tree)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(tree)], check=True)
        result = do_apply(series, tree, tier="safe")
        assert not result.ok and "Read-only file system" in result.error
        assert chat.read_bytes() == before
    finally:
        subprocess.run(["umount", str(tree)], check=True)


def test_series_that_grows_to_new_files_applies(series_dir: Path, target: Path, pinned_base,
                                                tmp_path: Path) -> None:
    """A host managed by an older series (3 files) takes a newer one touching a 4th file."""
    from tests.seriesfactory import PatchDef, append_line, build_series, default_patches
    do_apply(load_series(series_dir / "patches.yaml"), target, tier="safe")
    grown_dir = tmp_path / "grown"
    grown_dir.mkdir()
    extra = "python/sglang/srt/server_args.py"
    patches = default_patches() + [PatchDef("args-f", {extra: append_line("import ", "# patch args-f")})]
    grown = load_series(build_series(pinned_base, grown_dir, patches))
    result = do_apply(grown, target)
    assert result.ok, result.error
    assert "# patch args-f" in disk(target, extra).read_text()
    reverted = api.revert(grown, ["args-f"], LocalTransport(target))
    assert reverted.ok and "# patch args-f" not in disk(target, extra).read_text()


# ---------------------------------------------------------------- git apply in staging


def staged(where: Path, files: dict[str, bytes]) -> Staging:
    staging = Staging(None, where)              # no target: seeded by hand
    for path, data in files.items():
        (staging.work / path).parent.mkdir(parents=True, exist_ok=True)
        (staging.work / path).write_bytes(data)
    return staging


def git_patch(tmp: Path, before: dict[str, bytes], after: dict[str, bytes]) -> bytes:
    """A real `git diff --full-index` from `before` to `after`."""
    repo = tmp / "author"

    def run(*args: str) -> bytes:
        return subprocess.run(["git", "-c", "core.autocrlf=false", *args], cwd=repo,
                              check=True, capture_output=True, env=git_env()).stdout
    repo.mkdir()
    run("init", "-q")
    for state in (before, after):
        for path, data in state.items():
            (repo / path).write_bytes(data)
        run("add", "-A")
        if state is before:
            run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b")
    return b"Description: x\n\n" + run("diff", "--cached", "--full-index")


FAR = b"".join(b"l%d\n" % i for i in range(1, 41))


def test_a_patch_that_does_not_apply_is_gits_refusal_and_checked_blobs(tmp_path: Path) -> None:
    """Context that is not there is git apply's refusal, its reason in the one line; a
    pre-image that is not the recorded one is refused before git runs, and a post-image
    git would reach by an offset is refused after it: the result is the recorded blob or
    nothing."""
    after = FAR.replace(b"l20\n", b"twenty\n")
    patch_file = tmp_path / "p.patch"
    patch_file.write_bytes(git_patch(tmp_path, {"f": FAR}, {"f": after}))
    from dataclasses import replace

    from patchset.agent.lib.records import FileChange, PatchSpec
    change = FileChange(path="f", pre=engine.blob_id(FAR), post=engine.blob_id(after))
    spec = PatchSpec(name="p", sha256="", file="p.patch", files=[change])
    edited = FAR.replace(b"l19\n", b"nineteen\n")
    loose = replace(spec, files=[replace(change, pre=engine.blob_id(edited))])
    with pytest.raises(EngineError, match="^patch p does not apply on the base with the "
                       "patches before it: patch failed: f:17; f: patch does not apply$"):
        staged(tmp_path / "edited", {"f": edited}).apply(loose, patch_file)
    with pytest.raises(EngineError, match="patch p does not apply: f pre-image is blob"):
        staged(tmp_path / "pre", {"f": edited}).apply(spec, patch_file)
    moved = b"new\n" * 2 + FAR
    shifted = replace(spec, files=[replace(change, pre=engine.blob_id(moved))])
    with pytest.raises(EngineError, match="patch p gives the wrong result: f post-image is"):
        staged(tmp_path / "moved", {"f": moved}).apply(shifted, patch_file)
    staging = staged(tmp_path / "ok", {"f": FAR})
    assert staging.apply(spec, patch_file) == [("f", after)]


def test_apply_gives_every_machine_the_same_head(pinned_base, tmp_path: Path) -> None:
    """The shipped series on a fresh tree: the head every machine gets (the ids the
    series' commits have always had), an index that is HEAD's for the series' files, a
    clean status, and nothing left of the private index the commits were built in."""
    series = load_series(ROOT / "patches.yaml")
    tree = materialize(pinned_base, tmp_path / "tree", layout="git")
    result = do_apply(series, tree)
    assert result.ok, result.error
    assert result.head.startswith("3488e78a63ab")
    paths = sorted({f.path for p in series.patches for f in p.files})
    index = subprocess.run(["git", "ls-files", "-s", "--", *paths], cwd=tree,
                           capture_output=True, text=True, check=True).stdout
    listed = subprocess.run(["git", "ls-tree", "HEAD", "--", *paths], cwd=tree,
                            capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] + " " + line.split()[2] for line in listed.splitlines()] == \
        [line.split()[0] + " " + line.split()[1] for line in index.splitlines()]
    assert subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True,
                          text=True).stdout == ""
    assert not (tree / ".patchset" / "txn").exists()
    fsck = subprocess.run(["git", "fsck", "--strict", "--no-dangling"], cwd=tree,
                          capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr
